//! The probe server and prober over real sockets on loopback: 127.0.0.1 and 127.0.0.2 stand for
//! two port addresses of one Mac (Linux answers on all of 127/8).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use tb_nodelet::probe::client::measure;
use tb_nodelet::probe::server::ProbeServer;
use tb_nodelet::probe::{OP_BULK, OP_PING, PING_SIZE, ProbeConfig, ProbeError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const A: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const B: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

fn quick() -> ProbeConfig {
    ProbeConfig {
        duration: Duration::from_millis(300),
        timeout: Duration::from_secs(10),
        ..ProbeConfig::default()
    }
}

#[tokio::test]
async fn probes_measure_latency_and_bandwidth_between_two_addresses() {
    let server = ProbeServer::new(0);
    server.serve_on(&[A, B]).await;
    let port = server.port();
    assert_ne!(port, 0, "a port was picked");
    assert_eq!(
        server.addresses(),
        vec![A, B],
        "one port for both addresses"
    );

    let cfg = quick();
    let m = measure(A, SocketAddr::new(B, port), &cfg)
        .await
        .expect("probe succeeds");
    eprintln!("127.0.0.1 -> 127.0.0.2: {m:?}");
    assert_eq!(m.round_trips, 200);
    assert_eq!(m.streams, 4);
    assert!(m.latency_us_p50 > 0.0, "{m:?}");
    assert!(m.latency_us_p50 <= m.latency_us_p99, "{m:?}");
    assert!(m.bytes > 0, "{m:?}");
    assert!(m.bandwidth_gbps > 0.0, "{m:?}");
    assert!(m.elapsed >= cfg.duration, "{m:?}");
    // The other way round, too.
    let back = measure(B, SocketAddr::new(A, port), &cfg)
        .await
        .expect("probe succeeds");
    assert!(back.bandwidth_gbps > 0.0);

    // Into a Link status.
    let mut status = tb_api::specs::LinkStatus {
        error: "earlier failure".into(),
        ..Default::default()
    };
    m.fill(&mut status);
    assert!(status.measured());
    assert_eq!(status.transport, "tcp");
    assert!(status.error.is_empty());
}

#[tokio::test]
async fn bulk_bytes_are_capped_and_counted_exactly() {
    let server = ProbeServer::new(0);
    server.serve_on(&[A]).await;
    let cfg = ProbeConfig {
        round_trips: 5,
        warmup: 1,
        streams: 3,
        duration: Duration::from_secs(30),
        max_bytes: 1_000_000,
        ..ProbeConfig::default()
    };
    let started = Instant::now();
    let m = measure(A, SocketAddr::new(A, server.port()), &cfg)
        .await
        .expect("probe succeeds");
    assert_eq!(m.bytes, 1_000_000, "the byte cap ends the streams");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn a_dead_peer_fails_within_the_timeout() {
    // A port nobody listens on: refused at once.
    let free = std::net::TcpListener::bind((A, 0)).expect("bind");
    let port = free.local_addr().expect("addr").port();
    drop(free);
    let cfg = ProbeConfig {
        connect_timeout: Duration::from_millis(500),
        timeout: Duration::from_secs(2),
        ..ProbeConfig::default()
    };
    let started = Instant::now();
    let err = measure(A, SocketAddr::new(B, port), &cfg)
        .await
        .expect_err("nobody listens");
    assert!(matches!(err, ProbeError::Connect { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2));

    // A peer that accepts and never answers: the probe's own deadline ends it.
    let silent = tokio::net::TcpListener::bind((B, 0)).await.expect("bind");
    let silent_addr = silent.local_addr().expect("addr");
    let held = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let started = Instant::now();
    let err = measure(A, silent_addr, &cfg).await.expect_err("no answer");
    assert!(matches!(err, ProbeError::Timeout { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(4));
    held.abort();

    // Binding to an address this machine does not have.
    let err = measure(
        IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
        SocketAddr::new(B, port),
        &cfg,
    )
    .await
    .expect_err("not our address");
    assert!(matches!(err, ProbeError::Bind { .. }), "{err}");
}

#[tokio::test]
async fn the_server_speaks_the_documented_protocol() {
    let server = ProbeServer::new(0);
    server.serve_on(&[A]).await;
    let at = SocketAddr::new(A, server.port());

    // Ping-pong: each 64-byte message comes back whole; EOF ends it.
    let mut s = TcpStream::connect(at).await.expect("connect");
    s.write_all(&[OP_PING]).await.expect("op");
    for i in 0..3u8 {
        let msg = [i; PING_SIZE];
        s.write_all(&msg).await.expect("ping");
        let mut back = [0u8; PING_SIZE];
        s.read_exact(&mut back).await.expect("pong");
        assert_eq!(back, msg);
    }
    s.shutdown().await.expect("eof");
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).await.expect("closed");
    assert!(rest.is_empty());

    // Bulk: the count of bytes after the op, as u64 big-endian.
    let mut s = TcpStream::connect(at).await.expect("connect");
    s.write_all(&[OP_BULK]).await.expect("op");
    s.write_all(&vec![7u8; 300_001]).await.expect("bulk");
    s.shutdown().await.expect("eof");
    let mut count = [0u8; 8];
    s.read_exact(&mut count).await.expect("count");
    assert_eq!(u64::from_be_bytes(count), 300_001);

    // Anything else: closed.
    let mut s = TcpStream::connect(at).await.expect("connect");
    s.write_all(b"X").await.expect("op");
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest).await;
    assert!(rest.is_empty());
}

#[tokio::test]
async fn listeners_follow_the_addresses() {
    let server = ProbeServer::new(0);
    server.serve_on(&[A, B]).await;
    let port = server.port();
    server.serve_on(&[A]).await;
    assert_eq!(server.addresses(), vec![A]);
    assert_eq!(server.port(), port, "the port stays");
    // The listener on B is gone (its task is aborted; give it a moment to drop).
    let mut refused = false;
    for _ in 0..50 {
        if TcpStream::connect((B, port)).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(refused, "nothing listens on {B}:{port} any more");
    server.serve_on(&[A, B]).await;
    assert_eq!(server.addresses(), vec![A, B]);
    assert_eq!(server.port(), port, "a new address gets the same port");

    // An address this machine does not have is skipped; the port is still reported.
    server
        .serve_on(&[A, B, IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1))])
        .await;
    assert_eq!(server.addresses(), vec![A, B]);
    server.serve_on(&[]).await;
    assert_eq!(server.port(), 0, "no listener, no probe port");
}
