//! Reading a controller's Prometheus text from `--metrics-listen`, to say where time goes:
//! server-side latency per gRPC method, how long applying committed batches takes and how many
//! batches there were, and how many objects the store holds.

use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// GET `http://ADDR/metrics` (plain HTTP/1.1, connection closed after the answer).
pub async fn scrape(addr: &str) -> anyhow::Result<String> {
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text
            .split_once("\r\n\r\n")
            .context("the metrics answer has no header/body separator")?;
        anyhow::ensure!(
            head.starts_with("HTTP/1.1 200"),
            "metrics answered {}",
            head.lines().next().unwrap_or("")
        );
        Ok(body.to_string())
    };
    tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .with_context(|| format!("no metrics from {addr} within 5 s"))?
}

/// A histogram's total count and sum (seconds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub count: u64,
    pub sum_seconds: f64,
}

impl Summary {
    pub fn mean(&self) -> Option<Duration> {
        (self.count > 0).then(|| Duration::from_secs_f64(self.sum_seconds / self.count as f64))
    }
}

/// The value of the sample `name{labels}` whose labels contain `label` (e.g.
/// `method="Objects/Apply"`; empty: any).
fn sample(text: &str, name: &str, label: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let (labels, value) = match rest.strip_prefix('{') {
            Some(r) => r.split_once('}')?,
            None => ("", rest),
        };
        if !value.starts_with(' ') || !labels.contains(label) {
            return None;
        }
        value.split_whitespace().next()?.parse().ok()
    })
}

/// `_count` and `_sum` of histogram `name` (with `label`, if not empty).
pub fn histogram(text: &str, name: &str, label: &str) -> Option<Summary> {
    Some(Summary {
        count: sample(text, &format!("{name}_count"), label)? as u64,
        sum_seconds: sample(text, &format!("{name}_sum"), label)?,
    })
}

/// Server-side latency of one gRPC method (`Objects/Apply`, `Raft/Append`, ...).
pub fn method(text: &str, method: &str) -> Option<Summary> {
    histogram(
        text,
        "tb_grpc_request_duration_seconds",
        &format!("method=\"{method}\""),
    )
}

/// Time spent applying committed batches to the store.
pub fn apply(text: &str) -> Option<Summary> {
    histogram(text, "tb_apply_duration_seconds", "")
}

/// Stored objects of one kind.
pub fn objects(text: &str, kind: &str) -> Option<u64> {
    sample(text, "tb_objects", &format!("kind=\"{kind}\"")).map(|v| v as u64)
}

/// Requests of `method` answered with a code other than Ok, with the codes.
pub fn refused(text: &str, method: &str) -> Vec<(String, u64)> {
    let want = format!("method=\"{method}\"");
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("tb_grpc_requests_total{")?;
            let (labels, value) = rest.split_once('}')?;
            if !labels.contains(&want) || labels.contains("code=\"Ok\"") {
                return None;
            }
            let code = labels
                .split("code=\"")
                .nth(1)?
                .split('"')
                .next()?
                .to_string();
            Some((code, value.trim().parse::<f64>().ok()? as u64))
        })
        .collect()
}

/// Scrape every member after a run, keep the raw text next to the logs in `dir`, and say in a
/// few lines where the time went (server-side `Objects/Apply` and `Raft/Append` latency, how
/// many committed batches the leader applied, how many objects each store holds).
pub async fn observe(addrs: &[String], leader: usize, dir: &std::path::Path) -> Vec<String> {
    let mut notes = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let who = format!("tb-{}{}", i + 1, if i == leader { " (leader)" } else { "" });
        let text = match scrape(addr).await {
            Ok(t) => t,
            Err(e) => {
                notes.push(format!("{who}: metrics unavailable: {e:#}"));
                continue;
            }
        };
        let _ = std::fs::write(dir.join(format!("metrics-tb-{}.txt", i + 1)), &text);
        let mut parts = Vec::new();
        if let Some(n) = objects(&text, "Model") {
            parts.push(format!("{n} Models stored"));
        }
        for m in ["Objects/Apply", "Raft/Propose", "Raft/Append"] {
            if let Some(h) = method(&text, m).filter(|h| h.count > 0) {
                parts.push(format!("{m}: {} calls, mean {} ms", h.count, ms(h.mean())));
            }
            let refusals = refused(&text, m);
            if !refusals.is_empty() {
                let list: Vec<String> = refusals.iter().map(|(c, n)| format!("{n}x {c}")).collect();
                parts.push(format!("{m} refused: {}", list.join(", ")));
            }
        }
        if let Some(h) = apply(&text).filter(|h| h.count > 0) {
            parts.push(format!(
                "state-machine apply: {} batches, mean {} ms",
                h.count,
                ms(h.mean())
            ));
        }
        notes.push(format!("{who}: {}", parts.join("; ")));
    }
    notes
}

fn ms(d: Option<Duration>) -> String {
    d.map_or_else(
        || "-".into(),
        |d| format!("{:.2}", d.as_secs_f64() * 1000.0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP tb_grpc_requests gRPC requests by method and code.
# TYPE tb_grpc_requests counter
tb_grpc_requests_total{method="Objects/Apply",code="Ok"} 10000
tb_grpc_requests_total{method="Objects/Apply",code="Unavailable"} 3
tb_grpc_request_duration_seconds_sum{method="Objects/Apply"} 50.0
tb_grpc_request_duration_seconds_count{method="Objects/Apply"} 10000
tb_grpc_request_duration_seconds_bucket{le="0.00005",method="Objects/Apply"} 0
tb_apply_duration_seconds_sum 1.5
tb_apply_duration_seconds_count 3000
tb_objects{kind="Model"} 10000
"#;

    #[test]
    fn reads_histograms_gauges_and_refusals() {
        let apply_rpc = method(TEXT, "Objects/Apply").unwrap();
        assert_eq!(apply_rpc.count, 10000);
        assert_eq!(apply_rpc.mean(), Some(Duration::from_millis(5)));
        assert_eq!(apply(TEXT).unwrap().count, 3000);
        assert_eq!(objects(TEXT, "Model"), Some(10000));
        assert_eq!(
            refused(TEXT, "Objects/Apply"),
            vec![("Unavailable".to_string(), 3)]
        );
        assert_eq!(method(TEXT, "Raft/Append"), None);
    }
}
