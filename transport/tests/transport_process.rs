//! The data plane with real processes: `tb-collbench --check` spawns rank processes that run
//! every collective over loopback TCP and check every element; killing one rank process in the
//! middle of a sweep must make every other rank exit with an error naming a peer, within the
//! collective timeout. `--smoke` runs the whole measurement path in seconds.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tb-collbench"))
}

#[test]
fn check_mode_with_real_processes() {
    for (ranks, op) in [("3", "allreduce"), ("2", "allgather"), ("4", "broadcast")] {
        let out = bench()
            .args(["--ranks", ranks, "--check", "--min", "1", "--max", "300K"])
            .args(["--op", op, "--chunk", "64K"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{op} on {ranks} ranks: {}\n{text}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            text.contains("bfloat16") && text.contains("float16"),
            "{text}"
        );
    }
}

#[test]
fn smoke_mode_prints_a_table_per_op_and_succeeds() {
    let out = bench().arg("--smoke").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for op in ["allreduce", "allgather", "broadcast"] {
        assert!(text.contains(&format!("# op {op}\n")), "{op}: {text}");
    }
    // 8 B .. 64 KiB, one float32 row per size and op.
    let rows = text.lines().filter(|l| l.contains(" float32 ")).count();
    assert_eq!(rows, 3 * 14, "{text}");
    assert!(text.contains("raw loopback socket pair"), "{text}");
    assert!(text.contains("# smoke: ok"), "{text}");
}

#[test]
fn smoke_mode_fails_when_a_part_cannot_run() {
    let out = bench()
        .args(["--smoke", "--compare-mlx", "/nonexistent/python"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    // tb's own tables still print; the MLX part is what failed.
    assert!(text.contains("# op allreduce: FAILED"), "{text}");
    assert!(text.contains("# op broadcast\n"), "{text}");
    assert!(!text.contains("# smoke: ok"), "{text}");
}

#[test]
fn killed_rank_process_fails_the_others_in_time() {
    let coord = common::coordinator_addr().to_string();
    let world = 3;
    let mut kids: Vec<_> = (0..world)
        .map(|r| {
            bench()
                .args([
                    "--ranks", "3", "--min", "1M", "--max", "4M", "--iters", "100000",
                ])
                .args(["--warmup", "0", "--budget", "100", "--timeout", "5"])
                .args(["--rank", &r.to_string(), "--coordinator", &coord])
                // Each rank logs "data plane: TCP" once its connections to every peer are up.
                .env("RUST_LOG", "tb_transport::select=info")
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // Each rank's stderr, read on its own thread: the lines as they come, then the whole text.
    let (lines, connected) = std::sync::mpsc::channel();
    let readers: Vec<_> = kids
        .iter_mut()
        .enumerate()
        .map(|(r, k)| {
            let stderr = k.stderr.take().unwrap();
            let lines = lines.clone();
            std::thread::spawn(move || {
                let mut all = String::new();
                for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)) {
                    let Ok(line) = line else { break };
                    if line.contains("data plane:") {
                        let _ = lines.send(r);
                    }
                    all.push_str(&line);
                    all.push('\n');
                }
                all
            })
        })
        .collect();
    // Rank 1 dies in the middle of the sweep, not while the ranks still connect (a loaded
    // machine can take longer than any fixed sleep to start three processes).
    let mut up = 0;
    while up < world {
        connected
            .recv_timeout(Duration::from_secs(30))
            .expect("every rank connects within 30 s");
        up += 1;
    }
    std::thread::sleep(Duration::from_millis(200));
    kids[1].kill().unwrap();
    let _ = kids[1].wait();
    let start = Instant::now();
    let mut readers = readers.into_iter();
    for (r, k) in kids.iter_mut().enumerate() {
        let reader = readers.next().unwrap();
        if r == 1 {
            continue;
        }
        let status = loop {
            if let Some(s) = k.try_wait().unwrap() {
                break s;
            }
            if start.elapsed() > Duration::from_secs(12) {
                let _ = k.kill();
                panic!("rank {r} still running 12 s after rank 1 was killed");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let err = reader.join().unwrap();
        assert!(
            !status.success(),
            "rank {r} succeeded after rank 1 died: {err}"
        );
        assert!(
            err.contains("rank ") && (err.contains("closed") || err.contains("timed out")),
            "rank {r}: {err}"
        );
    }
}
