//! Tests of the log writer, tail and follow on real files.

use std::time::Duration;

use chrono::TimeDelta;
use futures::StreamExt;

use super::writer::RotatingWriter;
use super::*;

fn lines(range: std::ops::Range<usize>) -> String {
    range.map(|i| format!("line {i:04}\n")).collect()
}

/// The stored size of one of [`lines`]' lines: a stamp, a space and "line 0000\n".
const LINE: u64 = STAMP_LEN as u64 + 1 + 10;

/// A fixed time, for stamps that tests can spell out.
fn t0() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-12-02T13:21:14.798Z")
        .expect("time")
        .with_timezone(&Utc)
}

/// A file's lines as stored, each checked to carry exactly one stamp, with the stamps taken off
/// (and joined with newlines, as [`lines`] writes them).
fn unstamped(path: &Path) -> String {
    let stored = std::fs::read_to_string(path).expect("read log");
    let mut out = String::new();
    for piece in stored.split_inclusive('\n') {
        let (time, text) = split_stamp(piece);
        assert!(
            time.is_some(),
            "unstamped line {piece:?} in {}",
            path.display()
        );
        assert_eq!(split_stamp(text).0, None, "stamped twice: {piece:?}");
        out.push_str(text);
    }
    out
}

fn line(time: Option<&str>, text: &str) -> StampedLine {
    StampedLine {
        time: time.map(str::to_string),
        text: text.to_string(),
    }
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
    // Files hold 5 stamped lines each.
    let mut w = RotatingWriter::open(dir.path(), Single::Stdout, 5 * LINE, 2).expect("open");
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
        assert!(len <= 5 * LINE, "{name} has {len} bytes");
        assert_eq!(unstamped(&dir.path().join(&name)).lines().count(), 5);
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
    let mut w = RotatingWriter::open(dir.path(), Single::Stderr, 5 * LINE, 3).expect("open");
    w.write(lines(0..12).as_bytes()).expect("write");
    assert_eq!(unstamped(&dir.path().join("stderr.log")), lines(10..12));
    assert_eq!(unstamped(&dir.path().join("stderr.log.1")), lines(5..10));
    assert_eq!(unstamped(&dir.path().join("stderr.log.2")), lines(0..5));
    let all = read_tail(dir.path(), LogStream::Stderr, None).expect("tail");
    assert_eq!(all.len(), 12);
}

#[test]
fn an_overlong_line_is_cut_rather_than_growing_without_bound() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Room for a stamp and two pieces.
    let max = STAMP_LEN as u64 + 1 + 16;
    let mut w = RotatingWriter::open(dir.path(), Single::Stdout, max, 5).expect("open");
    // No newline at all: written in pieces, each file capped near the limit.
    for i in 0..10 {
        w.write_at(b"xxxxxxxx", t0() + TimeDelta::seconds(i))
            .expect("write");
    }
    let names = files_of(dir.path(), "stdout");
    assert_eq!(names.len(), 5);
    for name in names {
        let len = std::fs::metadata(dir.path().join(&name))
            .expect("meta")
            .len();
        assert!(len <= max, "{name} has {len} bytes");
    }
    // Each file's piece of the line starts with the line's stamp, that of its first byte.
    let stamped = read_tail_stamped(dir.path(), LogStream::Stdout, None, None).expect("tail");
    let want = line(Some("2026-12-02T13:21:14.798Z"), "xxxxxxxxxxxxxxxx");
    assert_eq!(stamped, vec![want; 5]);
}

#[test]
fn keep_zero_truncates_in_place() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = RotatingWriter::open(dir.path(), Single::Stdout, 3 * LINE, 0).expect("open");
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
    RotatingWriter::open(dir.path(), Single::Stdout, 5 * LINE, 3)
        .expect("open")
        .write(lines(0..4).as_bytes())
        .expect("write");
    let mut w = RotatingWriter::open(dir.path(), Single::Stdout, 5 * LINE, 3).expect("reopen");
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
    let mut w = RotatingWriter::open(dir.path(), Single::Stdout, 5 * LINE, 3).expect("open");
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

#[test]
fn each_line_is_stamped_once_when_its_first_byte_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = RotatingWriter::open(dir.path(), Single::Stdout, 1 << 20, 3).expect("open");
    let at = |ms| t0() + TimeDelta::milliseconds(ms);
    w.write_at(b"hel", at(0)).expect("write");
    w.write_at(b"lo\nwor", at(1)).expect("write");
    w.write_at(b"ld", at(2)).expect("write");
    w.write_at(b"\n", at(3)).expect("write");
    w.write_at(b"a\n\nb\r\n", at(4)).expect("write");
    w.write_at(b"", at(5)).expect("write");
    let stored = std::fs::read_to_string(dir.path().join("stdout.log")).expect("read");
    assert_eq!(
        stored,
        "2026-12-02T13:21:14.798Z hello\n\
         2026-12-02T13:21:14.799Z world\n\
         2026-12-02T13:21:14.802Z a\n\
         2026-12-02T13:21:14.802Z \n\
         2026-12-02T13:21:14.802Z b\r\n"
    );
    let read = read_tail_stamped(dir.path(), LogStream::Stdout, None, None).expect("tail");
    assert_eq!(
        read,
        [
            line(Some("2026-12-02T13:21:14.798Z"), "hello"),
            line(Some("2026-12-02T13:21:14.799Z"), "world"),
            line(Some("2026-12-02T13:21:14.802Z"), "a"),
            line(Some("2026-12-02T13:21:14.802Z"), ""),
            line(Some("2026-12-02T13:21:14.802Z"), "b"),
        ]
    );
    // The plain readers return the lines as written.
    assert_eq!(
        read_tail(dir.path(), LogStream::Stdout, None).expect("tail"),
        ["hello", "world", "a", "", "b"]
    );
}

#[test]
fn the_writer_stamps_with_the_current_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = RotatingWriter::open(dir.path(), Single::Stderr, 1 << 20, 3).expect("open");
    let before = Utc::now().trunc_subsecs(3);
    w.write(b"now\n").expect("write");
    let after = Utc::now();
    let read = read_tail_stamped(dir.path(), LogStream::Stderr, None, None).expect("tail");
    let [
        StampedLine {
            time: Some(time),
            text,
        },
    ] = &read[..]
    else {
        panic!("one stamped line expected: {read:?}");
    };
    assert_eq!(text, "now");
    let at = DateTime::parse_from_rfc3339(time).expect("rfc 3339");
    assert!(before <= at && at <= after, "{before} <= {at} <= {after}");
}

#[test]
fn a_restarted_writer_ends_its_predecessors_unterminated_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    RotatingWriter::open(dir.path(), Single::Stdout, 1 << 20, 3)
        .expect("open")
        .write_at(b"cut short", t0())
        .expect("write");
    let mut w = RotatingWriter::open(dir.path(), Single::Stdout, 1 << 20, 3).expect("reopen");
    // Opening alone changes nothing (it must work on a full disk too).
    let read = || std::fs::read_to_string(dir.path().join("stdout.log")).expect("read");
    assert_eq!(read(), "2026-12-02T13:21:14.798Z cut short");
    w.write_at(b"next\n", t0() + TimeDelta::seconds(1))
        .expect("write");
    assert_eq!(
        read(),
        "2026-12-02T13:21:14.798Z cut short\n2026-12-02T13:21:15.798Z next\n"
    );
    assert_eq!(
        read_tail_stamped(dir.path(), LogStream::Stdout, None, None).expect("tail"),
        [
            line(Some("2026-12-02T13:21:14.798Z"), "cut short"),
            line(Some("2026-12-02T13:21:15.798Z"), "next"),
        ]
    );
}

#[test]
fn split_stamp_recognises_exactly_the_stamp() {
    assert_eq!(
        split_stamp("2026-12-02T13:21:14.798Z hello world"),
        (Some("2026-12-02T13:21:14.798Z"), "hello world")
    );
    assert_eq!(
        split_stamp("2026-12-02T13:21:14.798Z "),
        (Some("2026-12-02T13:21:14.798Z"), "")
    );
    assert_eq!(
        split_stamp("2026-12-02T13:21:14.798Z  indented ✓"),
        (Some("2026-12-02T13:21:14.798Z"), " indented ✓")
    );
    for legacy in [
        "",
        "hello",
        "2026-12-02T13:21:14.798Z",
        "2026-12-02T13:21:14.798Zhello",
        "2026-12-02T13:21:14.79Z hello",
        "2026-12-02T13:21:14.7980Z hello",
        "2026-12-02T13:21:14Z hello",
        "2026-12-02t13:21:14.798Z hello",
        "2026-12-02 13:21:14.798Z hello",
        "2026-12-02T13:21:14.798+00:00 hello",
        "2026-13-02T13:21:14.798Z hello",
        "2026-02-30T13:21:14.798Z hello",
        "2026-12-02T25:21:14.798Z hello",
        "２026-12-02T13:21:14.798Z hello",
        " 2026-12-02T13:21:14.798Z hello",
    ] {
        assert_eq!(split_stamp(legacy), (None, legacy), "{legacy:?}");
    }
}

/// Writes `stdout.log.1` and `stdout.log` by hand: old lines, a line from before stamps, and
/// lines at [`t0`] and a second later.
fn mixed_log(dir: &Path) {
    std::fs::write(
        dir.join("stdout.log.1"),
        "2020-01-01T00:00:00.000Z old 1\nlegacy\n2020-01-01T00:00:01.000Z old 2\n",
    )
    .expect("write");
    std::fs::write(
        dir.join("stdout.log"),
        "2026-12-02T13:21:14.798Z new 1\n2026-12-02T13:21:15.798Z new 2\n",
    )
    .expect("write");
}

#[test]
fn since_skips_older_lines_before_the_tail_is_taken() {
    let dir = tempfile::tempdir().expect("tempdir");
    mixed_log(dir.path());
    let since = Some(t0() - TimeDelta::minutes(10));
    let new_1 = line(Some("2026-12-02T13:21:14.798Z"), "new 1");
    let new_2 = line(Some("2026-12-02T13:21:15.798Z"), "new 2");
    let legacy = line(None, "legacy");
    let read =
        |tail, since| read_tail_stamped(dir.path(), LogStream::Stdout, tail, since).expect("tail");
    assert_eq!(
        read(None, since),
        [legacy.clone(), new_1.clone(), new_2.clone()]
    );
    // The tail counts the lines the cutoff lets through: not "old 2".
    assert_eq!(
        read(Some(3), since),
        [legacy.clone(), new_1.clone(), new_2.clone()]
    );
    assert_eq!(read(Some(2), since), [new_1.clone(), new_2.clone()]);
    // Without a cutoff, everything; old lines keep their times.
    assert_eq!(read(None, None).len(), 5);
    assert_eq!(
        read(Some(3), None)[0],
        line(Some("2020-01-01T00:00:01.000Z"), "old 2")
    );
    // At the stamps' resolution: a cutoff within new 1's millisecond keeps it, the next
    // millisecond does not.
    let within = t0() + TimeDelta::microseconds(900);
    assert_eq!(
        read(None, Some(within)),
        [legacy.clone(), new_1, new_2.clone()]
    );
    let after = t0() + TimeDelta::milliseconds(1);
    assert_eq!(read(None, Some(after)), [legacy.clone(), new_2]);
    // A cutoff after everything leaves the lines of unknown time only.
    assert_eq!(read(None, Some(t0() + TimeDelta::days(1))), [legacy]);
}

/// Collects `n` items from a stream, failing after a generous timeout.
async fn take_stamped<S: futures::Stream<Item = StampedLine> + Unpin>(
    stream: &mut S,
    n: usize,
) -> Vec<StampedLine> {
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
async fn follow_with_since_starts_with_a_tail_of_newer_lines() {
    let dir = tempfile::tempdir().expect("tempdir");
    mixed_log(dir.path());
    let since = Some(t0() - TimeDelta::minutes(10));
    let mut stream = Box::pin(
        follow_stamped(
            dir.path(),
            LogStream::Stdout,
            FollowFrom::Tail(3),
            since,
            std::future::pending(),
        )
        .await,
    );
    assert_eq!(
        take_stamped(&mut stream, 3).await,
        [
            line(None, "legacy"),
            line(Some("2026-12-02T13:21:14.798Z"), "new 1"),
            line(Some("2026-12-02T13:21:15.798Z"), "new 2"),
        ]
    );
    // Appended lines pass the same test: an old one (a clock set back) is skipped.
    let mut w = RotatingWriter::open(dir.path(), Single::Stdout, 1 << 20, 3).expect("open");
    w.write_at(b"too old\n", t0() - TimeDelta::hours(1))
        .expect("write");
    w.write_at(b"fresh\n", t0() + TimeDelta::seconds(5))
        .expect("write");
    assert_eq!(
        take_stamped(&mut stream, 1).await,
        [line(Some("2026-12-02T13:21:19.798Z"), "fresh")]
    );
}

#[tokio::test]
async fn follow_gives_every_piece_of_an_overlong_line_its_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = RotatingWriter::open(dir.path(), Single::Stdout, 1 << 30, 3).expect("open");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let stop = async move {
        let _ = stop_rx.await;
    };
    let since = Some(t0());
    let stream = follow_stamped(dir.path(), LogStream::Stdout, FollowFrom::End, since, stop).await;
    let long = vec![b'x'; 2 * follow::MAX_LINE + 10];
    // Each line's newline comes a few polls later, so the follower yields the line in pieces.
    let settle = || tokio::time::sleep(3 * follow::POLL_INTERVAL);
    // Too old: every piece is skipped, not just the stamped first one.
    w.write_at(&long, t0() - TimeDelta::seconds(1))
        .expect("write");
    settle().await;
    w.write_at(b"\n", t0()).expect("write");
    w.write_at(&long, t0()).expect("write");
    settle().await;
    w.write_at(b"\nafter\n", t0()).expect("write");
    stop_tx.send(()).expect("stop");
    let got: Vec<StampedLine> = tokio::time::timeout(Duration::from_secs(10), stream.collect())
        .await
        .expect("drained in time");
    let time = Some("2026-12-02T13:21:14.798Z".to_string());
    let (last, pieces) = got.split_last().expect("lines");
    assert_eq!(*last, line(time.as_deref(), "after"));
    // Texts are long: show times and lengths.
    let shown: Vec<_> = pieces.iter().map(|p| (&p.time, p.text.len())).collect();
    assert!(pieces.len() >= 2, "{shown:?}");
    assert!(pieces.iter().all(|p| p.time == time), "{shown:?}");
    let text: String = pieces.iter().map(|p| p.text.as_str()).collect();
    assert_eq!(text.len(), long.len());
}
