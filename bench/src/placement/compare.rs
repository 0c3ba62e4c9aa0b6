//! One case, three placers, one judge: tb's `plan`, exo's algorithm and the brute-force optimum
//! each propose an assignment, and the engine's `evaluate` (which counts the KV cache) prices
//! every one of them.

use tb_core::placement::cost::{Assignment, evaluate};
use tb_core::placement::{Options, Topology, Workload, plan};

use super::brute::{self, Optimum};
use super::exo::{self, ExoPlan};
use super::suite::Case;

/// A priced placement.
#[derive(Debug, Clone, PartialEq)]
pub struct Priced {
    pub tokens_per_second: f64,
    pub order: Vec<(String, u32)>,
}

/// What tb did.
#[derive(Debug, Clone, PartialEq)]
pub enum TbOutcome {
    Placed(Priced),
    /// `plan` refused: the message it gave, and the memory it says is short.
    Refused {
        message: String,
        short_bytes: Option<u64>,
    },
    /// `plan` returned a plan that `evaluate` rejects (a bug in the engine).
    Broken(String),
}

/// What exo did.
#[derive(Debug, Clone, PartialEq)]
pub enum ExoOutcome {
    Valid(Priced),
    /// exo's plan does not fit once the KV cache is counted (or has no link for a hop).
    Invalid {
        reason: String,
        order: Vec<(String, u32)>,
    },
    NoPlan(String),
}

/// What the enumeration found.
#[derive(Debug, Clone, PartialEq)]
pub enum OptOutcome {
    Best(Priced),
    NothingFits,
    /// Too many eligible Macs to enumerate.
    NotEnumerable(usize),
    /// The enumeration's own figure and `evaluate`'s disagree (the formulas diverged).
    Mismatch(String),
}

/// The result of one case.
#[derive(Debug, Clone)]
pub struct CaseResult {
    pub name: String,
    pub macs: usize,
    pub shape: String,
    pub model: String,
    pub objective: String,
    pub tb: TbOutcome,
    pub exo: ExoOutcome,
    pub opt: OptOutcome,
    pub tb_ms: f64,
    pub opt_ms: f64,
}

fn order_of(stages: &[tb_core::placement::Stage]) -> Vec<(String, u32)> {
    stages.iter().map(|s| (s.node.clone(), s.layers)).collect()
}

/// tb's plan, priced by `evaluate`.
pub fn run_tb(topology: &Topology, workload: &Workload) -> TbOutcome {
    match plan(topology, workload, &Options::default()) {
        Err(e) => TbOutcome::Refused {
            message: e.message,
            short_bytes: e.short_bytes,
        },
        Ok(p) => {
            let a = Assignment {
                strategy: p.strategy,
                order: order_of(&p.stages),
            };
            match evaluate(topology, workload, &a) {
                Ok(c) => TbOutcome::Placed(Priced {
                    tokens_per_second: c.tokens_per_second,
                    order: a.order,
                }),
                Err(e) => TbOutcome::Broken(e.reason),
            }
        }
    }
}

/// exo's plan, priced by `evaluate`.
pub fn run_exo(topology: &Topology, workload: &Workload) -> ExoOutcome {
    match exo::place(topology, workload) {
        ExoPlan::NoPlan(why) => ExoOutcome::NoPlan(why),
        ExoPlan::Placed(a) => match evaluate(topology, workload, &a) {
            Ok(c) => ExoOutcome::Valid(Priced {
                tokens_per_second: c.tokens_per_second,
                order: a.order,
            }),
            Err(e) => ExoOutcome::Invalid {
                reason: e.reason,
                order: a.order,
            },
        },
    }
}

/// The optimum, priced by `evaluate` and checked against the enumeration's own figure.
pub fn run_opt(topology: &Topology, workload: &Workload) -> OptOutcome {
    match brute::optimum(topology, workload) {
        Optimum::TooMany(n) => OptOutcome::NotEnumerable(n),
        Optimum::NothingFits => OptOutcome::NothingFits,
        Optimum::Best {
            assignment,
            time_us,
            ..
        } => match evaluate(topology, workload, &assignment) {
            Err(e) => OptOutcome::Mismatch(format!(
                "evaluate rejects the optimum {:?}: {}",
                assignment.order, e.reason
            )),
            Ok(c) if (c.time_per_token_us - time_us).abs() > 1e-6 * time_us.max(1.0) => {
                OptOutcome::Mismatch(format!(
                    "enumeration says {time_us:.3} µs, evaluate {:.3} µs for {:?}",
                    c.time_per_token_us, assignment.order
                ))
            }
            Ok(c) => OptOutcome::Best(Priced {
                tokens_per_second: c.tokens_per_second,
                order: assignment.order,
            }),
        },
    }
}

/// Runs one case.
pub fn run(case: &Case) -> CaseResult {
    let start = std::time::Instant::now();
    let tb = run_tb(&case.topology, &case.workload);
    let tb_ms = start.elapsed().as_secs_f64() * 1e3;
    let exo = run_exo(&case.topology, &case.workload);
    let start = std::time::Instant::now();
    let opt = run_opt(&case.topology, &case.workload);
    let opt_ms = start.elapsed().as_secs_f64() * 1e3;
    CaseResult {
        name: case.name.to_string(),
        macs: case.macs(),
        shape: case.shape.to_string(),
        model: case.model_label(),
        objective: format!("{:?}", case.workload.objective).to_lowercase(),
        tb,
        exo,
        opt,
        tb_ms,
        opt_ms,
    }
}

impl CaseResult {
    pub fn tb_rate(&self) -> Option<f64> {
        match &self.tb {
            TbOutcome::Placed(p) => Some(p.tokens_per_second),
            _ => None,
        }
    }

    pub fn exo_rate(&self) -> Option<f64> {
        match &self.exo {
            ExoOutcome::Valid(p) => Some(p.tokens_per_second),
            _ => None,
        }
    }

    pub fn opt_rate(&self) -> Option<f64> {
        match &self.opt {
            OptOutcome::Best(p) => Some(p.tokens_per_second),
            _ => None,
        }
    }

    /// tb / exo, where both placed validly.
    pub fn tb_over_exo(&self) -> Option<f64> {
        Some(self.tb_rate()? / self.exo_rate()?)
    }

    /// tb / optimum, where both placed.
    pub fn tb_over_opt(&self) -> Option<f64> {
        Some(self.tb_rate()? / self.opt_rate()?)
    }
}
