//! The placement benchmark's output: the per-case table, the summary lines, the solve-time
//! table (plain text or markdown), and the same as JSON.

use serde_json::{Value, json};

use super::compare::{CaseResult, ExoOutcome, OptOutcome, Priced, TbOutcome};
use super::timing::SolveTime;

/// tb within this fraction of the optimum counts as "at the optimum".
pub const WITHIN: f64 = 0.02;

/// The figures under the table.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub cases: usize,
    pub geomean_tb_over_exo: Option<f64>,
    pub exo_valid: usize,
    pub geomean_tb_over_opt: Option<f64>,
    pub with_optimum: usize,
    pub within_2pct: usize,
    pub exo_invalid_tb_valid: usize,
    pub exo_invalid: usize,
    pub exo_no_plan_tb_valid: usize,
    pub exo_no_plan: usize,
    pub nothing_fits: usize,
    pub nothing_fits_refused: usize,
    /// tb refused where the enumeration found a plan, or placed something `evaluate` rejects,
    /// or the enumeration disagreed with `evaluate`: each is a bug to look at.
    pub problems: Vec<String>,
}

fn geomean(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    Some((xs.iter().map(|x| x.ln()).sum::<f64>() / xs.len() as f64).exp())
}

pub fn summarize(results: &[CaseResult]) -> Summary {
    let tb_exo: Vec<f64> = results.iter().filter_map(|r| r.tb_over_exo()).collect();
    let tb_opt: Vec<f64> = results.iter().filter_map(|r| r.tb_over_opt()).collect();
    let tb_valid = |r: &CaseResult| matches!(r.tb, TbOutcome::Placed(_));
    let exo_invalid = |r: &CaseResult| matches!(r.exo, ExoOutcome::Invalid { .. });
    let exo_none = |r: &CaseResult| matches!(r.exo, ExoOutcome::NoPlan(_));
    let nothing = |r: &CaseResult| matches!(r.opt, OptOutcome::NothingFits);
    let mut problems = Vec::new();
    for r in results {
        match (&r.tb, &r.opt) {
            (TbOutcome::Refused { message: why, .. }, OptOutcome::Best(p)) => {
                problems.push(format!(
                    "{}: tb refused ({why}) but {} fits",
                    r.name,
                    order_text(&p.order)
                ))
            }
            (TbOutcome::Placed(p), OptOutcome::NothingFits) => problems.push(format!(
                "{}: tb placed {} where the enumeration found nothing",
                r.name,
                order_text(&p.order)
            )),
            (TbOutcome::Broken(why), _) => {
                problems.push(format!("{}: evaluate rejects tb's own plan: {why}", r.name))
            }
            (_, OptOutcome::Mismatch(why)) => problems.push(format!("{}: {why}", r.name)),
            _ => {}
        }
        if let (Some(t), Some(o)) = (r.tb_rate(), r.opt_rate())
            && t > o * (1.0 + 1e-9)
        {
            problems.push(format!(
                "{}: tb ({t:.2}) beats the optimum ({o:.2}): the enumeration missed something",
                r.name
            ));
        }
    }
    Summary {
        cases: results.len(),
        geomean_tb_over_exo: geomean(&tb_exo),
        exo_valid: tb_exo.len(),
        geomean_tb_over_opt: geomean(&tb_opt),
        with_optimum: tb_opt.len(),
        within_2pct: tb_opt.iter().filter(|&&x| x >= 1.0 - WITHIN).count(),
        exo_invalid_tb_valid: results
            .iter()
            .filter(|r| exo_invalid(r) && tb_valid(r))
            .count(),
        exo_invalid: results.iter().filter(|r| exo_invalid(r)).count(),
        exo_no_plan_tb_valid: results
            .iter()
            .filter(|r| exo_none(r) && tb_valid(r))
            .count(),
        exo_no_plan: results.iter().filter(|r| exo_none(r)).count(),
        nothing_fits: results.iter().filter(|r| nothing(r)).count(),
        nothing_fits_refused: results
            .iter()
            .filter(|r| {
                nothing(r)
                    && matches!(&r.tb, TbOutcome::Refused { message, .. } if !message.trim().is_empty())
            })
            .count(),
        problems,
    }
}

/// "a:40 → b:40".
pub fn order_text(order: &[(String, u32)]) -> String {
    order
        .iter()
        .map(|(m, l)| format!("{m}:{l}"))
        .collect::<Vec<_>>()
        .join(" → ")
}

fn short(s: &str, max: usize) -> String {
    let s = s.replace('|', "/");
    if s.chars().count() <= max {
        s
    } else {
        format!("{}…", s.chars().take(max).collect::<String>())
    }
}

/// "studio1: 18.5Gi short (needs …); studio2: …" → "studio1 18.5Gi short +1": the first
/// clause of `evaluate`'s reason, for the table (the whole reason is in the placements list).
fn first_reason(reason: &str) -> String {
    let clauses: Vec<&str> = reason.split("; ").collect();
    let first = clauses[0]
        .split(" (")
        .next()
        .unwrap_or(clauses[0])
        .replace(": ", " ");
    let more = if clauses.len() > 1 {
        format!(" +{}", clauses.len() - 1)
    } else {
        String::new()
    };
    format!("{}{more}", short(&first, 40))
}

/// Bytes in GiB, one decimal below 100.
fn gib(bytes: u64) -> String {
    let g = bytes as f64 / (1u64 << 30) as f64;
    if g >= 100.0 {
        format!("{g:.0}Gi")
    } else {
        format!("{g:.1}Gi")
    }
}

/// tok/s: one decimal, two below 10.
fn rate(p: &Priced) -> String {
    let r = p.tokens_per_second;
    if r >= 10.0 {
        format!("{r:.1}")
    } else {
        format!("{r:.2}")
    }
}

fn ratio(x: Option<f64>) -> String {
    x.map_or("—".into(), |x| format!("{x:.2}"))
}

/// The per-case rows: case | Macs | topology | model | objective | tb | exo | optimum | tb/exo | tb/opt.
pub fn case_rows(results: &[CaseResult]) -> (Vec<String>, Vec<Vec<String>>) {
    let header = [
        "case",
        "Macs",
        "topology",
        "model ctx×batch",
        "objective",
        "tb tok/s",
        "exo tok/s",
        "optimum tok/s",
        "tb/exo",
        "tb/opt",
    ]
    .map(String::from)
    .to_vec();
    let rows = results
        .iter()
        .map(|r| {
            let tb = match &r.tb {
                TbOutcome::Placed(p) => rate(p),
                TbOutcome::Refused {
                    short_bytes: Some(b),
                    ..
                } => format!("refused: {} short", gib(*b)),
                TbOutcome::Refused { message, .. } => format!("refused: {}", short(message, 40)),
                TbOutcome::Broken(why) => format!("BROKEN: {}", short(why, 40)),
            };
            let exo = match &r.exo {
                ExoOutcome::Valid(p) => rate(p),
                ExoOutcome::Invalid { reason, .. } => format!("invalid: {}", first_reason(reason)),
                ExoOutcome::NoPlan(_) => "no plan".into(),
            };
            let opt = match &r.opt {
                OptOutcome::Best(p) => rate(p),
                OptOutcome::NothingFits => "nothing fits".into(),
                OptOutcome::NotEnumerable(n) => format!("— ({n} Macs)"),
                OptOutcome::Mismatch(_) => "MISMATCH".into(),
            };
            vec![
                r.name.clone(),
                r.macs.to_string(),
                r.shape.clone(),
                r.model.clone(),
                r.objective.clone(),
                tb,
                exo,
                opt,
                ratio(r.tb_over_exo()),
                ratio(r.tb_over_opt()),
            ]
        })
        .collect();
    (header, rows)
}

/// Who placed what, one line per case.
pub fn placements(results: &[CaseResult]) -> Vec<String> {
    results
        .iter()
        .map(|r| {
            let tb = match &r.tb {
                TbOutcome::Placed(p) => order_text(&p.order),
                TbOutcome::Refused { message, .. } => format!("refused: {message}"),
                TbOutcome::Broken(why) => format!("broken: {why}"),
            };
            let exo = match &r.exo {
                ExoOutcome::Valid(p) => order_text(&p.order),
                ExoOutcome::Invalid { reason, order } => {
                    format!("{} (invalid: {reason})", order_text(order))
                }
                ExoOutcome::NoPlan(why) => format!("no plan: {why}"),
            };
            let opt = match &r.opt {
                OptOutcome::Best(p) => order_text(&p.order),
                OptOutcome::NothingFits => "nothing fits".into(),
                OptOutcome::NotEnumerable(n) => format!("not enumerated ({n} eligible Macs)"),
                OptOutcome::Mismatch(why) => format!("mismatch: {why}"),
            };
            format!("{}: tb {tb}; exo {exo}; optimum {opt}", r.name)
        })
        .collect()
}

pub fn summary_lines(s: &Summary) -> Vec<String> {
    let mut lines = vec![
        format!(
            "geometric mean tb/exo over the {} cases where exo's plan is valid: {}",
            s.exo_valid,
            ratio(s.geomean_tb_over_exo)
        ),
        format!(
            "geometric mean tb/optimum over the {} enumerable cases with a plan: {}",
            s.with_optimum,
            ratio(s.geomean_tb_over_opt)
        ),
        format!(
            "tb within 2 % of the optimum: {} of {}",
            s.within_2pct, s.with_optimum
        ),
        format!(
            "exo's plan invalid once the KV cache is counted, tb valid: {} (of {} invalid)",
            s.exo_invalid_tb_valid, s.exo_invalid
        ),
        format!(
            "exo finds no cycle, tb places: {} (of {} with no exo plan)",
            s.exo_no_plan_tb_valid, s.exo_no_plan
        ),
        format!(
            "nothing fits and tb refused with a reason: {} of {}",
            s.nothing_fits_refused, s.nothing_fits
        ),
    ];
    for p in &s.problems {
        lines.push(format!("PROBLEM: {p}"));
    }
    lines
}

pub fn solve_rows(times: &[SolveTime]) -> (Vec<String>, Vec<Vec<String>>) {
    let header = [
        "Macs",
        "model",
        "median ms",
        "max ms",
        "runs",
        "target",
        "result",
    ]
    .map(String::from)
    .to_vec();
    let rows = times
        .iter()
        .map(|t| {
            let target = match t.target_ms {
                Some(x) if t.missed() => format!("≤ {x} ms MISSED"),
                Some(x) => format!("≤ {x} ms met"),
                None => "—".into(),
            };
            vec![
                t.macs.to_string(),
                t.model.clone(),
                format!("{:.3}", t.median_ms),
                format!("{:.3}", t.max_ms),
                t.runs.to_string(),
                target,
                t.outcome.clone(),
            ]
        })
        .collect();
    (header, rows)
}

/// A table as markdown, or as aligned plain text.
pub fn table(header: &[String], rows: &[Vec<String>], markdown: bool) -> String {
    let mut out = String::new();
    if markdown {
        out.push_str(&format!("| {} |\n", header.join(" | ")));
        out.push_str(&format!(
            "|{}|\n",
            header.iter().map(|_| "---").collect::<Vec<_>>().join("|")
        ));
        for r in rows {
            out.push_str(&format!("| {} |\n", r.join(" | ")));
        }
        return out;
    }
    let mut width: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[String]| {
        cells
            .iter()
            .zip(&width)
            .map(|(c, w)| format!("{c}{}", " ".repeat(w - c.chars().count())))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    out.push_str(&line(header));
    out.push('\n');
    out.push_str(&line(
        &width.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>(),
    ));
    out.push('\n');
    for r in rows {
        out.push_str(&line(r));
        out.push('\n');
    }
    out
}

fn priced_json(p: &Priced) -> Value {
    json!({
        "tokensPerSecond": p.tokens_per_second,
        "order": p.order.iter().map(|(m, l)| json!({"mac": m, "layers": l})).collect::<Vec<_>>(),
    })
}

/// Everything, as JSON.
pub fn to_json(results: &[CaseResult], summary: &Summary, times: &[SolveTime]) -> Value {
    let cases: Vec<Value> = results
        .iter()
        .map(|r| {
            let tb = match &r.tb {
                TbOutcome::Placed(p) => json!({"placed": priced_json(p)}),
                TbOutcome::Refused {
                    message,
                    short_bytes,
                } => json!({"refused": message, "shortBytes": short_bytes}),
                TbOutcome::Broken(why) => json!({"broken": why}),
            };
            let exo = match &r.exo {
                ExoOutcome::Valid(p) => json!({"valid": priced_json(p)}),
                ExoOutcome::Invalid { reason, order } => json!({"invalid": {
                    "reason": reason,
                    "order": order.iter().map(|(m, l)| json!({"mac": m, "layers": l})).collect::<Vec<_>>(),
                }}),
                ExoOutcome::NoPlan(why) => json!({"noPlan": why}),
            };
            let opt = match &r.opt {
                OptOutcome::Best(p) => json!({"best": priced_json(p)}),
                OptOutcome::NothingFits => json!("nothingFits"),
                OptOutcome::NotEnumerable(n) => json!({"notEnumerable": n}),
                OptOutcome::Mismatch(why) => json!({"mismatch": why}),
            };
            json!({
                "case": r.name, "macs": r.macs, "topology": r.shape, "model": r.model,
                "objective": r.objective, "tb": tb, "exo": exo, "optimum": opt,
                "tbOverExo": r.tb_over_exo(), "tbOverOptimum": r.tb_over_opt(),
                "tbPlanMs": r.tb_ms, "optimumMs": r.opt_ms,
            })
        })
        .collect();
    json!({
        "cases": cases,
        "summary": {
            "geomeanTbOverExo": summary.geomean_tb_over_exo,
            "exoValid": summary.exo_valid,
            "geomeanTbOverOptimum": summary.geomean_tb_over_opt,
            "withOptimum": summary.with_optimum,
            "within2Percent": summary.within_2pct,
            "exoInvalidTbValid": summary.exo_invalid_tb_valid,
            "exoInvalid": summary.exo_invalid,
            "exoNoPlanTbValid": summary.exo_no_plan_tb_valid,
            "exoNoPlan": summary.exo_no_plan,
            "nothingFits": summary.nothing_fits,
            "nothingFitsRefused": summary.nothing_fits_refused,
            "problems": summary.problems,
        },
        "solveTime": times.iter().map(|t| json!({
            "macs": t.macs, "model": t.model, "medianMs": t.median_ms, "maxMs": t.max_ms,
            "runs": t.runs, "targetMs": t.target_ms, "missed": t.missed(), "result": t.outcome,
        })).collect::<Vec<_>>(),
    })
}
