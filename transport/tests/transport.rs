//! The data plane over real loopback TCP: ranks as threads, each with its own TcpTransport and
//! Communicator. Collectives for 2–8 ranks, every dtype, odd sizes, against a reference sum;
//! peer death, stalls and malformed headers must end in errors naming the peer, never hangs.

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use half::{bf16, f16};
use tb_transport::collectives::{CollectiveOptions, Communicator};
use tb_transport::select::{Preference, open_endpoints};
use tb_transport::tcp::TcpConfig;
use tb_transport::wire::{DType, FrameHeader, Hello};
use tb_transport::{
    BufId, Capabilities, Completion, Endpoints, Transport, TransportError, bootstrap,
};

mod common;

fn endpoints(rank: usize, world: usize, coord: SocketAddr) -> Endpoints {
    Endpoints {
        rank,
        world,
        peers: vec!["127.0.0.1:0".parse().unwrap(); world],
        coordinator: coord,
        connect_timeout: Duration::from_secs(20),
    }
}

/// Runs `f(rank, transport)` on `world` threads with connected TCP transports.
fn with_ranks<T: Send + 'static>(
    world: usize,
    rails: usize,
    f: impl Fn(usize, Box<dyn Transport>) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let coord = common::coordinator_addr();
    let hs: Vec<_> = (0..world)
        .map(|r| {
            let f = f.clone();
            std::thread::spawn(move || {
                let cfg = TcpConfig {
                    rails,
                    stripe_min: 16 << 10,
                    ..TcpConfig::default()
                };
                let t = open_endpoints(&endpoints(r, world, coord), Preference::Tcp, cfg)
                    .expect("transport opens");
                f(r, t)
            })
        })
        .collect();
    hs.into_iter()
        .map(|h| h.join().expect("rank thread"))
        .collect()
}

fn value(rank: usize, i: usize) -> f32 {
    ((rank * 7 + i * 3) % 13) as f32 - 6.0
}

fn encode(dtype: DType, xs: impl Iterator<Item = f32>) -> Vec<u8> {
    match dtype {
        DType::F32 => xs.flat_map(|x| x.to_le_bytes()).collect(),
        DType::F16 => xs.flat_map(|x| f16::from_f32(x).to_le_bytes()).collect(),
        DType::BF16 => xs.flat_map(|x| bf16::from_f32(x).to_le_bytes()).collect(),
        DType::U8 => xs.map(|x| x as u8).collect(),
    }
}

/// `count` elements of a sequence with period 13 (`period(j)` for j in 0..13), encoded: built by
/// repeating one encoded period, which keeps debug-build tests fast at a million elements.
fn periodic(dtype: DType, count: usize, period: impl Fn(usize) -> f32) -> Vec<u8> {
    let one = encode(dtype, (0..13).map(period));
    let es = dtype.size();
    one.iter().copied().cycle().take(count * es).collect()
}

fn opts() -> CollectiveOptions {
    CollectiveOptions {
        timeout: Duration::from_secs(20),
        chunk_bytes: 64 << 10,
        window: 3,
        bidirectional_min: 4 << 10,
    }
}

/// All-reduce, all-gather, broadcast, barrier and tensors for one world size.
fn collectives_for(world: usize, rails: usize, sizes: &'static [usize]) {
    let results = with_ranks(world, rails, move |rank, t| {
        let mut c = Communicator::new(t, opts());
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for &count in sizes {
                let mut data = periodic(dtype, count, |i| value(rank, i));
                c.all_reduce(&mut data, dtype)
                    .unwrap_or_else(|e| panic!("rank {rank} {dtype:?} {count}: {e}"));
                let want = periodic(dtype, count, |i| (0..world).map(|r| value(r, i)).sum());
                assert!(
                    data == want,
                    "all_reduce {dtype:?} count {count} world {world}: rank {rank} wrong at element {:?}",
                    data.iter()
                        .zip(&want)
                        .position(|(a, b)| a != b)
                        .map(|p| p / dtype.size())
                );
            }
        }
        // All-gather and broadcast of odd byte counts.
        for &len in &[1usize, 7, 1023, 300_001] {
            let mine: Vec<u8> = (0..len).map(|i| (rank * 31 + i) as u8).collect();
            let all = c.all_gather(&mine).unwrap();
            for r in 0..world {
                let want: Vec<u8> = (0..len).map(|i| (r * 31 + i) as u8).collect();
                assert_eq!(
                    &all[r * len..(r + 1) * len],
                    &want[..],
                    "all_gather len {len}"
                );
            }
            let root = len % world;
            let mut b: Vec<u8> = if rank == root {
                (0..len).map(|i| (i * 13 + 5) as u8).collect()
            } else {
                vec![0; len]
            };
            c.broadcast(&mut b, root).unwrap();
            assert!(
                b.iter().enumerate().all(|(i, x)| *x == (i * 13 + 5) as u8),
                "broadcast {len}"
            );
        }
        c.barrier().unwrap();
        // A tensor around the ring.
        let next = (rank + 1) % world;
        let prev = (rank + world - 1) % world;
        let payload = encode(DType::BF16, (0..6).map(|i| (rank * 10 + i) as f32));
        c.send_tensor(next, DType::BF16, &[2, 3], &payload).unwrap();
        let (h, p) = c.recv_tensor(prev, 1 << 10).unwrap();
        assert_eq!((h.dtype, h.shape.clone()), (DType::BF16, vec![2, 3]));
        assert_eq!(
            p,
            encode(DType::BF16, (0..6).map(|i| (prev * 10 + i) as f32))
        );
        c.barrier().unwrap();
        rank
    });
    assert_eq!(results, (0..world).collect::<Vec<_>>());
}

const ODD: &[usize] = &[1, 7, 1023, (1 << 20) + 3];
const SMALL: &[usize] = &[1, 7, 1023, 70_001];

#[test]
fn collectives_2_ranks() {
    collectives_for(2, 1, ODD);
}

#[test]
fn collectives_3_ranks_two_rails() {
    collectives_for(3, 2, ODD);
}

#[test]
fn collectives_4_5_ranks() {
    collectives_for(4, 1, SMALL);
    collectives_for(5, 1, SMALL);
}

#[test]
fn collectives_8_ranks() {
    collectives_for(8, 1, ODD);
}

/// A transport that "dies" (drops its sockets) after `sends_left` sends.
struct Dying {
    inner: Option<Box<dyn Transport>>,
    rank: usize,
    world: usize,
    caps: Capabilities,
    sends_left: usize,
    bufs: Vec<Vec<u8>>,
}

impl Dying {
    fn dead(&self) -> TransportError {
        TransportError::Unsupported(format!("rank {} is dead", self.rank))
    }
}

impl Transport for Dying {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.world
    }
    fn capabilities(&self) -> Capabilities {
        self.caps.clone()
    }
    fn register(&mut self, len: usize) -> Result<BufId, TransportError> {
        match &mut self.inner {
            Some(t) => t.register(len),
            None => Err(self.dead()),
        }
    }
    fn buf(&self, id: BufId) -> &[u8] {
        match &self.inner {
            Some(t) => t.buf(id),
            None => &self.bufs[0],
        }
    }
    fn buf_mut(&mut self, id: BufId) -> &mut [u8] {
        match &mut self.inner {
            Some(t) => t.buf_mut(id),
            None => &mut self.bufs[0],
        }
    }
    fn post_send(
        &mut self,
        p: usize,
        id: BufId,
        len: usize,
        wr: u64,
    ) -> Result<(), TransportError> {
        self.post_send_at(p, id, 0, len, wr)
    }
    fn post_recv(&mut self, p: usize, id: BufId, wr: u64) -> Result<(), TransportError> {
        match &mut self.inner {
            Some(t) => t.post_recv(p, id, wr),
            None => Err(self.dead()),
        }
    }
    fn post_send_at(
        &mut self,
        p: usize,
        id: BufId,
        off: usize,
        len: usize,
        wr: u64,
    ) -> Result<(), TransportError> {
        if self.sends_left == 0 {
            self.inner = None; // closes every socket, as a killed process would
        }
        self.sends_left = self.sends_left.saturating_sub(1);
        match &mut self.inner {
            Some(t) => t.post_send_at(p, id, off, len, wr),
            None => Err(self.dead()),
        }
    }
    fn post_recv_at(
        &mut self,
        p: usize,
        id: BufId,
        off: usize,
        max: usize,
        wr: u64,
    ) -> Result<(), TransportError> {
        match &mut self.inner {
            Some(t) => t.post_recv_at(p, id, off, max, wr),
            None => Err(self.dead()),
        }
    }
    fn poll(
        &mut self,
        out: &mut Vec<Completion>,
        timeout: Duration,
    ) -> Result<usize, TransportError> {
        match &mut self.inner {
            Some(t) => t.poll(out, timeout),
            None => Err(self.dead()),
        }
    }
}

#[test]
fn peer_death_mid_all_reduce_fails_every_rank_in_time() {
    let world = 4;
    let timeout = Duration::from_secs(5);
    let res = with_ranks(world, 1, move |rank, t| {
        let t: Box<dyn Transport> = if rank == 2 {
            let caps = t.capabilities();
            Box::new(Dying {
                inner: Some(t),
                rank,
                world,
                caps,
                sends_left: 5,
                bufs: vec![Vec::new()],
            })
        } else {
            t
        };
        let mut c = Communicator::new(
            t,
            CollectiveOptions {
                timeout,
                chunk_bytes: 16 << 10,
                ..opts()
            },
        );
        let mut data = encode(DType::F32, (0..200_000).map(|i| value(rank, i)));
        let start = Instant::now();
        let r = c.all_reduce(&mut data, DType::F32);
        let took = start.elapsed();
        // A failed communicator refuses further work rather than hanging.
        let again = c.barrier();
        (rank, r.map_err(|e| e.to_string()), took, again.is_err())
    });
    for (rank, r, took, again) in res {
        let e = r.expect_err("every rank must fail");
        assert!(took < timeout * 2, "rank {rank} took {took:?}: {e}");
        assert!(again, "rank {rank}: the communicator must stay failed");
        if rank != 2 {
            assert!(e.contains("rank "), "rank {rank}: error names no peer: {e}");
            assert!(
                e.contains("all_reduce(ring)"),
                "rank {rank}: error names no step: {e}"
            );
        }
    }
}

#[test]
fn stalled_peer_times_out_naming_it() {
    let world = 3;
    let res = with_ranks(world, 1, move |rank, t| {
        let mut c = Communicator::new(
            t,
            CollectiveOptions {
                timeout: Duration::from_millis(700),
                ..opts()
            },
        );
        if rank == 1 {
            std::thread::sleep(Duration::from_millis(2500));
            return (rank, Ok(()), Duration::ZERO);
        }
        let start = Instant::now();
        let mut data = encode(DType::F32, (0..1000).map(|i| value(rank, i)));
        let r = c
            .all_reduce(&mut data, DType::F32)
            .map_err(|e| e.to_string());
        (rank, r, start.elapsed())
    });
    // Rank 2 waits on rank 1 and times out naming it; rank 0 either times out too or sees
    // rank 2 leave after its failure: an error naming a peer, in time, in both cases.
    let mut named_staller = false;
    for (rank, r, took) in res {
        if rank == 1 {
            continue;
        }
        let e = r.expect_err("must fail");
        assert!(took < Duration::from_secs(4), "rank {rank} took {took:?}");
        assert!(e.contains("rank "), "rank {rank}: {e}");
        named_staller |= e.contains("timed out waiting for rank 1");
    }
    assert!(named_staller, "no rank named the stalled rank 1");
}

/// Joins as rank 1 of 2 by hand and returns the raw data socket to rank 0.
fn fake_rank1(coord: SocketAddr) -> TcpStream {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let me = l.local_addr().unwrap().to_string();
    let all = bootstrap::all_gather(coord, 1, 2, me.as_bytes(), Duration::from_secs(10)).unwrap();
    let addr: SocketAddr = std::str::from_utf8(&all[0]).unwrap().parse().unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    let hello = Hello {
        rank: 1,
        world: 2,
        rail: 0,
        rails: 1,
    };
    s.write_all(&hello.encode()).unwrap();
    s
}

#[test]
fn malformed_frame_header_names_the_peer() {
    let coord = common::coordinator_addr();
    let h = std::thread::spawn(move || {
        let mut s = fake_rank1(coord);
        let mut bad = FrameHeader {
            seq: 0,
            offset: 0,
            stripe_len: 4,
            total_len: 4,
        }
        .encode();
        bad[0..4].copy_from_slice(b"EVIL");
        s.write_all(&bad).unwrap();
        s.write_all(&[1, 2, 3, 4]).unwrap();
        std::thread::sleep(Duration::from_millis(500));
    });
    let mut t = open_endpoints(
        &endpoints(0, 2, coord),
        Preference::Tcp,
        TcpConfig::default(),
    )
    .unwrap();
    let b = t.register(64).unwrap();
    t.post_recv(1, b, 9).unwrap();
    let mut out = Vec::new();
    let end = Instant::now() + Duration::from_secs(10);
    while out.is_empty() && Instant::now() < end {
        t.poll(&mut out, Duration::from_millis(200)).unwrap();
    }
    let e = out[0].result.as_ref().expect_err("malformed");
    assert!(
        matches!(e, TransportError::Malformed { peer: 1, .. }),
        "expected Malformed from rank 1, got {e}"
    );
    assert!(e.to_string().contains("magic"), "{e}");
    h.join().unwrap();
}

#[test]
fn malformed_tensor_header_names_the_peer() {
    let coord = common::coordinator_addr();
    let h = std::thread::spawn(move || {
        let mut s = fake_rank1(coord);
        // A well-framed message whose tensor header claims 2×3 f32 but carries 8 bytes.
        let mut msg = vec![0u8; 24 + 8];
        msg[0..4].copy_from_slice(b"TBT1");
        msg[4] = DType::F32 as u8;
        msg[5] = 2;
        msg[8..16].copy_from_slice(&2u64.to_le_bytes());
        msg[16..24].copy_from_slice(&3u64.to_le_bytes());
        let fh = FrameHeader {
            seq: 0,
            offset: 0,
            stripe_len: msg.len() as u64,
            total_len: msg.len() as u64,
        };
        s.write_all(&fh.encode()).unwrap();
        s.write_all(&msg).unwrap();
        std::thread::sleep(Duration::from_millis(500));
    });
    let t = open_endpoints(
        &endpoints(0, 2, coord),
        Preference::Tcp,
        TcpConfig::default(),
    )
    .unwrap();
    let mut c = Communicator::new(t, opts());
    let e = c.recv_tensor(1, 1 << 10).expect_err("malformed");
    assert_eq!(e.peer(), Some(1), "{e}");
    let s = e.to_string();
    assert!(
        s.contains("recv_tensor from rank 1") && s.contains("needs 24"),
        "{s}"
    );
    h.join().unwrap();
}
