//! Clock jumps on the leader, ±1 h.
//!
//! - Node grace: a jump of the leader's clock neither marks every node lost (+1 h) nor keeps a
//!   dead node Ready (−1 h). The leader measures heartbeat ages on its monotonic clock
//!   (`controller/src/heartbeat_ages.rs`). Checked with the scheduler's test clock
//!   (`--test-clock-offset-file`) and with a real jump of the controller process's clock
//!   (libfaketime: `LD_PRELOAD`, an offset file re-read on every call, the monotonic clock left
//!   alone — as a real `date -s` leaves it).
//! - Schedules: after a slot ran, a jump back across it does not run it again; a jump forward
//!   by an hour runs one catch-up job (the latest missed slot), not sixty.
//!
//! Why not `date -s`: the machine's clock is shared with every other process (and other test
//! runs); libfaketime moves only the controller's.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tb_tests::lab::{self, Lab, LabOptions};
use tb_tests::objects::{request_id, unique_namespace};
use tb_tests::{Cluster, ClusterOptions, TestDir, step};

use crate::cron::{
    CALL_BUDGET, LEAD_MS, MINUTE_MS, TestClock, events_of, job_name, schedule, slots_of, snapshot,
    stamp, wait_for_slot,
};

const HOUR_MS: i64 = 3_600_000;

/// Node grace plus the passes that notice it and a loaded machine's slack.
fn detection_bound() -> Duration {
    lab::NODE_GRACE + Duration::from_secs(5)
}

/// Every node stays Ready for three grace periods.
async fn nodes_stay_ready(lab: &Lab, why: &str) {
    let until = Instant::now() + lab::NODE_GRACE * 3;
    while Instant::now() < until {
        for n in lab.nodes().await {
            assert_eq!(
                lab::condition(&n["status"], "Ready"),
                Some("True"),
                "{why}: node {} is not Ready: {n:#}",
                n["metadata"]["name"]
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Kill nodelet 2 and return how long the controller took to call its node NotReady.
async fn time_to_notice_a_dead_node(lab: &mut Lab) -> Duration {
    lab.kill_nodelet(1);
    let killed = Instant::now();
    lab.wait_node_ready("node-2", false, detection_bound())
        .await;
    let took = killed.elapsed();
    step!("node-2 NotReady {took:?} after its nodelet was killed");
    took
}

async fn no_node_lost_events(lab: &Lab) {
    let out = lab
        .tbctl_ok(&["get", "events", "-A", "-o", "json"])
        .await
        .stdout;
    assert!(
        !out.contains("NodeNotReady"),
        "a node was called NotReady: {out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_grace_survives_a_test_clock_jump_of_an_hour_either_way() {
    let clock_dir = TestDir::new("clock-grace-offset");
    let mut clock = TestClock::new(&clock_dir);
    let mut opts = LabOptions::new(2);
    opts.controller_args = clock.controller_args().to_vec();
    let mut lab = Lab::start_with("clock-grace", opts).await;

    clock.set_offset(HOUR_MS);
    step!("the leader's scheduler clock jumped +1 h");
    nodes_stay_ready(&lab, "after +1 h").await;
    no_node_lost_events(&lab).await;

    clock.set_offset(-HOUR_MS);
    step!("the leader's scheduler clock jumped to −1 h");
    nodes_stay_ready(&lab, "after −1 h").await;
    time_to_notice_a_dead_node(&mut lab).await;
}

/// libfaketime's preload library, where Debian's `faketime` package puts it.
fn libfaketime() -> PathBuf {
    let candidates = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
    ];
    candidates
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "libfaketime is not installed (apt-get install faketime; .ci/run does): none of \
                 {candidates:?}"
            )
        })
}

/// Write libfaketime's offset (seconds, signed) for the processes that read `file`.
fn set_fake_offset(file: &Path, seconds: i64) {
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, format!("{seconds:+}\n")).expect("writing the faketime offset");
    std::fs::rename(&tmp, file).expect("renaming the faketime offset into place");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_grace_survives_a_real_clock_jump_of_the_controller() {
    let dir = TestDir::new("clock-grace-faketime");
    let offset = dir.path().join("faketime");
    set_fake_offset(&offset, 0);
    let mut opts = LabOptions::new(2);
    opts.controller_env = vec![
        ("LD_PRELOAD".into(), libfaketime().display().to_string()),
        (
            "FAKETIME_TIMESTAMP_FILE".into(),
            offset.display().to_string(),
        ),
        // Read the file on every call, so the jump happens while the controller runs.
        ("FAKETIME_NO_CACHE".into(), "1".into()),
        // A real jump (date -s) moves the wall clock only.
        ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
    ];
    let mut lab = Lab::start_with("clock-faketime", opts).await;

    // The controller's wall clock is really moved: its stamps say so.
    set_fake_offset(&offset, 3600);
    step!("the controller's clock jumped +1 h");
    let stamped = tb_tests::wait::expect(
        "a heartbeat stamped an hour ahead",
        Duration::from_secs(10),
        || async {
            let n = lab.node("node-1").await.ok_or("no node-1")?;
            let t = n["status"]["lastHeartbeatTime"]
                .as_str()
                .and_then(lab::stamp_millis)
                .ok_or("no lastHeartbeatTime")?;
            let ahead = t - crate::cron::system_ms();
            if ahead > HOUR_MS - 60_000 {
                Ok(ahead)
            } else {
                Err(format!("stamped {ahead} ms ahead"))
            }
        },
    )
    .await;
    step!("heartbeats stamped {stamped} ms ahead");
    nodes_stay_ready(&lab, "after +1 h").await;
    no_node_lost_events(&lab).await;

    set_fake_offset(&offset, -3600);
    step!("the controller's clock jumped to −1 h");
    nodes_stay_ready(&lab, "after −1 h").await;
    time_to_notice_a_dead_node(&mut lab).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_neither_run_twice_nor_flood_across_clock_jumps() {
    let clock_dir = TestDir::new("clock-cron-offset");
    let mut clock = TestClock::new(&clock_dir);
    let cluster = Cluster::start(
        "clock-cron",
        ClusterOptions::new(1).args(clock.controller_args()),
    )
    .await;
    let client = cluster.client();
    let ns = unique_namespace("clock-cron");
    clock.wait_clear_of_a_slot().await;
    client
        .apply(&[schedule(&ns, Some(600))], &request_id(), 0, CALL_BUDGET)
        .await
        .unwrap_or_else(|e| panic!("applying the Schedule: {}: {}", e.code(), e.message()));

    let first = clock.just_before_next_slot();
    wait_for_slot(&client, &ns, first).await;
    step!("slot {} ran", stamp(first));

    // Back an hour, then back to just before the slot that already ran: it comes round again.
    clock.set_now(first - HOUR_MS);
    tokio::time::sleep(Duration::from_secs(2)).await;
    clock.set_now(first - LEAD_MS);
    step!("clock back across {}", stamp(first));
    clock.sleep_until(first + 3_000).await;
    let snap = snapshot(&client, &ns).await;
    assert_eq!(
        slots_of(&snap.jobs)
            .into_iter()
            .map(stamp)
            .collect::<Vec<_>>(),
        [stamp(first)],
        "after the backward jump: {:?}",
        snap.jobs.keys()
    );

    // The next slot still runs, once.
    let second = first + MINUTE_MS;
    clock.set_now(second - LEAD_MS);
    wait_for_slot(&client, &ns, second).await;

    // Forward an hour: one catch-up run for the latest slot, the others reported missed.
    clock.set_now(second + HOUR_MS + 2_000);
    let latest = second + HOUR_MS;
    step!("clock forward an hour, to {}", stamp(clock.now_ms()));
    wait_for_slot(&client, &ns, latest).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let snap = snapshot(&client, &ns).await;
    let slots: Vec<String> = slots_of(&snap.jobs)
        .into_iter()
        .filter(|s| *s <= latest)
        .map(stamp)
        .collect();
    assert_eq!(
        slots,
        [stamp(first), stamp(second), stamp(latest)],
        "after the forward jump: {:?}",
        snap.jobs.keys()
    );
    let missed = events_of(&snap, "MissedSchedule");
    assert_eq!(missed.len(), 1, "{:?}", snap.events);
    assert!(
        missed[0].0.starts_with("59 run(s) missed"),
        "{:?}",
        snap.events
    );
    assert!(snap.jobs.contains_key(&job_name(latest)));
    drop(cluster);
}
