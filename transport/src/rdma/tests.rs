//! The RDMA transport against the in-process verbs simulation: ranks are threads, queue-pair
//! info goes through the real TCP bootstrap on loopback.

use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use super::*;
use crate::bootstrap;
use crate::verbs_sim::{Fabric, SimQpState, SimVerbs};
use crate::{BufId, Completion, CompletionKind, Transport, TransportError};

fn device(rank: usize) -> String {
    format!("r{rank}")
}

fn devices(rank: usize, world: usize) -> Vec<Option<String>> {
    (0..world)
        .map(|p| (p != rank).then(|| device(rank)))
        .collect()
}

fn fabric(world: usize) -> Arc<Fabric> {
    let names: Vec<String> = (0..world).map(device).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    Fabric::new(&refs)
}

fn small_cfg() -> RdmaConfig {
    RdmaConfig {
        connect_timeout: Duration::from_secs(20),
        progress_timeout: Duration::from_secs(60),
        ..RdmaConfig::default()
    }
}

/// Connects `world` ranks on `fabric` (each thread gets its transport) and runs `body` on each.
/// A rank keeps its transport open until every rank's body has returned: a rank that closed
/// its queue pairs as soon as it had its own messages would fail the credits its peers still
/// return to it (RC: retry exceeded), as a process that leaves a collective early would.
fn run<R: Send>(
    fabric: &Arc<Fabric>,
    world: usize,
    cfg: impl Fn(usize) -> RdmaConfig + Sync,
    body: impl Fn(usize, &mut RdmaTransport<SimVerbs>) -> R + Sync,
) -> Vec<R> {
    let done = Barrier::new(world);
    run_owned(fabric, world, cfg, |rank, mut t| {
        let out = after_all(&done, || body(rank, &mut t));
        drop(t);
        out
    })
}

/// Runs `f`, then waits at `done` even if `f` panicked (so the other ranks do not wait for
/// this one forever), then returns what `f` returned or goes on panicking.
fn after_all<R>(done: &Barrier, f: impl FnOnce() -> R) -> R {
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    done.wait();
    out.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// [`run`] with each body owning its transport (and closing it when it likes).
fn run_owned<R: Send>(
    fabric: &Arc<Fabric>,
    world: usize,
    cfg: impl Fn(usize) -> RdmaConfig + Sync,
    body: impl Fn(usize, RdmaTransport<SimVerbs>) -> R + Sync,
) -> Vec<R> {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let listener = listener.try_clone().expect("clone");
                let (fabric, cfg, body) = (fabric, &cfg, &body);
                s.spawn(move || {
                    let mut exchange = |blob: &[u8]| {
                        if rank == 0 {
                            let l = listener.try_clone().map_err(|e| {
                                TransportError::Bootstrap(format!("clone listener: {e}"))
                            })?;
                            bootstrap::serve(l, world, blob, Duration::from_secs(20))
                        } else {
                            bootstrap::all_gather(addr, rank, world, blob, Duration::from_secs(20))
                        }
                    };
                    let t = RdmaTransport::connect(
                        fabric.verbs(),
                        rank,
                        world,
                        &devices(rank, world),
                        cfg(rank),
                        &mut exchange,
                    )
                    .unwrap_or_else(|e| panic!("rank {rank} connect: {e}"));
                    body(rank, t)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    })
}

/// Polls until `n` completions have arrived (panics after `limit`).
fn wait(t: &mut dyn Transport, n: usize, limit: Duration) -> Vec<Completion> {
    let deadline = Instant::now() + limit;
    let mut out = Vec::new();
    while out.len() < n {
        assert!(
            Instant::now() < deadline,
            "rank {}: {} of {n} completions after {limit:?}: {out:?}",
            t.rank(),
            out.len()
        );
        t.poll(&mut out, Duration::from_millis(50)).expect("poll");
    }
    out
}

/// Deterministic bytes that differ per (src, dst, message) and never repeat with the chunk size.
fn pattern(src: usize, dst: usize, idx: usize, len: usize) -> Vec<u8> {
    let mut x = ((src as u64 + 1) * 0x9e37_79b9) ^ ((dst as u64 + 1) * 0x85eb_ca6b) ^ idx as u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn ok(c: &Completion) {
    if let Err(e) = &c.result {
        panic!("completion {} for rank {} failed: {e}", c.wr_id, c.peer);
    }
}

#[test]
fn messages_of_1_byte_to_4_mib_arrive_in_order_and_intact_between_3_ranks() {
    const SIZES: [usize; 11] = [
        0,
        1,
        7,
        4071,
        4072,
        4073,
        8144,
        65_539,
        300_000,
        1 << 20,
        4 << 20,
    ];
    let world = 3;
    let fabric = fabric(world);
    run(
        &fabric,
        world,
        |_| small_cfg(),
        |rank, t| {
            let peers: Vec<usize> = (0..world).filter(|p| *p != rank).collect();
            let mut recv_bufs = Vec::new();
            // Half of the receives are posted before the sends, half after: arriving chunks wait
            // (held) for their receive.
            for &p in &peers {
                for (i, &len) in SIZES.iter().enumerate().take(5) {
                    let b = t.register(len + 16).expect("register");
                    t.post_recv(p, b, (p * 100 + i) as u64).expect("post_recv");
                    recv_bufs.push((p, i, b));
                }
            }
            for &p in &peers {
                for (i, &len) in SIZES.iter().enumerate() {
                    // Send from the middle of a buffer (post_send_at).
                    let b = t.register(len + 8).expect("register");
                    t.buf_mut(b)[8..].copy_from_slice(&pattern(rank, p, i, len));
                    t.post_send_at(p, b, 8, len, (1000 + p * 100 + i) as u64)
                        .expect("post_send");
                }
            }
            for &p in &peers {
                for (i, &len) in SIZES.iter().enumerate().skip(5) {
                    let b = t.register(len + 16).expect("register");
                    t.post_recv_at(p, b, 16, len, (p * 100 + i) as u64)
                        .expect("post_recv_at");
                    recv_bufs.push((p, i, b));
                }
            }
            let done = wait(t, 2 * peers.len() * SIZES.len(), Duration::from_secs(120));
            let mut next = vec![0usize; world];
            for c in &done {
                ok(c);
                match c.kind {
                    CompletionKind::Send => {
                        assert_eq!(c.len, SIZES[c.wr_id as usize % 100]);
                    }
                    CompletionKind::Recv => {
                        let i = c.wr_id as usize % 100;
                        assert_eq!(c.wr_id as usize / 100, c.peer);
                        assert_eq!(
                            i, next[c.peer],
                            "receives from rank {} out of order",
                            c.peer
                        );
                        next[c.peer] += 1;
                        assert_eq!(c.len, SIZES[i]);
                    }
                }
            }
            for (p, i, b) in recv_bufs {
                let at = if i < 5 { 0 } else { 16 };
                let got = &t.buf(b)[at..at + SIZES[i]];
                assert!(
                    got == pattern(p, rank, i, SIZES[i]).as_slice(),
                    "rank {rank}: message {i} from rank {p} corrupted"
                );
            }
            t.stats()
        },
    );
    let st = fabric.stats();
    assert_eq!(st.dropped_no_recv, 0, "{st:?}");
    assert!(st.delivered > 3000, "{st:?}");
}

#[test]
fn a_fast_sender_never_overruns_a_slow_receiver() {
    let fabric = fabric(2);
    let cfg = |_| RdmaConfig {
        recv_depth: 4,
        send_depth: 4,
        ..small_cfg()
    };
    const N: usize = 120;
    const LEN: usize = 10_000; // 3 chunks of 4 KiB
    let stats = run(&fabric, 2, cfg, |rank, t| {
        if rank == 0 {
            let bufs: Vec<BufId> = (0..N)
                .map(|i| {
                    let b = t.register(LEN).expect("register");
                    t.buf_mut(b).copy_from_slice(&pattern(0, 1, i, LEN));
                    b
                })
                .collect();
            for (i, b) in bufs.iter().enumerate() {
                t.post_send(1, *b, LEN, i as u64).expect("post_send");
            }
            for c in wait(t, N, Duration::from_secs(60)) {
                ok(&c);
            }
        } else {
            std::thread::sleep(Duration::from_millis(100));
            let b = t.register(LEN).expect("register");
            for i in 0..N {
                t.post_recv(0, b, i as u64).expect("post_recv");
                let c = wait(t, 1, Duration::from_secs(30));
                ok(&c[0]);
                assert_eq!(c[0].wr_id, i as u64);
                assert!(
                    t.buf(b) == pattern(0, 1, i, LEN).as_slice(),
                    "message {i} corrupted"
                );
                if i % 10 == 0 {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
        t.stats()
    });
    let sim = fabric.stats();
    assert_eq!(sim.dropped_no_recv, 0, "UC would have dropped: {sim:?}");
    assert!(sim.max_posted_recvs <= 4, "{sim:?}");
    assert!(
        stats[0].credit_stalls > 0,
        "the sender never waited: {:?}",
        stats[0]
    );
    assert!(stats[0].max_outstanding <= 4, "{:?}", stats[0]);
    assert!(stats[1].credit_messages > 0, "{:?}", stats[1]);
    assert_eq!(stats[0].chunks_sent, (N * 3) as u64);
}

#[test]
fn a_message_longer_than_the_receive_fails_that_receive_only() {
    let fabric = fabric(2);
    run(
        &fabric,
        2,
        |_| small_cfg(),
        |rank, t| {
            if rank == 0 {
                let big = t.register(10_000).expect("register");
                let small = t.register(5).expect("register");
                t.buf_mut(small).copy_from_slice(b"hello");
                t.post_send(1, big, 10_000, 1).expect("send");
                t.post_send(1, small, 5, 2).expect("send");
                for c in wait(t, 2, Duration::from_secs(20)) {
                    ok(&c);
                }
            } else {
                let b = t.register(100).expect("register");
                let b2 = t.register(5).expect("register");
                t.post_recv_at(0, b, 0, 100, 1).expect("recv");
                t.post_recv(0, b2, 2).expect("recv");
                let done = wait(t, 2, Duration::from_secs(20));
                let err = done[0].result.as_ref().map(|_| ()).unwrap_err();
                assert_eq!(err.peer(), Some(0));
                assert!(matches!(err, TransportError::Malformed { .. }), "{err}");
                assert!(err.to_string().contains("10000 bytes"), "{err}");
                ok(&done[1]);
                assert_eq!(t.buf(b2), b"hello");
            }
        },
    );
}

#[test]
fn cq_overflow_fails_every_pending_operation_naming_the_peer() {
    let fabric = fabric(2);
    // The device gives 3-entry CQs whatever the transport asks for.
    fabric.cap_cq_depth(Some(3));
    let cfg = |_| RdmaConfig {
        progress_timeout: Duration::from_millis(500),
        ..small_cfg()
    };
    run(&fabric, 2, cfg, |rank, t| {
        let peer = 1 - rank;
        let b = t.register(64 * 1024).expect("register");
        if rank == 0 {
            t.post_send(peer, b, 64 * 1024, 1).expect("send");
            t.post_send(peer, b, 10, 2).expect("send");
        } else {
            t.post_recv(peer, b, 1).expect("recv");
        }
        let expect = if rank == 0 { 2 } else { 1 };
        let done = wait(t, expect, Duration::from_secs(20));
        for c in &done {
            let err = c.result.as_ref().map(|_| ()).unwrap_err();
            assert_eq!(err.peer(), Some(peer), "{err}");
            assert!(err.to_string().contains(&format!("rank {peer}")), "{err}");
        }
        if rank == 0 {
            let err = done[0].result.as_ref().map(|_| ()).unwrap_err().to_string();
            assert!(err.contains("overflow"), "{err}");
        }
        // Later posts fail at once.
        let err = t.post_send(peer, b, 1, 9).unwrap_err();
        assert_eq!(err.peer(), Some(peer));
    });
    assert!(fabric.stats().cq_overflows >= 1);
}

#[test]
fn killed_qp_fails_its_work_and_the_peer_times_out_naming_it() {
    let fabric = fabric(2);
    let cfg = |_| RdmaConfig {
        progress_timeout: Duration::from_millis(400),
        ..small_cfg()
    };
    let barrier = Barrier::new(2);
    run(&fabric, 2, cfg, |rank, t| {
        let b = t.register(100).expect("register");
        if rank == 0 {
            let b2 = t.register(100).expect("register");
            t.post_recv(1, b, 1).expect("recv");
            t.post_recv(1, b2, 2).expect("recv");
            let qpn = t.local_qpn(1).expect("qp to rank 1");
            fabric.kill_qp(qpn);
            assert_eq!(fabric.qp_state(qpn), Some(SimQpState::Error));
            barrier.wait();
            let done = wait(t, 2, Duration::from_secs(10));
            for c in &done {
                let err = c.result.as_ref().map(|_| ()).unwrap_err();
                assert_eq!(err.peer(), Some(1));
                assert!(err.to_string().contains("flushed"), "{err}");
            }
            let err = t.post_recv(1, b, 3).unwrap_err();
            assert_eq!(err.peer(), Some(1));
        } else {
            barrier.wait();
            let b2 = t.register(100).expect("register");
            t.post_recv(0, b, 1).expect("recv");
            t.post_send(0, b2, 10, 2).expect("send");
            let start = Instant::now();
            let done = wait(t, 2, Duration::from_secs(10));
            let send = done
                .iter()
                .find(|c| c.kind == CompletionKind::Send)
                .expect("send");
            ok(send); // UC: the sender cannot tell
            let recv = done
                .iter()
                .find(|c| c.kind == CompletionKind::Recv)
                .expect("recv");
            let err = recv.result.as_ref().map(|_| ()).unwrap_err();
            assert!(
                matches!(err, TransportError::Timeout { peer: Some(0), .. }),
                "{err}"
            );
            assert!(err.to_string().contains("rank 0"), "{err}");
            assert!(start.elapsed() >= Duration::from_millis(300));
        }
    });
}

#[test]
fn a_send_lost_on_the_wire_is_detected_by_its_sequence_number() {
    let fabric = fabric(2);
    let barrier = Barrier::new(2);
    run(
        &fabric,
        2,
        |_| small_cfg(),
        |rank, t| {
            let b = t.register(100).expect("register");
            if rank == 0 {
                fabric.drop_next_sends(t.local_qpn(1).expect("qp"), 1);
                barrier.wait();
                t.post_send(1, b, 100, 1).expect("send");
                t.post_send(1, b, 100, 2).expect("send");
                for c in wait(t, 2, Duration::from_secs(10)) {
                    ok(&c);
                }
            } else {
                let b2 = t.register(100).expect("register");
                t.post_recv(0, b, 1).expect("recv");
                t.post_recv(0, b2, 2).expect("recv");
                barrier.wait();
                for c in wait(t, 2, Duration::from_secs(10)) {
                    let err = c.result.as_ref().map(|_| ()).unwrap_err();
                    assert_eq!(err.peer(), Some(0));
                    assert!(err.to_string().contains("lost 1 SEND"), "{err}");
                }
            }
        },
    );
}

#[test]
fn delayed_links_keep_order_and_rc_works_where_uc_is_refused() {
    let fabric = fabric(2);
    fabric.refuse_uc(true);
    let sizes = [5usize, 70_000, 1, 9000, 0, 123_456];
    run(
        &fabric,
        2,
        |_| small_cfg(),
        |rank, t| {
            let peer = 1 - rank;
            fabric.set_delay(t.local_qpn(peer).expect("qp"), Duration::from_millis(2));
            for (i, &len) in sizes.iter().enumerate() {
                let b = t.register(len).expect("register");
                t.buf_mut(b).copy_from_slice(&pattern(rank, peer, i, len));
                t.post_send(peer, b, len, i as u64).expect("send");
            }
            let bufs: Vec<BufId> = sizes
                .iter()
                .enumerate()
                .map(|(i, &len)| {
                    let b = t.register(len).expect("register");
                    t.post_recv(peer, b, 100 + i as u64).expect("recv");
                    b
                })
                .collect();
            let done = wait(t, 2 * sizes.len(), Duration::from_secs(30));
            let recvs: Vec<u64> = done
                .iter()
                .inspect(|c| ok(c))
                .filter(|c| c.kind == CompletionKind::Recv)
                .map(|c| c.wr_id)
                .collect();
            assert_eq!(recvs, (100..106).collect::<Vec<u64>>());
            for (i, b) in bufs.iter().enumerate() {
                assert!(t.buf(*b) == pattern(peer, rank, i, sizes[i]).as_slice());
            }
        },
    );
}

#[test]
fn bootstrap_exchanges_queue_pair_info_through_the_coordinator() {
    let world = 3;
    let fabric = fabric(world);
    let coordinator: SocketAddr = {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let barrier = Barrier::new(world);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let (fabric, barrier) = (&fabric, &barrier);
                s.spawn(move || {
                    let mut t = open_with(
                        fabric.verbs(),
                        rank,
                        world,
                        &devices(rank, world),
                        coordinator,
                        small_cfg(),
                    )
                    .unwrap_or_else(|e| panic!("rank {rank}: {e}"));
                    // A ring of one message each proves the links are wired as exchanged.
                    let b = t.register(4).expect("register");
                    let next = (rank + 1) % world;
                    let prev = (rank + world - 1) % world;
                    t.buf_mut(b).copy_from_slice(&(rank as u32).to_le_bytes());
                    t.post_send(next, b, 4, 0).expect("send");
                    let r = t.register(4).expect("register");
                    t.post_recv(prev, r, 1).expect("recv");
                    for c in wait(&mut t, 2, Duration::from_secs(20)) {
                        ok(&c);
                    }
                    assert_eq!(t.buf(r), (prev as u32).to_le_bytes());
                    assert_eq!(t.device(next), Some(device(rank).as_str()));
                    assert_eq!(t.local_qpn(rank), None, "no queue pair to itself");
                    for peer in (0..world).filter(|p| *p != rank) {
                        let qpn = t.local_qpn(peer).expect("qp");
                        assert_eq!(fabric.qp_between(&device(rank), &device(peer)), Some(qpn));
                        assert_eq!(fabric.qp_state(qpn), Some(SimQpState::Rts));
                    }
                    barrier.wait(); // keep every queue pair alive until all have looked
                })
            })
            .collect();
        for h in handles {
            h.join().expect("rank");
        }
    });
}

#[test]
fn set_up_errors_are_clear() {
    let cfg = RdmaConfig {
        chunk: 1000,
        ..RdmaConfig::default()
    };
    assert!(
        cfg.validate()
            .unwrap_err()
            .to_string()
            .contains("chunk 1000")
    );
    let cfg = RdmaConfig {
        cq_depth: 10,
        ..RdmaConfig::default()
    };
    assert!(cfg.validate().unwrap_err().to_string().contains("overflow"));

    // A missing device fails before any network exchange, as unsupported (TCP fallback).
    let fabric = fabric(2);
    let mut exchange =
        |_: &[u8]| -> Result<Vec<Vec<u8>>, TransportError> { panic!("no exchange expected") };
    let err = RdmaTransport::connect(
        fabric.verbs(),
        0,
        2,
        &[None, Some("rdma_en9".into())],
        RdmaConfig::default(),
        &mut exchange,
    )
    .map(|_| ())
    .unwrap_err();
    assert!(matches!(err, TransportError::Unsupported(_)), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("rank 1") && msg.contains("`rdma_en9`"),
        "{msg}"
    );

    // Bounce-buffer sizes must agree.
    let fabric2 = super::tests::fabric(2);
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|rank| {
                let l = listener.try_clone().expect("clone");
                let fabric2 = &fabric2;
                s.spawn(move || {
                    let mut exchange = |blob: &[u8]| {
                        if rank == 0 {
                            bootstrap::serve(
                                l.try_clone().expect("clone"),
                                2,
                                blob,
                                Duration::from_secs(10),
                            )
                        } else {
                            bootstrap::all_gather(addr, 1, 2, blob, Duration::from_secs(10))
                        }
                    };
                    let cfg = RdmaConfig {
                        chunk: 4096 << rank,
                        ..small_cfg()
                    };
                    RdmaTransport::connect(
                        fabric2.verbs(),
                        rank,
                        2,
                        &devices(rank, 2),
                        cfg,
                        &mut exchange,
                    )
                    .map(|_| ())
                    .unwrap_err()
                    .to_string()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank")).collect()
    });
    assert!(errs[0].contains("rank 1 uses 8192-byte"), "{}", errs[0]);
    assert!(errs[1].contains("rank 0 uses 4096-byte"), "{}", errs[1]);

    assert_eq!(
        parse_devices(r#"[null, "rdma_en2"]"#, 2).expect("parse"),
        vec![None, Some("rdma_en2".to_string())]
    );
    assert!(parse_devices("[null]", 2).is_err());
    assert!(parse_devices("rdma_en2", 2).is_err());
}

/// On this machine (no RDMA device, no rxe/siw) the real provider must fail cleanly so that
/// the selection falls back to TCP.
#[cfg(all(feature = "rdma", target_os = "linux"))]
#[test]
fn open_without_a_device_fails_with_a_clear_error() {
    use super::ibverbs::IbVerbs;
    let err = IbVerbs.open("mlx5_0").map(|_| ()).unwrap_err().to_string();
    assert!(
        err.contains("no RDMA device") || err.contains("not found"),
        "{err}"
    );
    let coordinator: SocketAddr = "127.0.0.1:1".parse().expect("addr");
    let err = open_devices(
        0,
        2,
        &[None, Some("mlx5_0".into())],
        coordinator,
        Duration::from_secs(1),
    )
    .map(|_| ())
    .unwrap_err();
    assert!(matches!(err, TransportError::Unsupported(_)), "{err}");
    assert!(err.to_string().contains("rank 1"), "{err}");
    let ep = crate::Endpoints {
        rank: 0,
        world: 2,
        peers: vec![coordinator, coordinator],
        coordinator,
        connect_timeout: Duration::from_secs(1),
    };
    if std::env::var_os(DEVICES_ENV).is_none() {
        let err = local_ready(&ep).map(|_| ()).unwrap_err();
        assert!(matches!(err, TransportError::Unsupported(_)), "{err}");
        assert!(err.to_string().contains("no RDMA device"), "{err}");
        let mut exchange = coordinator_exchange(coordinator, 0, 2, Duration::from_secs(1));
        let err = open(&ep, &mut exchange).map(|_| ()).unwrap_err();
        assert!(matches!(err, TransportError::Unsupported(_)), "{err}");
        assert!(err.to_string().contains("no RDMA device"), "{err}");
    }
}

/// The collectives (written once over `dyn Transport`) run unchanged on the RDMA transport.
#[test]
fn collectives_run_over_the_rdma_transport() {
    use crate::collectives::{CollectiveOptions, Communicator};
    use crate::wire::DType;
    let world = 4;
    let fabric = fabric(world);
    let done = Barrier::new(world);
    run_owned(
        &fabric,
        world,
        |_| small_cfg(),
        |rank, t| {
            let mut c = Communicator::new(Box::new(t), CollectiveOptions::default());
            // The communicator (and its transport) closes after every rank is done.
            after_all(&done, || {
                // 1.2 MB of f32: above the bidirectional threshold, several pipeline chunks.
                let n = 300_001;
                let mut data: Vec<u8> = (0..n)
                    .flat_map(|i| ((rank + 1) as f32 * (i % 7) as f32).to_le_bytes())
                    .collect();
                c.all_reduce(&mut data, DType::F32).expect("all_reduce");
                for (i, x) in data.chunks_exact(4).enumerate() {
                    let v = f32::from_le_bytes([x[0], x[1], x[2], x[3]]);
                    assert_eq!(v, 10.0 * (i % 7) as f32, "element {i}");
                }
                let mine = pattern(rank, rank, 0, 10_000);
                let all = c.all_gather(&mine).expect("all_gather");
                for r in 0..world {
                    assert!(all[r * 10_000..(r + 1) * 10_000] == pattern(r, r, 0, 10_000));
                }
                let mut b = if rank == 2 {
                    pattern(2, 9, 9, 70_000)
                } else {
                    vec![0; 70_000]
                };
                c.broadcast(&mut b, 2).expect("broadcast");
                assert!(b == pattern(2, 9, 9, 70_000));
                c.barrier().expect("barrier");
            });
        },
    );
    assert_eq!(fabric.stats().dropped_no_recv, 0);
}
