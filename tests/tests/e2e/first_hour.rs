//! docs/first-hour.md cannot rot: its fenced `sh` blocks are extracted and run, in order, as one
//! bash script (`set -euo pipefail`, so the first failing command fails the test), from the
//! workspace root as a newcomer would from a fresh clone — with a private `HOME` (tbctl's state
//! and config live there), no `TB_*` or `XDG_*` variables from the test's environment, and
//! loopback only.
//!
//! With `TB_TEST_BIN_DIR` set, the build block (exactly `cargo build ...` and the `export PATH`
//! line, checked) is replaced by putting that directory first on `PATH`, so the doc runs
//! against the binaries under test; without it the block runs as written. Whatever happens,
//! `tbctl down` is run at the end so no process outlives the test.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tb_tests::lab;
use tb_tests::step;

/// The whole page: building (a no-op when built), the model's load, two waits.
const RUN_TIMEOUT: Duration = Duration::from_secs(900);
/// The controller port `tbctl up` uses by default (the doc does not choose one).
const UP_PORT: u16 = 7400;

/// The doc's build block, which the test replaces when it is given binaries.
const BUILD_BLOCK: &str =
    "cargo build --workspace --bins\nexport PATH=\"$PWD/target/debug:$PATH\"\n";

/// A fenced block of the doc: its first line number (1-based) and its text.
#[derive(Debug)]
struct Block {
    line: usize,
    text: String,
}

/// The fenced blocks whose info string is `sh`.
fn sh_blocks(markdown: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut current: Option<Block> = None;
    let mut in_other = false;
    for (i, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(info) = trimmed.strip_prefix("```") {
            match (&mut current, in_other) {
                (Some(_), _) => blocks.extend(current.take()),
                (None, true) => in_other = false,
                (None, false) if info.trim() == "sh" => {
                    current = Some(Block {
                        line: i + 2,
                        text: String::new(),
                    })
                }
                (None, false) => in_other = true,
            }
            continue;
        }
        if let Some(b) = &mut current {
            b.text.push_str(line);
            b.text.push('\n');
        }
    }
    assert!(current.is_none() && !in_other, "an unclosed fence");
    blocks
}

/// The script the test runs: every block, each announced with its line in the doc.
fn script(blocks: &[Block], bin_dir: Option<&Path>) -> String {
    // A background command of the doc (`tbctl get -w &`) must not outlive a failed run: it
    // would hold the output pipe open.
    let mut out =
        String::from("set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n");
    for b in blocks {
        out.push_str(&format!(
            "echo '### docs/first-hour.md line {}' >&2\n",
            b.line
        ));
        match bin_dir {
            Some(dir) if b.text.starts_with("cargo build") => {
                assert_eq!(
                    b.text, BUILD_BLOCK,
                    "the build block changed: update BUILD_BLOCK in tests/tests/e2e/first_hour.rs"
                );
                out.push_str(&format!(
                    "export PATH={}:\"$PATH\"\n",
                    shell_quote(&dir.display().to_string())
                ));
            }
            _ => out.push_str(&b.text),
        }
    }
    out
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[test]
fn the_doc_has_every_step() {
    let doc = std::fs::read_to_string(doc_path()).expect("docs/first-hour.md");
    let blocks = sh_blocks(&doc);
    let all: String = blocks.iter().map(|b| b.text.as_str()).collect();
    for step in [
        "cargo build",
        "tbctl up",
        "tbctl apply -f manifests/trainingjob-echo.yaml",
        "tbctl get tj -w",
        "tbctl logs echo",
        "tbctl chat",
        "curl",
        "manifests/openai_chat.py",
        "tbctl plan",
        "tbctl down",
    ] {
        assert!(all.contains(step), "docs/first-hour.md runs no `{step}`");
    }
    assert_eq!(
        blocks.first().map(|b| b.text.as_str()),
        Some(BUILD_BLOCK),
        "the first step builds"
    );
    let readme =
        std::fs::read_to_string(lab::workspace_root().join("README.md")).expect("README.md");
    assert!(
        readme.contains("(docs/first-hour.md)"),
        "README.md links docs/first-hour.md"
    );
}

fn doc_path() -> PathBuf {
    lab::workspace_root().join("docs").join("first-hour.md")
}

/// Runs `tbctl down` with the doc's environment when the test ends, however it ends.
struct Down {
    env: Vec<(String, String)>,
}

impl Drop for Down {
    fn drop(&mut self) {
        let _ = std::process::Command::new("bash")
            .args(["-c", "tbctl down"])
            .current_dir(lab::workspace_root())
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

#[tokio::test]
async fn every_command_of_the_first_hour_runs() {
    let _rank_ports = tb_tests::ports::default_rank_ports().await;
    if let Err(e) = std::net::TcpListener::bind(("127.0.0.1", UP_PORT)) {
        panic!(
            "the doc's `tbctl up` serves on 127.0.0.1:{UP_PORT}, which is taken ({e}): stop \
             what holds it (a `tbctl up` of yours? `tbctl down`)"
        );
    }
    let doc = std::fs::read_to_string(doc_path()).expect("docs/first-hour.md");
    let blocks = sh_blocks(&doc);
    let bin_dir = std::env::var_os("TB_TEST_BIN_DIR").map(PathBuf::from);
    let script = script(&blocks, bin_dir.as_deref());
    let scratch = tempfile::tempdir().expect("temp dir");
    let home = scratch.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    // The doc's environment: a private HOME, the caller's PATH (cargo, python3, curl), the
    // toolchain's variables, nothing of tb's.
    let mut env: Vec<(String, String)> = vec![
        ("HOME".into(), home.display().to_string()),
        ("NO_COLOR".into(), "1".into()),
        ("LANG".into(), "C.UTF-8".into()),
    ];
    for key in ["PATH", "CARGO_HOME", "RUSTUP_HOME", "TMPDIR", "USER"] {
        if let Some(v) = std::env::var_os(key) {
            env.push((key.into(), v.to_string_lossy().into_owned()));
        }
    }
    let mut path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    if let Some(dir) = &bin_dir {
        path = format!("{}:{path}", dir.display());
    }
    env.retain(|(k, _)| k != "PATH");
    env.push(("PATH".into(), path));
    let _down = Down { env: env.clone() };
    let script_path = scratch.path().join("first-hour.sh");
    std::fs::write(&script_path, &script).expect("script");
    step!("running {} block(s) of docs/first-hour.md", blocks.len());
    let started = Instant::now();
    let child = tokio::process::Command::new("bash")
        .arg(&script_path)
        .current_dir(lab::workspace_root())
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("bash");
    let out = match tokio::time::timeout(RUN_TIMEOUT, child.wait_with_output()).await {
        Ok(out) => out.expect("waiting for bash"),
        Err(_) => panic!("docs/first-hour.md did not finish within {RUN_TIMEOUT:?}"),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    step!(
        "docs/first-hour.md ran in {:.1}s ({:.2} min)",
        started.elapsed().as_secs_f64(),
        started.elapsed().as_secs_f64() / 60.0
    );
    let last_block = stderr
        .lines()
        .rfind(|l| l.starts_with("### docs/first-hour.md"))
        .unwrap_or("before the first block");
    assert!(
        out.status.success(),
        "docs/first-hour.md failed ({}) in the block at {}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
        out.status,
        last_block.trim_start_matches("### docs/first-hour.md ")
    );
    // What the doc promises the reader sees.
    for promised in ["rank 0 of 3", "rank 2 of 3", "Paris", "NEXT SCHEDULE"] {
        assert!(
            stdout.contains(promised),
            "the doc's output lacks {promised:?}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
        );
    }
    step!("stdout:\n{stdout}");
}

#[test]
fn blocks_are_extracted_in_order() {
    let md = "intro\n```sh\na\nb\n```\n```text\nnot run\n```\n  ```sh\nc\n  ```\n";
    let blocks = sh_blocks(md);
    let texts: Vec<&str> = blocks.iter().map(|b| b.text.as_str()).collect();
    assert_eq!(texts, ["a\nb\n", "c\n"]);
    assert_eq!(blocks[0].line, 3);
}
