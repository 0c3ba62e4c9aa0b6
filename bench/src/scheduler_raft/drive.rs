//! The run's sequence once the cluster is up (healthy, submit, join, watches, `t0`, Ready) and
//! the recorder: what the Macs report, until every job has succeeded, the run stalls or the
//! time is up.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tb_api::proto::CreateTokenRequest;
use tb_api::specs::AllocationPhase;
use tokio::sync::mpsc;

use super::cluster::{Credentials, TlsTb, retry};
use super::macs::{Ev, join};
use super::measure::{CpuWatch, Held, Measured, measure};
use super::notes::{server_notes, state_summary};
use super::workload::{queue_of, submit};
use super::{HEARTBEAT, RaftResults, RaftSetup, STALL, STARTUP};
use crate::cluster::Cluster;
use crate::member::Member;

/// Drive the started cluster through the run and measure it.
pub(super) async fn drive(
    setup: &RaftSetup,
    cluster: &mut Cluster<TlsTb>,
    addrs: &[String],
    creds: &Credentials,
) -> anyhow::Result<RaftResults> {
    let wall = Instant::now();
    let date = chrono::Utc::now()
        .format("%Y-%m-%d %H:%M:%S UTC")
        .to_string();
    let leader = cluster
        .wait_healthy(STARTUP, 5)
        .await
        .context("the 3-member cluster did not become healthy")?;
    let tb = cluster.backend.clone();
    eprintln!("cluster healthy; leader tb-{}", leader + 1);

    // The backlog, before any Mac exists.
    let submit_start = Instant::now();
    let runs = Arc::new(submit(&tb, leader, setup).await?);
    let submit_time = submit_start.elapsed();
    let submitted = runs.len();
    eprintln!("submitted {submitted} jobs in {submit_time:.2?}");

    let token = retry("Nodes/CreateToken", || {
        let mut c = tb.nodes[leader].clone();
        async move {
            c.create_token(CreateTokenRequest {
                ttl_seconds: 3600,
                description: "scheduler-bench".into(),
                // One token for every simulated Mac.
                uses: u32::try_from(setup.macs).unwrap_or(u32::MAX).max(1),
                node: String::new(),
            })
            .await
        }
    })
    .await?
    .into_inner()
    .token;

    // Join every Mac (not Ready yet) and open its watch.
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let join_start = Instant::now();
    let macs = futures::future::join_all((0..setup.macs).map(|i| {
        let member = if setup.macs_on_leader {
            leader
        } else {
            i % addrs.len()
        };
        join(
            i,
            setup,
            &addrs[member],
            &creds.ca_pem,
            &token,
            runs.clone(),
            events_tx.clone(),
        )
    }))
    .await
    .into_iter()
    .collect::<anyhow::Result<Vec<_>>>()?;
    let join_time = join_start.elapsed();
    let streams = futures::future::join_all(macs.iter().map(|m| m.watch(0)))
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<_>>>()?;
    eprintln!(
        "{} Macs joined in {join_time:.2?}; watches open",
        macs.len()
    );
    drop(events_tx);

    // The clock starts: every Mac says it is Ready.
    let leader_pid = cluster.members[leader]
        .pid()
        .context("the leader is not running")?;
    let mut cpu = CpuWatch {
        pids: cluster
            .members
            .iter()
            .map(|m| (m.name.clone(), m.pid().unwrap_or(0)))
            .chain(std::iter::once(("bench".into(), std::process::id())))
            .collect(),
        hz: crate::procstat::clock_ticks_per_second()? as f64,
        samples: Vec::new(),
    };
    let mut tasks = tokio::task::JoinSet::new();
    for (mac, stream) in macs.iter().zip(streams) {
        tasks.spawn(mac.clone().follow(stream));
    }
    let t0 = Instant::now();
    let t0_wall = chrono::Utc::now();
    cpu.sample(Duration::ZERO);
    let intervals = futures::future::join_all(macs.iter().map(|m| m.heartbeat()))
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<_>>>()?;
    let ready_time = t0.elapsed();
    let beats = setup.time_limit.as_secs() / HEARTBEAT.as_secs().max(1) + 10;
    for (mac, interval) in macs.iter().zip(intervals) {
        tasks.spawn(mac.clone().heartbeats(interval, beats));
    }
    eprintln!("all Macs Ready {ready_time:.2?} after t0");

    // Record until every job has succeeded, or the time is up.
    let deadline = tokio::time::Instant::from(wall + setup.time_limit);
    let mut held: Vec<Held> = Vec::new();
    let mut open: HashMap<(usize, String), usize> = HashMap::new();
    let mut completed = 0usize;
    let mut problems: Vec<String> = Vec::new();
    let mut problem_count = 0usize;
    let mut aborted = None;
    let mut fill_at: Option<Duration> = None;
    let fill_target = setup.slots().min(submitted);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last_print = Instant::now();
    let mut last_progress = Instant::now();
    while completed < submitted {
        tokio::select! {
            ev = events.recv() => match ev {
                Some(Ev::Admitted { mac, job, at, created }) => {
                    last_progress = at;
                    open.insert((mac, job.clone()), held.len());
                    let pass = created
                        .and_then(|c| (c.at() - t0_wall).to_std().ok());
                    held.push(Held { mac, queue: queue_of(&job).to_string(), admitted: at, pass, ended: None });
                    if held.len() == fill_target && fill_at.is_none() {
                        fill_at = Some(at.saturating_duration_since(t0));
                        cpu.sample(at.saturating_duration_since(t0));
                        eprintln!("initial fill: {fill_target} admissions {:.2?} after t0", at - t0);
                    }
                }
                Some(Ev::Ended { mac, job, admitted, at, phase, acknowledged }) => {
                    last_progress = at;
                    if let Some(i) = open.remove(&(mac, job.clone())) {
                        held[i].ended = Some((at, phase));
                    } else {
                        held.push(Held { mac, queue: queue_of(&job).to_string(), admitted, pass: None, ended: Some((at, phase)) });
                    }
                    if phase == AllocationPhase::Succeeded && acknowledged {
                        completed += 1;
                    }
                }
                Some(Ev::Problem(p)) => {
                    problem_count += 1;
                    if problems.len() < 5 {
                        eprintln!("problem: {p}");
                        problems.push(p);
                    }
                }
                None => {
                    aborted = Some("every simulated Mac stopped".to_string());
                    break;
                }
            },
            _ = tick.tick() => {
                cpu.sample(t0.elapsed());
                if let Some(why) = cluster.members.iter_mut().find_map(Member::exited) {
                    aborted = Some(why);
                    break;
                }
                if last_progress.elapsed() >= STALL {
                    aborted = Some(format!(
                        "stalled: no admission and no job end for {STALL:?}, {} of {submitted} jobs admitted, {completed} done",
                        held.len()
                    ));
                    break;
                }
                if last_print.elapsed() >= Duration::from_secs(5) {
                    last_print = Instant::now();
                    let running = held.iter().filter(|h| h.ended.is_none()).count();
                    let leader_cpu = cpu.samples.len().checked_sub(6).and_then(|i| {
                        cpu.percent(leader, cpu.samples[i].0, cpu.samples[cpu.samples.len() - 1].0)
                    });
                    eprintln!(
                        "t={:>5.1}s admitted={} running={running} succeeded={completed} leader CPU (5 s)={}",
                        t0.elapsed().as_secs_f64(),
                        held.len(),
                        leader_cpu.map_or("?".into(), |c| format!("{c:.0} %")),
                    );
                }
            }
            _ = tokio::time::sleep_until(deadline) => {
                aborted = Some(format!(
                    "time limit of {:?} reached with {completed} of {submitted} jobs done",
                    setup.time_limit
                ));
                break;
            }
        }
    }
    let end = t0.elapsed();
    cpu.sample(end);
    tasks.abort_all();
    let leader_memory = cluster.members[leader].memory().ok();
    let mut notes = Vec::new();
    if problem_count > 0 {
        notes.push(format!(
            "{problem_count} problems reported by the simulated Macs, first: {}",
            problems.join(" | ")
        ));
    }
    notes.extend(server_notes(cluster, leader).await);
    let members_of_macs: Vec<String> = (0..setup.macs)
        .map(|i| {
            let m = if setup.macs_on_leader {
                leader
            } else {
                i % addrs.len()
            };
            cluster.members[m].name.clone()
        })
        .collect();
    match state_summary(&tb, leader, &members_of_macs).await {
        Ok(summary) => notes.push(summary),
        Err(e) => notes.push(format!("the state at the end could not be listed: {e:#}")),
    }
    let still_leader = cluster.probe_all().await.get(leader).and_then(|p| {
        p.as_ref()
            .and_then(|r| r.as_ref().ok())
            .map(|p| p.is_leader)
    });
    if still_leader != Some(true) {
        notes.push(format!(
            "tb-{} was not the leader at the end: leadership changed during the run",
            leader + 1
        ));
    }
    if cpu.pids.get(leader).map(|p| p.1) != Some(leader_pid) {
        notes.push("the leader's pid changed".into());
    }

    Ok(measure(
        setup,
        Measured {
            held,
            t0,
            end,
            fill_at,
            fill_target,
            completed,
            submitted,
            submit_time,
            join_time,
            ready_time,
            date,
            aborted,
            cpu,
            leader,
            leader_memory,
            notes,
            wall: wall.elapsed(),
        },
    ))
}
