//! The probe server and prober over real sockets on loopback: 127.0.0.1 and 127.0.0.2 stand for
//! two port addresses of one Mac (Linux answers on all of 127/8).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use tb_nodelet::probe::client::measure;
use tb_nodelet::probe::server::ProbeServer;
use tb_nodelet::probe::session::Request;
use tb_nodelet::probe::{OP_TRANSPORT, ProbeConfig, ProbeError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const A: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const B: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

fn quick() -> ProbeConfig {
    ProbeConfig {
        duration: Duration::from_millis(300),
        // The duration, not the byte cap, ends the bulk phase (a fast loopback moves 1 GiB in
        // less than 300 ms).
        max_bytes: u64::MAX,
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
    assert_eq!(m.streams, 4, "4 rails");
    assert_eq!(m.transport, "tcp", "no RDMA device here");
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
    assert_eq!(m.bytes, 1_000_000, "the byte cap ends the bulk stream");
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
    // The transport's deadline sits just inside the probe's: which of the two reports first
    // depends on scheduling; either way the probe ends within its deadline.
    assert!(
        matches!(
            err,
            ProbeError::Timeout { .. } | ProbeError::Transport { .. }
        ),
        "{err}"
    );
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
async fn the_server_refuses_strangers_and_reports_failed_sessions() {
    let server = ProbeServer::new(0);
    server.serve_on(&[A]).await;
    let at = SocketAddr::new(A, server.port());

    // An unknown op byte: closed without an answer.
    let mut s = TcpStream::connect(at).await.expect("connect");
    s.write_all(b"X").await.expect("op");
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest).await;
    assert!(rest.is_empty());

    // A malformed request (0 rails): closed without an answer.
    let mut s = TcpStream::connect(at).await.expect("connect");
    let mut bad = Request {
        rdma: false,
        coordinator_port: 9,
        rails: 1,
        warmup: 0,
        round_trips: 1,
        timeout_ms: 1000,
    }
    .encode();
    bad[3] = 0;
    s.write_all(&[OP_TRANSPORT]).await.expect("op");
    s.write_all(&bad).await.expect("request");
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest).await;
    assert!(rest.is_empty());

    // A well-formed request whose prober never opens its coordinator: the server's session
    // times out in the bootstrap and says so on the control connection (a failed verdict).
    let dead = std::net::TcpListener::bind((A, 0)).expect("bind");
    let dead_port = dead.local_addr().expect("addr").port();
    drop(dead);
    let mut s = TcpStream::connect(at).await.expect("connect");
    let req = Request {
        rdma: false,
        coordinator_port: dead_port,
        rails: 1,
        warmup: 0,
        round_trips: 1,
        timeout_ms: 1000,
    };
    s.write_all(&[OP_TRANSPORT]).await.expect("op");
    s.write_all(&req.encode()).await.expect("request");
    let mut code = [0u8; 1];
    let answered = tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut code)).await;
    assert!(matches!(answered, Ok(Ok(_))), "a verdict comes back");
    assert_eq!(code[0], 1, "the session failed");
    let mut len = [0u8; 2];
    s.read_exact(&mut len).await.expect("length");
    let mut msg = vec![0u8; usize::from(u16::from_be_bytes(len))];
    s.read_exact(&mut msg).await.expect("message");
    let msg = String::from_utf8_lossy(&msg);
    assert!(
        msg.contains("bootstrap") || msg.contains("timed out"),
        "{msg}"
    );
}

#[tokio::test]
async fn a_prober_that_dies_mid_probe_fails_the_server_session_not_the_server() {
    let server = ProbeServer::new(0);
    server.serve_on(&[A, B]).await;
    let port = server.port();
    // A probe cut short by its own deadline during the bulk phase...
    let cut = ProbeConfig {
        duration: Duration::from_secs(30),
        max_bytes: u64::MAX,
        timeout: Duration::from_millis(1500),
        ..ProbeConfig::default()
    };
    let err = measure(A, SocketAddr::new(B, port), &cut)
        .await
        .expect_err("the deadline ends it");
    assert!(
        matches!(
            err,
            ProbeError::Timeout { .. } | ProbeError::Transport { .. }
        ),
        "{err}"
    );
    // ...leaves the server able to serve the next one.
    let m = measure(A, SocketAddr::new(B, port), &quick())
        .await
        .expect("the next probe succeeds");
    assert!(m.bandwidth_gbps > 0.0);
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
