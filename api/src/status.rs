//! Typed status of jobs and nodes: what the scheduler writes on TrainingJobs and
//! InferenceServices, and what a nodelet reports on its Node. Shared by the controller (which
//! writes and reads them), the nodelet and tbctl (which show them).

use crate::timestamp::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::meta::Condition;

/// The status fields every kind shares, as `tbctl explain KIND.status` shows them. Each kind's
/// status type (JobStatus, NodeStatus, QueueStatus, ...) has these two among its own.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct StatusSummary {
    /// The metadata.generation this status describes.
    #[serde(default)]
    #[schemars(extend("x-explain-note" = "set by tb"))]
    pub observed_generation: u64,
    /// Observations about the object, latest state of each type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-explain-note" = "set by tb"))]
    pub conditions: Vec<Condition>,
}

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum JobPhase {
    /// Waiting to be placed (no capacity, or backing off before a restart).
    #[default]
    Pending,
    /// Placed: allocations exist, not every rank runs yet.
    Scheduled,
    Running,
    Succeeded,
    Failed,
}

impl JobPhase {
    pub fn is_terminal(self) -> bool {
        matches!(self, JobPhase::Succeeded | JobPhase::Failed)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            JobPhase::Pending => "Pending",
            JobPhase::Scheduled => "Scheduled",
            JobPhase::Running => "Running",
            JobPhase::Succeeded => "Succeeded",
            JobPhase::Failed => "Failed",
        }
    }
}

/// One rank's place.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RankPlacement {
    pub rank: u32,
    pub node: String,
    pub allocation: String,
}

/// One rank of a model placement: the Mac, its layers and the memory they take.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlacedStage {
    pub node: String,
    pub first_layer: u32,
    pub layers: u32,
    pub memory_bytes: u64,
    pub weight_bytes: u64,
    pub kv_bytes: u64,
}

/// How placement split a model, and what it predicts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlacementSummary {
    /// pipeline, tensor or data.
    pub strategy: String,
    /// latency or throughput.
    pub objective: String,
    /// The last Mac is cabled back to the first.
    #[serde(default)]
    pub ring: bool,
    pub predicted_tokens_per_second: f64,
    /// Where the prediction's compute figures come from: `engine` (measured by each Mac's
    /// nodelet on tb's engine), `chip` (the chips' nominal bandwidth) or `mixed`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub figures: String,
    /// Decode tokens/s the service's rank 0 observed of late (one stream), when it has served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_tokens_per_second: Option<f64>,
    /// Tokens of context the observed streams held on average (the prediction above is for
    /// the whole reserved context, read in full for every token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_context_tokens: Option<u32>,
    /// What the same figures predict for one stream at the observed context: the rate to
    /// hold the observed one against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_at_observed_tokens_per_second: Option<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<PlacedStage>,
    /// Runner-up candidates and why they lost.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alternatives: Vec<String>,
    /// What the prediction rests on, in words (a fine-tune's memory per rank by part).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
}

/// Status of a TrainingJob or InferenceService, written by the scheduler.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobStatus {
    #[serde(default)]
    pub phase: JobPhase,
    #[serde(default)]
    pub observed_generation: u64,
    /// The current placement's epoch (0: never placed).
    #[serde(default)]
    pub epoch: u64,
    /// Gang restarts after a failure.
    #[serde(default)]
    pub restarts: u32,
    /// Restarts since the gang last ran healthy for the backoff reset period (10 minutes); the
    /// next restart delay doubles with it, as Kubernetes' CrashLoopBackOff does.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failure_streak: u32,
    /// When every rank of the current gang was first seen running (cleared when it stops).
    #[serde(
        default,
        with = "crate::timestamp::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub running_since: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(
        default,
        with = "crate::timestamp::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub start_time: Option<Timestamp>,
    #[serde(
        default,
        with = "crate::timestamp::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub completion_time: Option<Timestamp>,
    /// Not before this time will a failed gang be placed again.
    #[serde(
        default,
        with = "crate::timestamp::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub next_retry_time: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placement: Vec<RankPlacement>,
    /// The Macs it runs on, in rank order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    /// The model placement behind `nodes`, when the job names a Model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_placement: Option<PlacementSummary>,
    /// Where an InferenceService's rank 0 answers now (its OpenAI-compatible base URL): the
    /// backend behind `url`; it moves when the service is placed again.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub endpoint: String,
    /// The stable OpenAI-compatible base URL of an InferenceService: the controllers' services
    /// listener, which forwards to whatever `endpoint` is now (empty when no controller serves
    /// one).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub url: String,
    /// A built-in fine-tune's progress, as its rank 0 last reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training: Option<TrainingProgress>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The most points a loss curve keeps: longer runs are averaged down to this.
pub const LOSS_CURVE_POINTS: usize = 64;

/// Where a fine-tune's adapter was written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdapterLocation {
    /// The Mac that holds it (rank 0's); empty in a rank's own report.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node: String,
    /// Its directory there (PEFT: adapter_config.json, adapter_model.safetensors).
    pub path: String,
}

/// How far a built-in fine-tune has got: written by its rank 0, passed on by the nodelet (at
/// most every few seconds) and copied into the job's status.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrainingProgress {
    /// Optimiser steps done.
    #[serde(default)]
    pub step: u64,
    #[serde(default)]
    pub total_steps: u64,
    /// Mean training loss per token of the latest step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    /// Mean loss per token on the held-out split, at the latest evaluation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_loss: Option<f64>,
    /// Training tokens per second over all ranks, of late.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_second: Option<f64>,
    /// Seconds left at the recent pace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_seconds: Option<u64>,
    /// Training loss over the run, oldest first, at most 64 points (each the mean of
    /// `curveStride` steps).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub loss_curve: Vec<f64>,
    /// Steps per point of `lossCurve`.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub curve_stride: u64,
    /// The PEFT adapter, once written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter: Option<AdapterLocation>,
}

/// The most bytes of a path a progress report carries.
const MAX_PATH_BYTES: usize = 4096;

impl TrainingProgress {
    /// The same progress with every number sane and every size bounded: what a rank wrote is
    /// outside input.
    pub fn bounded(mut self) -> TrainingProgress {
        let finite = |v: Option<f64>| v.filter(|x| x.is_finite() && x.abs() < 1e12);
        self.loss = finite(self.loss);
        self.eval_loss = finite(self.eval_loss);
        self.tokens_per_second = finite(self.tokens_per_second).filter(|x| *x >= 0.0);
        self.eta_seconds = self.eta_seconds.filter(|s| *s < 100 * 365 * 86_400);
        self.loss_curve.retain(|x| x.is_finite() && x.abs() < 1e12);
        if self.loss_curve.len() > LOSS_CURVE_POINTS {
            let skip = self.loss_curve.len() - LOSS_CURVE_POINTS;
            self.loss_curve.drain(..skip);
        }
        if self
            .adapter
            .as_ref()
            .is_some_and(|a| a.path.len() > MAX_PATH_BYTES || a.node.len() > 253)
        {
            self.adapter = None;
        }
        self
    }
}

/// A loss curve that keeps at most [`LOSS_CURVE_POINTS`] points: when full, neighbours are
/// averaged in pairs and each point stands for twice the steps.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LossCurve {
    points: Vec<f64>,
    /// Steps per point.
    stride: u64,
    /// The point being filled: sum and count of its steps.
    partial: (f64, u64),
}

impl LossCurve {
    pub fn push(&mut self, loss: f64) {
        if !loss.is_finite() {
            return;
        }
        self.stride = self.stride.max(1);
        self.partial.0 += loss;
        self.partial.1 += 1;
        if self.partial.1 < self.stride {
            return;
        }
        self.points.push(self.partial.0 / self.partial.1 as f64);
        self.partial = (0.0, 0);
        if self.points.len() >= LOSS_CURVE_POINTS {
            self.points = self
                .points
                .chunks(2)
                .map(|c| c.iter().sum::<f64>() / c.len() as f64)
                .collect();
            self.stride *= 2;
        }
    }

    /// The points so far (the unfinished one last, when it has steps).
    pub fn points(&self) -> Vec<f64> {
        let mut p = self.points.clone();
        if self.partial.1 > 0 {
            p.push(self.partial.0 / self.partial.1 as f64);
        }
        p
    }

    pub fn stride(&self) -> u64 {
        self.stride.max(1)
    }
}

/// A curve as a line of ▁▂▃▄▅▆▇█, lowest value lowest.
pub fn sparkline(values: &[f64]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    values
        .iter()
        .map(|v| {
            // A flat curve (or no curve) sits mid-height.
            if hi.partial_cmp(&lo) != Some(std::cmp::Ordering::Greater) {
                return BARS[3];
            }
            let at = ((v - lo) / (hi - lo) * 7.0).round() as usize;
            BARS[at.min(7)]
        })
        .collect()
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

impl JobStatus {
    /// Reads a stored status; an empty or unreadable one is a fresh Pending status.
    pub fn from_value(v: &Value) -> JobStatus {
        Self::deserialize(v).unwrap_or_default()
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or_default()
    }

    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    /// Set a condition, keeping its transition time when its status does not change.
    pub fn set_condition(
        &mut self,
        type_: &str,
        status: bool,
        reason: impl AsRef<str>,
        message: &str,
        now: &Timestamp,
    ) {
        set_condition(&mut self.conditions, type_, status, reason, message, now);
    }
}

/// Set a condition in a list, keeping `lastTransitionTime` when the status stays the same.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: impl AsRef<str>,
    message: &str,
    now: &Timestamp,
) {
    let reason = reason.as_ref();
    let status = if status { "True" } else { "False" };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = Some(now.clone());
            }
            c.status = status.to_string();
            c.reason = reason.to_string();
            c.message = message.to_string();
        }
        None => conditions.push(Condition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message: message.to_string(),
            last_transition_time: Some(now.clone()),
        }),
    }
}

/// What a Mac has, as its nodelet measured it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeCapacity {
    /// Total memory, as a quantity (e.g. `64Gi`), for people.
    #[serde(default)]
    pub memory: String,
    #[serde(default)]
    pub memory_bytes: u64,
    /// What tb may hand out: total less a reserve for macOS and everything else.
    #[serde(default)]
    pub allocatable_bytes: u64,
    #[serde(default)]
    pub chip: String,
    #[serde(default)]
    pub cpu_cores: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_cores: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bandwidth_gbps: Option<f64>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hardware_model: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub os: String,
    /// How fast tb's built-in engine decodes on this Mac, measured by the nodelet; placement
    /// prefers it to the chip's nominal bandwidth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineFigures>,
}

/// The built-in engine's decode speed on one Mac: one token costs about `tokenOverheadUs` plus
/// the weight bytes it reads over `weightGbs`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EngineFigures {
    /// `cpu` or `metal`.
    pub backend: String,
    /// Weight bytes (as a Q4_1 GGUF file stores them) decoded per second, GB/s.
    pub weight_gbs: f64,
    /// Time per token beyond reading the weights, µs.
    pub token_overhead_us: f64,
    /// CPU threads the engine ran with: the nodelet's `--engine-threads` (its share of a
    /// machine that several nodelets share), else every core. Absent: not said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    /// When it was measured.
    #[serde(
        default,
        with = "crate::timestamp::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub measured_at: Option<Timestamp>,
}

/// What `tb-shard --calibrate` prints (one JSON object): the engine's figures as measured on
/// this machine, before a nodelet stamps them into its [`EngineFigures`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EngineCalibration {
    /// `cpu` or `metal`.
    pub backend: String,
    /// Weight bytes (as a Q4_1 GGUF file stores them) decoded per second, GB/s.
    pub weight_gbs: f64,
    /// Time per token beyond reading the weights, µs.
    pub token_overhead_us: f64,
    /// How long the measurement took, ms.
    pub took_ms: u64,
}

/// Ports a nodelet hands to ranks (MLX ring listeners, coordinators).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortRange {
    pub start: u16,
    /// Inclusive.
    pub end: u16,
}

/// One Thunderbolt (or, in a described lab, any network) port of a Mac, as its nodelet found it.
/// Two ports whose `peerUuid` names each other's `uuid` are the two ends of a cable.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortStatus {
    /// `tb3` for Thunderbolt port 3, or the name a topology file gives it.
    pub name: String,
    /// The network interface (`en3`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    /// Its IPv4 address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The RDMA device on the port (`rdma_en3`), when RDMA is enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_device: Option<String>,
    /// This port's own identity: the Thunderbolt bus domain uuid, or `node/port` in a
    /// described lab.
    pub uuid: String,
    /// The far end's `uuid`, when a cable is plugged in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_uuid: Option<String>,
    /// The negotiated link speed, Gb/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed_gbps: Option<f64>,
}

/// Status of a Node, written by its nodelet (the controller stamps `lastHeartbeatTime`, and
/// marks Ready False when heartbeats stop).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    /// Where the nodelet serves (logs), `host:port`.
    #[serde(default)]
    pub address: String,
    #[serde(default)]
    pub capacity: NodeCapacity,
    /// Memory free right now, as the OS reports it.
    #[serde(default)]
    pub free_bytes: u64,
    /// Memory reserved by the allocations the nodelet runs.
    #[serde(default)]
    pub allocated_bytes: u64,
    #[serde(default)]
    pub port_range: PortRange,
    /// The Mac's ports, from discovery or the topology file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PortStatus>,
    /// The TCP port the link-probe server listens on, on every port address (0: none).
    #[serde(default)]
    pub probe_port: u16,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub nodelet_version: String,
    #[serde(
        default,
        with = "crate::timestamp::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub last_heartbeat_time: Option<Timestamp>,
    /// Allocations running here, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allocations: Vec<String>,
    /// Bytes on disk of the allocations' directories (work dirs, logs) on this node.
    #[serde(default)]
    pub job_disk_bytes: u64,
    /// Model files (by their Model's `source.path`) this node holds a whole staged copy of and
    /// serves to nodes that stage from it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

impl NodeStatus {
    pub fn from_value(v: &Value) -> NodeStatus {
        Self::deserialize(v).unwrap_or_default()
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or_default()
    }

    pub fn is_ready(&self) -> bool {
        self.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    }

    /// The host part of the nodelet's address: where this Mac's ranks listen.
    pub fn host(&self) -> &str {
        self.address
            .rsplit_once(':')
            .map(|(h, _)| h)
            .unwrap_or(&self.address)
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_keep_transition_time_while_unchanged() {
        let t = |s: &str| Timestamp::parse(s).unwrap();
        let (t1, t2, t3) = (
            t("2026-06-01T00:00:01Z"),
            t("2026-06-01T00:00:02Z"),
            t("2026-06-01T00:00:03Z"),
        );
        let mut s = JobStatus::default();
        s.set_condition("Complete", false, "Running", "", &t1);
        s.set_condition("Complete", false, "Running", "still", &t2);
        let changed = |s: &JobStatus| {
            s.condition("Complete")
                .and_then(|c| c.last_transition_time.clone())
        };
        assert_eq!(changed(&s), Some(t1));
        s.set_condition("Complete", true, "Succeeded", "", &t3);
        assert_eq!(changed(&s), Some(t3));
    }

    #[test]
    fn loss_curves_stay_bounded_and_keep_their_shape() {
        let mut c = LossCurve::default();
        for i in 0..1000 {
            c.push(1000.0 - i as f64);
        }
        let p = c.points();
        assert!(p.len() <= LOSS_CURVE_POINTS + 1, "{}", p.len());
        assert!(p.windows(2).all(|w| w[0] > w[1]), "{p:?}");
        assert_eq!(c.stride(), 16);
        let line = sparkline(&p);
        assert!(line.starts_with('█') && line.ends_with('▁'), "{line}");
        assert_eq!(sparkline(&[2.0, 2.0]), "▄▄");
        let hostile = TrainingProgress {
            loss: Some(f64::NAN),
            loss_curve: vec![1.0; 1000],
            ..Default::default()
        }
        .bounded();
        assert_eq!(hostile.loss, None);
        assert_eq!(hostile.loss_curve.len(), LOSS_CURVE_POINTS);
    }

    #[test]
    fn statuses_read_leniently() {
        assert_eq!(JobStatus::from_value(&Value::Null).phase, JobPhase::Pending);
        let n = NodeStatus {
            address: "10.0.0.2:7601".into(),
            ..Default::default()
        };
        assert_eq!(NodeStatus::from_value(&n.to_value()).host(), "10.0.0.2");
        assert!(!n.is_ready());
    }
}
