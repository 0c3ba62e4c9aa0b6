//! The ring engine behind all-reduce and all-gather, and the chain behind broadcast.
//!
//! A ring job has `n` segments (byte ranges of one registered buffer), `rs` reduce-scatter steps
//! and `ag` all-gather steps. At step `s` rank `r` sends segment `r − σs` to its next rank and
//! receives segment `r − σ(s+1)` from its previous rank (σ = +1 for the forward ring, −1 for the
//! backward one; indices mod n). In reduce-scatter steps the received chunk lands in a scratch
//! slot and is summed into the segment; in all-gather steps it lands in the segment directly.
//!
//! Every segment is cut into the same number of chunks `C`, and (step, chunk) pairs are
//! pipelined: the send of (s, k) waits only for the receive of (s−1, k), so up to `window`
//! chunks per direction are in flight. Two directions run at once over disjoint halves of the
//! data (bidirectional ring, as NCCL does on full-duplex links).
//!
//! A completion with an error, a chunk of the wrong size, or no completion at all for
//! `timeout` ends the job with [`TransportError::Collective`] naming the step and the peer.

use std::time::{Duration, Instant};

use super::super::wire::DType;
use super::super::{BufId, Completion, CompletionKind, Transport, TransportError};
use super::reduce::sum_into;

/// One direction of a ring job.
pub(super) struct RingDir {
    /// Byte range of each segment inside `data`, indexed by segment.
    pub segs: Vec<(usize, usize)>,
    /// +1: send to rank+1, receive from rank−1; −1: the reverse.
    pub sigma: i64,
    /// Chunks per segment.
    pub chunks: usize,
    /// Scratch slots (reduce-scatter receives): `window` slots of `slot_bytes` from `offset`.
    pub scratch_offset: usize,
    /// Bytes per scratch slot.
    pub slot_bytes: usize,
}

/// Shared settings of a ring job.
pub(super) struct RingJob<'a> {
    /// Collective name for errors (`all_reduce`, `all_gather`).
    pub name: &'a str,
    /// The buffer the segments live in.
    pub data: BufId,
    /// The scratch buffer.
    pub scratch: BufId,
    /// Element type for reduction (None: all-gather only).
    pub dtype: Option<DType>,
    /// Element size in bytes (chunk edges fall on elements).
    pub esize: usize,
    /// Reduce-scatter steps (n−1 for all-reduce, 0 for all-gather).
    pub rs: usize,
    /// All-gather steps (n−1).
    pub ag: usize,
    /// Chunks in flight per direction.
    pub window: usize,
    /// No completion for this long is an error.
    pub timeout: Duration,
}

struct DirState {
    send_to: usize,
    recv_from: usize,
    total: usize,
    next_send: usize,
    next_recv: usize,
    sends_inflight: usize,
    recvs_inflight: usize,
    sends_done: usize,
    recvs_done: usize,
    send_done: Vec<bool>,
    recv_done: Vec<bool>,
}

const KIND_RECV: u64 = 1 << 61;

/// Runs a ring job over the directions in `dirs`.
pub(super) fn run(
    t: &mut dyn Transport,
    comps: &mut Vec<Completion>,
    job: &RingJob<'_>,
    dirs: &[RingDir],
) -> Result<(), TransportError> {
    let (n, r) = (t.world(), t.rank());
    if n <= 1 {
        return Ok(());
    }
    let steps = job.rs + job.ag;
    let mut st: Vec<DirState> = dirs
        .iter()
        .map(|d| {
            let total = steps * d.chunks;
            let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
            let (send_to, recv_from) = if d.sigma > 0 {
                (next, prev)
            } else {
                (prev, next)
            };
            DirState {
                send_to,
                recv_from,
                total,
                next_send: 0,
                next_recv: 0,
                sends_inflight: 0,
                recvs_inflight: 0,
                sends_done: 0,
                recvs_done: 0,
                send_done: vec![false; total],
                recv_done: vec![false; total],
            }
        })
        .collect();
    let seg_of = |d: &RingDir, s: usize, recv: bool| -> usize {
        let s = s as i64 + i64::from(recv);
        (r as i64 - d.sigma * s).rem_euclid(n as i64) as usize
    };
    let chunk_range = |d: &RingDir, seg: usize, k: usize| -> (usize, usize) {
        let (lo, hi) = d.segs[seg];
        let elems = (hi - lo) / job.esize;
        let e0 = elems * k / d.chunks;
        let e1 = elems * (k + 1) / d.chunks;
        (lo + e0 * job.esize, lo + e1 * job.esize)
    };
    let describe = |s: usize, k: usize| -> String {
        let phase = if s < job.rs {
            format!("reduce-scatter step {}", s + 1)
        } else {
            format!("all-gather step {}", s - job.rs + 1)
        };
        format!("{}(ring) {phase} chunk {k}", job.name)
    };
    let wrap = |step: String, e: TransportError| TransportError::Collective {
        step,
        source: Box::new(e),
    };
    let mut last_progress = Instant::now();
    loop {
        // Post what is ready, receives first.
        for (di, (d, s)) in dirs.iter().zip(st.iter_mut()).enumerate() {
            while s.next_recv < s.total && s.recvs_inflight < job.window {
                let j = s.next_recv;
                let (step, k) = (j / d.chunks, j % d.chunks);
                let wr = ((di as u64) << 62) | KIND_RECV | j as u64;
                let seg = seg_of(d, step, true);
                let (a, b) = chunk_range(d, seg, k);
                if step < job.rs {
                    if j >= job.window && !s.recv_done[j - job.window] {
                        break;
                    }
                    let slot = d.scratch_offset + (j % job.window) * d.slot_bytes;
                    t.post_recv_at(s.recv_from, job.scratch, slot, d.slot_bytes, wr)
                        .map_err(|e| wrap(describe(step, k), e))?;
                } else {
                    // The region must not still be going out from an earlier send.
                    if step + 1 >= n && !s.send_done[(step + 1 - n) * d.chunks + k] {
                        break;
                    }
                    t.post_recv_at(s.recv_from, job.data, a, b - a, wr)
                        .map_err(|e| wrap(describe(step, k), e))?;
                }
                s.next_recv += 1;
                s.recvs_inflight += 1;
            }
            while s.next_send < s.total && s.sends_inflight < 2 * job.window {
                let i = s.next_send;
                let (step, k) = (i / d.chunks, i % d.chunks);
                if step > 0 && !s.recv_done[(step - 1) * d.chunks + k] {
                    break;
                }
                let (a, b) = chunk_range(d, seg_of(d, step, false), k);
                t.post_send_at(s.send_to, job.data, a, b - a, (di as u64) << 62 | i as u64)
                    .map_err(|e| wrap(describe(step, k), e))?;
                s.next_send += 1;
                s.sends_inflight += 1;
            }
        }
        if st
            .iter()
            .all(|s| s.sends_done == s.total && s.recvs_done == s.total)
        {
            return Ok(());
        }
        comps.clear();
        let wait = job.timeout.saturating_sub(last_progress.elapsed());
        let got = t
            .poll(comps, wait)
            .map_err(|e| wrap(format!("{}(ring) poll", job.name), e))?;
        if got == 0 {
            if last_progress.elapsed() >= job.timeout {
                // Name the first thing we are waiting for.
                for (d, s) in dirs.iter().zip(st.iter()) {
                    if s.recvs_done < s.total {
                        let j = s.recv_done.iter().position(|x| !x).unwrap_or(0);
                        let step = describe(j / d.chunks, j % d.chunks);
                        return Err(TransportError::Timeout {
                            peer: Some(s.recv_from),
                            step: format!("{step} (no progress for {:?})", job.timeout),
                        });
                    }
                    if s.sends_done < s.total {
                        let i = s.send_done.iter().position(|x| !x).unwrap_or(0);
                        let step = describe(i / d.chunks, i % d.chunks);
                        return Err(TransportError::Timeout {
                            peer: Some(s.send_to),
                            step: format!("{step} send (no progress for {:?})", job.timeout),
                        });
                    }
                }
            }
            continue;
        }
        last_progress = Instant::now();
        for c in comps.drain(..) {
            let di = (c.wr_id >> 62) as usize;
            let idx = (c.wr_id & (KIND_RECV - 1)) as usize;
            let (Some(d), Some(s)) = (dirs.get(di), st.get_mut(di)) else {
                continue;
            };
            if idx >= s.total {
                continue;
            }
            let (step, k) = (idx / d.chunks, idx % d.chunks);
            if let Err(e) = c.result {
                return Err(wrap(describe(step, k), e));
            }
            match c.kind {
                CompletionKind::Send => {
                    s.send_done[idx] = true;
                    s.sends_done += 1;
                    s.sends_inflight -= 1;
                }
                CompletionKind::Recv => {
                    let (a, b) = chunk_range(d, seg_of(d, step, true), k);
                    if c.len != b - a {
                        return Err(wrap(
                            describe(step, k),
                            TransportError::Malformed {
                                peer: c.peer,
                                what: format!(
                                    "expected a chunk of {} bytes, received {}",
                                    b - a,
                                    c.len
                                ),
                            },
                        ));
                    }
                    if step < job.rs {
                        let dtype = job.dtype.ok_or_else(|| {
                            TransportError::Invalid("reduce-scatter without a dtype".into())
                        })?;
                        let slot = d.scratch_offset + (idx % job.window) * d.slot_bytes;
                        reduce_from_scratch(t, job.data, (a, b), job.scratch, slot, dtype)?;
                    }
                    s.recv_done[idx] = true;
                    s.recvs_done += 1;
                    s.recvs_inflight -= 1;
                }
            }
        }
    }
}

/// `data[a..b] += scratch[slot..slot + (b − a)]`.
fn reduce_from_scratch(
    t: &mut dyn Transport,
    data: BufId,
    (a, b): (usize, usize),
    scratch: BufId,
    slot: usize,
    dtype: DType,
) -> Result<(), TransportError> {
    if data == scratch {
        return Err(TransportError::Invalid(
            "the data buffer cannot be the scratch buffer".into(),
        ));
    }
    let src = &t.buf(scratch)[slot..slot + (b - a)];
    let (ptr, len) = (src.as_ptr(), src.len());
    let dst = &mut t.buf_mut(data)[a..b];
    // SAFETY: registered buffers never move and live as long as the transport (the Transport
    // contract), and `scratch` and `data` are different registrations, so `src` does not alias
    // `dst`; nothing else touches the scratch slot while its receive has completed.
    let src = unsafe { std::slice::from_raw_parts(ptr, len) };
    sum_into(dst, src, dtype)
}

/// Broadcast along the chain root → root+1 → … → root−1, in pipelined chunks, in place in
/// `data[off..off + len]`.
#[allow(clippy::too_many_arguments)]
pub(super) fn chain_broadcast(
    t: &mut dyn Transport,
    comps: &mut Vec<Completion>,
    data: BufId,
    off: usize,
    len: usize,
    root: usize,
    chunk_bytes: usize,
    window: usize,
    timeout: Duration,
) -> Result<(), TransportError> {
    let (n, r) = (t.world(), t.rank());
    if n <= 1 {
        return Ok(());
    }
    let pos = (r + n - root) % n;
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let chunks = len.div_ceil(chunk_bytes.max(1)).max(1);
    let range = |k: usize| (off + len * k / chunks, off + len * (k + 1) / chunks);
    let sends = if pos + 1 < n { chunks } else { 0 };
    let recvs = if pos > 0 { chunks } else { 0 };
    let (mut ns, mut nr, mut ds, mut dr) = (0usize, 0usize, 0usize, 0usize);
    let mut recv_done = vec![pos == 0; chunks];
    let step = |k: usize| format!("broadcast(root {root}) chunk {k}");
    let wrap = |k: usize, e: TransportError| TransportError::Collective {
        step: step(k),
        source: Box::new(e),
    };
    let mut last = Instant::now();
    loop {
        while nr < recvs && nr - dr < window {
            let (a, b) = range(nr);
            t.post_recv_at(prev, data, a, b - a, KIND_RECV | nr as u64)
                .map_err(|e| wrap(nr, e))?;
            nr += 1;
        }
        while ns < sends && ns - ds < 2 * window && recv_done[ns] {
            let (a, b) = range(ns);
            t.post_send_at(next, data, a, b - a, ns as u64)
                .map_err(|e| wrap(ns, e))?;
            ns += 1;
        }
        if ds == sends && dr == recvs {
            return Ok(());
        }
        comps.clear();
        let got = t
            .poll(comps, timeout.saturating_sub(last.elapsed()))
            .map_err(|e| wrap(dr, e))?;
        if got == 0 {
            if last.elapsed() >= timeout {
                let (peer, k) = if dr < recvs { (prev, dr) } else { (next, ds) };
                return Err(TransportError::Timeout {
                    peer: Some(peer),
                    step: format!("{} (no progress for {timeout:?})", step(k)),
                });
            }
            continue;
        }
        last = Instant::now();
        for c in comps.drain(..) {
            let k = (c.wr_id & (KIND_RECV - 1)) as usize;
            if k >= chunks {
                continue;
            }
            c.result.map_err(|e| wrap(k, e))?;
            if c.kind == CompletionKind::Recv {
                let (a, b) = range(k);
                if c.len != b - a {
                    return Err(wrap(
                        k,
                        TransportError::Malformed {
                            peer: c.peer,
                            what: format!(
                                "expected a chunk of {} bytes, received {}",
                                b - a,
                                c.len
                            ),
                        },
                    ));
                }
                recv_done[k] = true;
                dr += 1;
            } else {
                ds += 1;
            }
        }
    }
}
