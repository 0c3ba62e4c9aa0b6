//! The workload: the weighted Queues and the one-rank TrainingJobs with their deterministic
//! run times, and applying them all before any Mac exists.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::json;
use tb_api::proto::ApplyRequest;

use super::RaftSetup;
use super::cluster::{TlsTb, retry};

fn queue_json(name: &str, weight: u32) -> String {
    json!({"apiVersion": "tb/v1", "kind": "Queue", "metadata": {"name": name},
           "spec": {"weight": weight}})
    .to_string()
}

fn job_json(name: &str, queue: &str, memory_gi: u64) -> String {
    json!({"apiVersion": "tb/v1", "kind": "TrainingJob",
           "metadata": {"name": name, "namespace": "default"},
           "spec": {"command": ["python3", "train.py"], "ranks": 1,
                    "memory": format!("{memory_gi}Gi"), "queue": queue,
                    "ttlSecondsAfterFinished": 0}})
    .to_string()
}

/// A deterministic run time per job number (the virtual bench's generator).
pub(super) fn run_time(n: u64, (lo, hi): (u64, u64)) -> Duration {
    let x = n
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    Duration::from_millis(lo + (x >> 33) % (hi - lo + 1))
}

/// The queue a job belongs to: its name's prefix (`q3-17` → `q3`).
pub(super) fn queue_of(job: &str) -> &str {
    job.split('-').next().unwrap_or("")
}

/// Apply the queues, then the jobs interleaved by queue, in batches. Returns the jobs' run
/// times by name.
pub(super) async fn submit(
    tb: &TlsTb,
    leader: usize,
    setup: &RaftSetup,
) -> anyhow::Result<HashMap<String, Duration>> {
    let queues: Vec<String> = (0..setup.weights.len()).map(|i| format!("q{i}")).collect();
    let mut batches = vec![
        queues
            .iter()
            .zip(&setup.weights)
            .map(|(q, w)| queue_json(q, *w))
            .collect::<Vec<_>>(),
    ];
    let mut runs = HashMap::new();
    let mut batch = Vec::new();
    let per_queue = setup.jobs / queues.len().max(1);
    for n in 0..per_queue {
        for q in &queues {
            let name = format!("{q}-{n}");
            runs.insert(name.clone(), run_time(runs.len() as u64, setup.run_ms));
            batch.push(job_json(&name, q, setup.job_memory_gi));
            if batch.len() >= setup.apply_batch {
                batches.push(std::mem::take(&mut batch));
            }
        }
    }
    if !batch.is_empty() {
        batches.push(batch);
    }
    for objects in batches {
        let n = objects.len();
        let req = ApplyRequest {
            objects_json: objects,
            dry_run: false,
            request_id: uuid::Uuid::new_v4().to_string(),
        };
        let client = tb.objects[leader].clone();
        let resp = retry("Objects/Apply", || {
            let (mut c, req) = (client.clone(), req.clone());
            async move { c.apply(req).await }
        })
        .await?
        .into_inner();
        anyhow::ensure!(
            resp.results.len() == n,
            "Objects/Apply: {} results for {n} objects",
            resp.results.len()
        );
    }
    Ok(runs)
}
