//! Tests of the log writer, tail and follow on real files.

use std::time::Duration;

use futures::StreamExt;

use super::writer::RotatingWriter;
use super::*;

fn lines(range: std::ops::Range<usize>) -> String {
    range.map(|i| format!("line {i:04}\n")).collect()
}

fn files_of(dir: &Path, prefix: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(prefix))
        .collect();
    names.sort();
    names
}

#[test]
fn rotation_keeps_at_most_keep_generations_and_tail_reads_across_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    // "line 0000\n" is 10 bytes: 50-byte files hold 5 lines each.
    let mut w = RotatingWriter::open(dir.path(), Single::Stdout, 50, 2).expect("open");
    for i in 0..40 {
        w.write(lines(i..i + 1).as_bytes()).expect("write");
    }
    assert_eq!(
        files_of(dir.path(), "stdout"),
        ["stdout.log", "stdout.log.1", "stdout.log.2"]
    );
    for name in files_of(dir.path(), "stdout") {
        let len = std::fs::metadata(dir.path().join(&name))
            .expect("meta")
            .len();
        assert!(len <= 50, "{name} has {len} bytes");
    }
    // Three files of five lines survive: lines 25..40.
    let all = read_tail(dir.path(), LogStream::Stdout, None).expect("tail");
    let want: Vec<String> = (25..40).map(|i| format!("line {i:04}")).collect();
    assert_eq!(all, want);
    // A tail longer than the live file reaches into the rotated ones.
    let tail = read_tail(dir.path(), LogStream::Stdout, Some(7)).expect("tail");
    assert_eq!(tail, want[8..]);
    assert_eq!(
        read_tail(dir.path(), LogStream::Stdout, Some(0)).expect("tail"),
        Vec::<String>::new()
    );
}

#[test]
fn one_big_write_rotates_at_line_boundaries() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = RotatingWriter::open(dir.path(), Single::Stderr, 50, 3).expect("open");
    w.write(lines(0..12).as_bytes()).expect("write");
    let live = std::fs::read_to_string(dir.path().join("stderr.log")).expect("live");
    assert_eq!(live, lines(10..12));
    let first = std::fs::read_to_string(dir.path().join("stderr.log.2")).expect(".2");
    assert_eq!(first, lines(0..5));
    let all = read_tail(dir.path(), LogStream::Stderr, None).expect("tail");
    assert_eq!(all.len(), 12);
}

#[test]
fn an_overlong_line_is_cut_rather_than_growing_without_bound() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = RotatingWriter::open(dir.path(), Single::Stdout, 16, 5).expect("open");
    // No newline at all: written in pieces, each file capped near the limit.
    for _ in 0..10 {
        w.write(b"xxxxxxxx").expect("write");
    }
    for name in files_of(dir.path(), "stdout") {
        let len = std::fs::metadata(dir.path().join(&name))
            .expect("meta")
            .len();
        assert!(len <= 16, "{name} has {len} bytes");
    }
}

#[test]
fn keep_zero_truncates_in_place() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = RotatingWriter::open(dir.path(), Single::Stdout, 30, 0).expect("open");
    w.write(lines(0..7).as_bytes()).expect("write");
    assert_eq!(files_of(dir.path(), "stdout"), ["stdout.log"]);
    assert_eq!(
        read_tail(dir.path(), LogStream::Stdout, None).expect("tail"),
        ["line 0006"]
    );
}

#[test]
fn reopening_appends_and_continues_rotation() {
    let dir = tempfile::tempdir().expect("tempdir");
    RotatingWriter::open(dir.path(), Single::Stdout, 50, 3)
        .expect("open")
        .write(lines(0..4).as_bytes())
        .expect("write");
    let mut w = RotatingWriter::open(dir.path(), Single::Stdout, 50, 3).expect("reopen");
    w.write(lines(4..6).as_bytes()).expect("write");
    assert_eq!(
        files_of(dir.path(), "stdout"),
        ["stdout.log", "stdout.log.1"]
    );
    assert_eq!(
        read_tail(dir.path(), LogStream::Stdout, None)
            .expect("tail")
            .len(),
        6
    );
}

#[test]
fn tail_of_both_streams_and_missing_logs() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("stdout.log"), "out 1\nout 2\r\nout 3").expect("write");
    std::fs::write(dir.path().join("stderr.log"), b"err \xff\n").expect("write");
    let both = read_tail(dir.path(), LogStream::Both, Some(2)).expect("tail");
    assert_eq!(both, ["out 2", "out 3", "err \u{fffd}"]);

    let empty = tempfile::tempdir().expect("tempdir");
    assert!(
        read_tail(empty.path(), LogStream::Both, None)
            .expect("tail")
            .is_empty()
    );
    let missing = empty.path().join("nope");
    let err = read_tail(&missing, LogStream::Stdout, None).expect_err("missing dir");
    assert!(err.to_string().contains("nope"), "{err}");
}

/// Collects `n` items from a stream, failing after a generous timeout.
async fn take<S: futures::Stream<Item = String> + Unpin>(stream: &mut S, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    while out.len() < n {
        match tokio::time::timeout(Duration::from_secs(10), stream.next()).await {
            Ok(Some(line)) => out.push(line),
            Ok(None) => break,
            Err(_) => panic!("timed out after {out:?}"),
        }
    }
    out
}

#[tokio::test]
async fn follow_yields_only_lines_appended_after_it_started() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = RotatingWriter::open(dir.path(), Single::Stdout, 1 << 20, 3).expect("open");
    w.write(b"old line\n").expect("write");
    let mut stream = Box::pin(follow(dir.path(), LogStream::Stdout, FollowFrom::End).await);
    assert!(
        tokio::time::timeout(Duration::from_millis(400), stream.next())
            .await
            .is_err()
    );
    w.write(b"new 1\nnew ").expect("write");
    w.write(b"2\n").expect("write");
    assert_eq!(take(&mut stream, 2).await, ["new 1", "new 2"]);
}

#[tokio::test]
async fn follow_survives_rotation_and_starts_with_a_tail() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = RotatingWriter::open(dir.path(), Single::Stdout, 50, 3).expect("open");
    w.write(lines(0..7).as_bytes()).expect("write");
    let mut stream = Box::pin(follow(dir.path(), LogStream::Stdout, FollowFrom::Tail(3)).await);
    assert_eq!(
        take(&mut stream, 3).await,
        ["line 0004", "line 0005", "line 0006"]
    );
    // These fill the live file; the next write rotates it under the follower.
    w.write(lines(7..10).as_bytes()).expect("write");
    assert_eq!(
        take(&mut stream, 3).await,
        ["line 0007", "line 0008", "line 0009"]
    );
    w.write(lines(10..14).as_bytes()).expect("write");
    assert_eq!(
        take(&mut stream, 4).await,
        ["line 0010", "line 0011", "line 0012", "line 0013"]
    );
}

#[tokio::test]
async fn follow_waits_for_files_and_polls_both_streams() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut stream = Box::pin(follow(dir.path(), LogStream::Both, FollowFrom::End).await);
    let mut out = RotatingWriter::open(dir.path(), Single::Stdout, 1 << 20, 3).expect("open");
    let mut err = RotatingWriter::open(dir.path(), Single::Stderr, 1 << 20, 3).expect("open");
    out.write(b"to stdout\n").expect("write");
    err.write(b"to stderr\n").expect("write");
    let mut got = take(&mut stream, 2).await;
    got.sort();
    assert_eq!(got, ["to stderr", "to stdout"]);
}

#[tokio::test]
async fn follow_until_drains_then_ends() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = RotatingWriter::open(dir.path(), Single::Stdout, 1 << 20, 3).expect("open");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let stop = async move {
        let _ = stop_rx.await;
    };
    let mut stream =
        Box::pin(follow_until(dir.path(), LogStream::Stdout, FollowFrom::End, stop).await);
    // Written and stopped at once: the lines still come out, then the stream ends.
    w.write(lines(0..1000).as_bytes()).expect("write");
    stop_tx.send(()).expect("stop");
    let got = take(&mut stream, 1001).await;
    assert_eq!(got.len(), 1000);
    assert_eq!(got.last().map(String::as_str), Some("line 0999"));
}
