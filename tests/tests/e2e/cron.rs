//! Schedules (cron) against real controller processes and real Raft: a slot is committed
//! together with the job it creates, so killing the leader right at a slot still yields exactly
//! one TrainingJob for it, and a cluster down across several slots runs only the latest one when
//! it comes back, reporting the others in a MissedSchedule event.
//!
//! Real minutes are too slow for a test, so the controllers run with the hidden
//! `--test-clock-offset-file FILE`: their scheduler's clock is the system clock plus the offset
//! (ms) in FILE, re-read on every reconcile pass and shared by all members. Time keeps flowing;
//! a test moves it to just before a minute boundary (never across one) and lets the slot arrive
//! by itself, or, while the cluster is down, past several slots at once.
//!
//! No nodelets run: the jobs stay Pending, which is all these tests need. The assertions are
//! about counts (jobs per slot, events, `lastScheduleTime`), never about how fast anything was.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tb_tests::objects::{API_VERSION, request_id, unique_namespace};
use tb_tests::{Client, Cluster, ClusterOptions, TestDir, step, wait};

/// The Schedule's name (jobs are `every-<minutes since the epoch>`).
const SCHEDULE: &str = "every";
/// How far before a slot the test clock is set: the slot then arrives by itself.
pub(crate) const LEAD_MS: i64 = 300;
/// How far from a minute boundary a Schedule is applied (`TestClock::wait_clear_of_a_slot`).
const CLEAR_MS: i64 = 20_000;
/// How long a slot's job may take to appear: an election and a reconcile pass, on a loaded
/// machine.
pub(crate) const SLOT_TIMEOUT: Duration = Duration::from_secs(60);
/// Retry budget of one read or write through the cluster.
pub(crate) const CALL_BUDGET: Duration = Duration::from_secs(30);
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(30);
pub(crate) const MINUTE_MS: i64 = 60_000;

/// The label, annotations, event reasons and status field the scheduler uses
/// (`api/src/specs/schedule.rs`, `core/src/scheduler/schedules.rs`).
const LABEL_SCHEDULE: &str = "tb/schedule";
const ANNOTATION_SCHEDULE_UID: &str = "tb/schedule-uid";
const ANNOTATION_SCHEDULED_TIME: &str = "tb/scheduled-time";

/// The shared test clock of one cluster: the offset file its controllers read.
pub(crate) struct TestClock {
    file: PathBuf,
    offset_ms: i64,
}

impl TestClock {
    /// An offset file in `dir`, starting at 0 (the system clock).
    pub(crate) fn new(dir: &TestDir) -> TestClock {
        let mut clock = TestClock {
            file: dir.path().join("clock-offset-ms"),
            offset_ms: 0,
        };
        clock.set_offset(0);
        clock
    }

    /// The flags that put a controller on this clock.
    pub(crate) fn controller_args(&self) -> [String; 2] {
        [
            "--test-clock-offset-file".to_string(),
            self.file.display().to_string(),
        ]
    }

    /// Write the offset atomically (a controller never reads half a number).
    pub(crate) fn set_offset(&mut self, offset_ms: i64) {
        let tmp = self.file.with_extension("tmp");
        std::fs::write(&tmp, format!("{offset_ms}\n"))
            .unwrap_or_else(|e| panic!("writing {}: {e}", tmp.display()));
        std::fs::rename(&tmp, &self.file)
            .unwrap_or_else(|e| panic!("renaming {} into place: {e}", tmp.display()));
        self.offset_ms = offset_ms;
    }

    /// The controllers' time now (ms since the epoch).
    pub(crate) fn now_ms(&self) -> i64 {
        system_ms() + self.offset_ms
    }

    /// Set the controllers' time to `at_ms` (ms since the epoch); it flows on from there.
    pub(crate) fn set_now(&mut self, at_ms: i64) {
        self.set_offset(at_ms - system_ms());
    }

    /// Move the controllers' time to `LEAD_MS` before the next minute boundary (forward, or
    /// back by less than `LEAD_MS`: no boundary is ever crossed) and return that slot (ms).
    pub(crate) fn just_before_next_slot(&mut self) -> i64 {
        let slot = next_minute(self.now_ms());
        self.set_now(slot - LEAD_MS);
        slot
    }

    /// Before a Schedule is applied: when the next minute boundary is less than `CLEAR_MS`
    /// away, sleep past it. The Schedule's first slot is then at least `CLEAR_MS` after its
    /// creation, so the test's first `just_before_next_slot` comes before that slot instead of
    /// skipping it (a skipped slot is a MissedSchedule, as designed). Sleeps rather than moving
    /// the offset: controllers pick up a new offset on their next pass, which may come after
    /// the apply is stamped.
    pub(crate) async fn wait_clear_of_a_slot(&self) {
        let now = self.now_ms();
        let boundary = next_minute(now);
        if boundary - now < CLEAR_MS {
            self.sleep_until(boundary + 500).await;
        }
    }

    /// Sleep until the controllers' time is `at_ms`.
    pub(crate) async fn sleep_until(&self, at_ms: i64) {
        let wait = at_ms - self.now_ms();
        if wait > 0 {
            tokio::time::sleep(Duration::from_millis(wait as u64)).await;
        }
    }
}

pub(crate) fn system_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the system clock is after 1970");
    i64::try_from(since.as_millis()).expect("milliseconds since 1970 fit in i64")
}

/// The first minute boundary strictly after `ms`.
pub(crate) fn next_minute(ms: i64) -> i64 {
    (ms.div_euclid(MINUTE_MS) + 1) * MINUTE_MS
}

/// A slot as the store writes it (RFC 3339, UTC, milliseconds): `2026-01-01T00:00:00.000Z`.
pub(crate) fn stamp(slot_ms: i64) -> String {
    let secs = slot_ms.div_euclid(1000);
    let millis = slot_ms.rem_euclid(1000);
    let (days, sod) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        sod / 3600,
        sod / 60 % 60,
        sod % 60
    )
}

/// (year, month, day) of a day number since 1970-01-01 (H. Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// The job the scheduler creates for a slot (`schedules::job_name`).
pub(crate) fn job_name(slot_ms: i64) -> String {
    format!("{SCHEDULE}-{}", slot_ms.div_euclid(MINUTE_MS))
}

/// A Schedule that starts a one-rank exec job every minute.
pub(crate) fn schedule(namespace: &str, starting_deadline_seconds: Option<u64>) -> Value {
    let mut spec = json!({
        "schedule": "* * * * *",
        "jobTemplate": {
            "metadata": {"labels": {"app": "cron-test"}},
            "spec": {
                "executor": "exec",
                "ranks": 1,
                "memory": "64Mi",
                "command": ["sh", "-c", "echo tick"],
            },
        },
    });
    if let Some(s) = starting_deadline_seconds {
        spec["startingDeadlineSeconds"] = s.into();
    }
    json!({
        "apiVersion": API_VERSION,
        "kind": "Schedule",
        "metadata": {"name": SCHEDULE, "namespace": namespace},
        "spec": spec,
    })
}

/// A linearizable list of `kind` in `namespace`, parsed, from whichever member answers.
pub(crate) async fn list(
    client: &Client,
    kind: &str,
    namespace: &str,
) -> Result<Vec<Value>, String> {
    client.list_values(kind, namespace, CALL_BUDGET).await
}

/// The Schedule as stored.
async fn get_schedule(client: &Client, namespace: &str) -> Result<Value, String> {
    list(client, "Schedule", namespace)
        .await?
        .into_iter()
        .find(|s| s["metadata"]["name"] == SCHEDULE)
        .ok_or_else(|| format!("Schedule {SCHEDULE} not found"))
}

fn last_schedule_time(schedule: &Value) -> String {
    schedule["status"]["lastScheduleTime"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// A consistent view of what the Schedule did: its status and jobs, read so that no slot was
/// handled in between (the status is read before and after the lists and must not move).
pub(crate) struct Snapshot {
    pub(crate) last_schedule_time: String,
    /// The jobs created for the Schedule (label and uid annotation), by name.
    pub(crate) jobs: BTreeMap<String, Value>,
    /// Events about the Schedule: (reason, message, count).
    pub(crate) events: Vec<(String, String, u64)>,
}

pub(crate) async fn snapshot(client: &Client, namespace: &str) -> Snapshot {
    wait::expect(
        "a consistent snapshot of the Schedule",
        SLOT_TIMEOUT,
        || async {
            let before = get_schedule(client, namespace).await?;
            let jobs = list(client, "TrainingJob", namespace).await?;
            let events = list(client, "Event", namespace).await?;
            let after = get_schedule(client, namespace).await?;
            if before["metadata"]["resourceVersion"] != after["metadata"]["resourceVersion"] {
                return Err("the Schedule changed while reading; again".to_string());
            }
            let uid = &after["metadata"]["uid"];
            let jobs = jobs
                .into_iter()
                .filter(|j| {
                    j["metadata"]["labels"][LABEL_SCHEDULE] == SCHEDULE
                        && &j["metadata"]["annotations"][ANNOTATION_SCHEDULE_UID] == uid
                })
                .map(|j| {
                    (
                        j["metadata"]["name"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                        j,
                    )
                })
                .collect();
            let events = events
                .into_iter()
                .filter(|e| {
                    e["spec"]["involvedObject"]["kind"] == "Schedule"
                        && e["spec"]["involvedObject"]["name"] == SCHEDULE
                })
                .map(|e| {
                    (
                        e["spec"]["reason"].as_str().unwrap_or_default().to_string(),
                        e["spec"]["message"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                        e["spec"]["count"].as_u64().unwrap_or(1),
                    )
                })
                .collect();
            Ok::<_, String>(Snapshot {
                last_schedule_time: last_schedule_time(&after),
                jobs,
                events,
            })
        },
    )
    .await
}

/// Wait until the job for `slot_ms` exists and the Schedule records the slot as handled;
/// returns the job.
pub(crate) async fn wait_for_slot(client: &Client, namespace: &str, slot_ms: i64) -> Value {
    let name = job_name(slot_ms);
    let when = stamp(slot_ms);
    wait::expect(
        &format!("job {name} and lastScheduleTime {when}"),
        SLOT_TIMEOUT,
        || async {
            let jobs = list(client, "TrainingJob", namespace).await?;
            let Some(job) = jobs
                .into_iter()
                .find(|j| j["metadata"]["name"] == name.as_str())
            else {
                return Err(format!("no job {name} yet"));
            };
            let last = last_schedule_time(&get_schedule(client, namespace).await?);
            if last.as_str() < when.as_str() {
                return Err(format!("lastScheduleTime is {last:?}"));
            }
            Ok(job)
        },
    )
    .await
}

/// Every job carries the scheduled-time annotation of the slot in its name, and no slot has
/// two jobs; returns the slots (ms) that have one.
pub(crate) fn slots_of(jobs: &BTreeMap<String, Value>) -> BTreeSet<i64> {
    let mut by_time: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    let mut slots = BTreeSet::new();
    for (name, job) in jobs {
        let minute: i64 = name
            .strip_prefix(&format!("{SCHEDULE}-"))
            .and_then(|m| m.parse().ok())
            .unwrap_or_else(|| panic!("job {name} is not named after a slot: {job:#}"));
        let when = job["metadata"]["annotations"][ANNOTATION_SCHEDULED_TIME]
            .as_str()
            .unwrap_or_else(|| panic!("job {name} has no {ANNOTATION_SCHEDULED_TIME}: {job:#}"));
        assert_eq!(
            when,
            stamp(minute * MINUTE_MS),
            "job {name} is annotated with another slot"
        );
        by_time.entry(when.to_string()).or_default().push(name);
        slots.insert(minute * MINUTE_MS);
    }
    for (when, names) in &by_time {
        assert_eq!(names.len(), 1, "slot {when} has several jobs: {names:?}");
    }
    slots
}

/// Events of `reason`, as (message, count).
pub(crate) fn events_of<'a>(snap: &'a Snapshot, reason: &str) -> Vec<(&'a str, u64)> {
    snap.events
        .iter()
        .filter(|(r, _, _)| r == reason)
        .map(|(_, m, c)| (m.as_str(), *c))
        .collect()
}

/// Every running member holds the same jobs.
async fn assert_members_agree(cluster: &mut Cluster, namespace: &str) {
    cluster.wait_converged(CONVERGE_TIMEOUT).await;
    let mut seen: Option<BTreeSet<String>> = None;
    for i in cluster.running() {
        let names: BTreeSet<String> = cluster
            .stale_list(i, "TrainingJob", namespace)
            .await
            .iter()
            .filter_map(|j| j["metadata"]["name"].as_str().map(str::to_string))
            .collect();
        match &seen {
            None => seen = Some(names),
            Some(first) => assert_eq!(
                first,
                &names,
                "member {} holds other jobs",
                cluster.member(i).id()
            ),
        }
    }
}

/// Four slots in a row, the leader is SIGKILLed 0, 30, 150 and 700 ms after the slot boundary
/// (by the controllers' clock) and restarted once the slot has been handled. Every slot must
/// have exactly one job, annotated with its scheduled time, one SuccessfulCreate event, and no
/// MissedSchedule; `lastScheduleTime` is the last slot; every member holds the same jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_at_a_slot_starts_exactly_one_job() {
    let clock_dir = TestDir::new("cron-kill-clock");
    let mut clock = TestClock::new(&clock_dir);
    let mut cluster = Cluster::start(
        "cron-kill",
        ClusterOptions::new(3).args(clock.controller_args()),
    )
    .await;
    let client: Arc<Client> = cluster.client();
    let ns = unique_namespace("cron-kill");
    clock.wait_clear_of_a_slot().await;
    client
        .apply(&[schedule(&ns, None)], &request_id(), 0, CALL_BUDGET)
        .await
        .unwrap_or_else(|e| panic!("applying the Schedule: {}: {}", e.code(), e.message()));

    let mut killed_at = Vec::new();
    // 0, 30 and 150 ms: the leader most likely dies before its next pass sees the slot (passes
    // run every 500 ms), and its successor creates the job. 700 ms: it most likely committed the
    // slot just before dying, and its successor must not run it again.
    for delay_ms in [0i64, 30, 150, 700] {
        cluster.wait_converged(CONVERGE_TIMEOUT).await;
        let leader = cluster.leader_index().await;
        let slot = clock.just_before_next_slot();
        clock.sleep_until(slot + delay_ms).await;
        cluster.kill(leader);
        step!(
            "killed leader {} {delay_ms} ms after slot {} (controllers' clock: {})",
            cluster.member(leader).id(),
            stamp(slot),
            stamp(clock.now_ms())
        );
        killed_at.push(slot);
        let job = wait_for_slot(&client, &ns, slot).await;
        let created = job["metadata"]["creationTimestamp"].as_str().unwrap_or("?");
        step!(
            "slot {} handled: job created at {created}, {} the kill",
            stamp(slot),
            if created < stamp(slot + delay_ms).as_str() {
                "before"
            } else {
                "after"
            }
        );
        cluster.restart(leader).await;
    }

    let snap = snapshot(&client, &ns).await;
    let slots = slots_of(&snap.jobs);
    let (first, last) = (killed_at[0], killed_at[killed_at.len() - 1]);
    // Every minute from the first slot to the last handled one, each exactly once (slots the
    // test did not kill at may fall in between when the machine is slow; they count too).
    let handled = snap.last_schedule_time.clone();
    let expected: BTreeSet<i64> = (first.div_euclid(MINUTE_MS)..)
        .map(|m| m * MINUTE_MS)
        .take_while(|s| stamp(*s) <= handled)
        .collect();
    assert!(
        killed_at.iter().all(|s| expected.contains(s)),
        "lastScheduleTime {handled} is before the last slot {}",
        stamp(last)
    );
    assert_eq!(
        slots,
        expected,
        "jobs {:?} for slots {:?}",
        snap.jobs.keys(),
        expected.iter().map(|s| stamp(*s)).collect::<Vec<_>>()
    );
    assert_eq!(
        snap.last_schedule_time,
        stamp(*expected.last().expect("at least one slot")),
        "lastScheduleTime"
    );
    let created = events_of(&snap, "SuccessfulCreate");
    for slot in &expected {
        let msg = format!(
            "created TrainingJob {} for {}",
            job_name(*slot),
            stamp(*slot)
        );
        let hits: Vec<_> = created.iter().filter(|(m, _)| *m == msg).collect();
        assert_eq!(
            hits,
            [&(msg.as_str(), 1)],
            "SuccessfulCreate events for slot {}: {created:?}",
            stamp(*slot)
        );
    }
    assert_eq!(created.len(), expected.len(), "{created:?}");
    assert!(
        events_of(&snap, "MissedSchedule").is_empty(),
        "no slot may be missed: {:?}",
        snap.events
    );
    assert_members_agree(&mut cluster, &ns).await;
}

/// One slot runs; then every controller is SIGKILLed, the clock moves past three more slots,
/// and the cluster starts again: exactly one new job, for the latest slot (inside
/// startingDeadlineSeconds), and one MissedSchedule event for the two before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_down_across_three_slots_runs_the_latest_once() {
    let clock_dir = TestDir::new("cron-down-clock");
    let mut clock = TestClock::new(&clock_dir);
    let mut cluster = Cluster::start(
        "cron-down",
        ClusterOptions::new(3).args(clock.controller_args()),
    )
    .await;
    let client: Arc<Client> = cluster.client();
    let ns = unique_namespace("cron-down");
    clock.wait_clear_of_a_slot().await;
    client
        .apply(&[schedule(&ns, Some(600))], &request_id(), 0, CALL_BUDGET)
        .await
        .unwrap_or_else(|e| panic!("applying the Schedule: {}: {}", e.code(), e.message()));

    let first = clock.just_before_next_slot();
    wait_for_slot(&client, &ns, first).await;
    step!("slot {} ran", stamp(first));
    cluster.wait_converged(CONVERGE_TIMEOUT).await;
    let before = snapshot(&client, &ns).await;
    assert_eq!(
        before.jobs.keys().collect::<Vec<_>>(),
        [&job_name(first)],
        "before the downtime"
    );

    cluster.kill_all();
    // Down across three slots: first+1, first+2 and first+3 minutes pass while no controller
    // runs. The latest, first+3, is well inside startingDeadlineSeconds when they return.
    let latest = first + 3 * MINUTE_MS;
    clock.set_now(latest + 500);
    step!(
        "all controllers down; controllers' clock moved to {}",
        stamp(clock.now_ms())
    );
    cluster.restart_all().await;
    cluster.leader_index().await;
    wait_for_slot(&client, &ns, latest).await;
    step!("catch-up run for {} started", stamp(latest));

    let snap = snapshot(&client, &ns).await;
    let slots = slots_of(&snap.jobs);
    // Slots up to `latest`: the one before the downtime and the catch-up, nothing else. (A slot
    // after `latest` could only appear if the restart took a minute; it would be a normal run.)
    let upto_latest: Vec<String> = slots
        .iter()
        .filter(|s| **s <= latest)
        .map(|s| stamp(*s))
        .collect();
    assert_eq!(
        upto_latest,
        [stamp(first), stamp(latest)],
        "jobs: {:?}",
        snap.jobs.keys()
    );
    assert!(
        snap.last_schedule_time >= stamp(latest),
        "lastScheduleTime {}",
        snap.last_schedule_time
    );
    let missed = events_of(&snap, "MissedSchedule");
    let want = format!(
        "2 run(s) missed between {} and {} (only the latest is considered)",
        stamp(first),
        stamp(latest)
    );
    assert_eq!(missed, [(want.as_str(), 1)], "events: {:?}", snap.events);
    let created = events_of(&snap, "SuccessfulCreate");
    for slot in [first, latest] {
        let msg = format!("created TrainingJob {} for {}", job_name(slot), stamp(slot));
        assert_eq!(
            created.iter().filter(|(m, c)| *m == msg && *c == 1).count(),
            1,
            "SuccessfulCreate for {}: {created:?}",
            stamp(slot)
        );
    }
    for skipped in [first + MINUTE_MS, first + 2 * MINUTE_MS] {
        assert!(
            !snap.jobs.contains_key(&job_name(skipped)),
            "the missed slot {} ran",
            stamp(skipped)
        );
    }
    assert_members_agree(&mut cluster, &ns).await;
}

#[test]
fn stamps_match_the_store_format() {
    assert_eq!(stamp(0), "1970-01-01T00:00:00.000Z");
    assert_eq!(stamp(29_453_760 * MINUTE_MS), "2026-01-01T00:00:00.000Z");
    assert_eq!(stamp(28_486_897 * MINUTE_MS), "2024-02-29T13:37:00.000Z");
    assert_eq!(
        stamp(15_864_480 * MINUTE_MS + 1_234),
        "2000-03-01T00:00:01.234Z"
    );
    assert_eq!(next_minute(60_000), 120_000);
    assert_eq!(next_minute(59_999), 60_000);
    assert_eq!(job_name(29_453_760 * MINUTE_MS), "every-29453760");
}
