//! Collectives over any [`Transport`]: ring all-reduce (reduce-scatter + all-gather, both ring
//! directions, pipelined chunks), ring all-gather, chain broadcast, barrier, and point-to-point
//! tensors with dtype and shape on the wire.
//!
//! A [`Communicator`] owns the transport and the scratch and staging buffers it registers. The
//! `*_buf` methods work in place on a registered buffer (no copy besides the transport's); the
//! slice methods copy in and out of a staging buffer. Every collective fails, rather than hangs,
//! when a peer dies, stalls (no progress for [`CollectiveOptions::timeout`]) or sends something
//! malformed: the error names the step and the peer. After a failure the communicator refuses
//! further collectives (the ranks are out of step): open a new transport.

mod reduce;
mod ring;

use std::time::{Duration, Instant};

pub use reduce::sum_into;

use super::wire::{DType, TensorHeader};
use super::{BufId, Completion, CompletionKind, Transport, TransportError};
use ring::{RingDir, RingJob};

/// Tuning and timeouts of the collectives.
#[derive(Debug, Clone)]
pub struct CollectiveOptions {
    /// A collective fails when no work request completes for this long.
    pub timeout: Duration,
    /// Pipeline chunk size in bytes.
    pub chunk_bytes: usize,
    /// Chunks in flight per ring direction.
    pub window: usize,
    /// Use both ring directions for all-reduces of at least this many bytes (3+ ranks).
    pub bidirectional_min: usize,
}

impl Default for CollectiveOptions {
    fn default() -> Self {
        CollectiveOptions {
            timeout: Duration::from_secs(30),
            chunk_bytes: 256 << 10,
            window: 4,
            bidirectional_min: 1 << 20,
        }
    }
}

/// A registered buffer that grows on demand.
#[derive(Debug, Default, Clone, Copy)]
struct Grow {
    id: Option<BufId>,
    len: usize,
}

impl Grow {
    fn ensure(&mut self, t: &mut dyn Transport, len: usize) -> Result<BufId, TransportError> {
        match self.id {
            Some(id) if self.len >= len => Ok(id),
            _ => {
                let len = len.max(self.len * 2).max(64);
                let id = t.register(len)?;
                *self = Grow { id: Some(id), len };
                Ok(id)
            }
        }
    }
}

/// A rank's handle on a group of ranks: the transport plus the collectives' buffers.
pub struct Communicator {
    t: Box<dyn Transport>,
    opts: CollectiveOptions,
    scratch: Grow,
    send_stage: Grow,
    recv_stage: Grow,
    comps: Vec<Completion>,
    broken: Option<TransportError>,
}

impl Communicator {
    /// Wraps an open transport.
    pub fn new(t: Box<dyn Transport>, opts: CollectiveOptions) -> Self {
        Communicator {
            t,
            opts,
            scratch: Grow::default(),
            send_stage: Grow::default(),
            recv_stage: Grow::default(),
            comps: Vec::new(),
            broken: None,
        }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.t.rank()
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.t.world()
    }

    /// The options in force.
    pub fn options(&self) -> &CollectiveOptions {
        &self.opts
    }

    /// Changes the options (e.g. a shorter timeout).
    pub fn set_options(&mut self, opts: CollectiveOptions) {
        self.opts = opts;
    }

    /// The transport underneath (to register buffers and fill them).
    pub fn transport(&mut self) -> &mut dyn Transport {
        self.t.as_mut()
    }

    /// The transport underneath, read-only.
    pub fn transport_ref(&self) -> &dyn Transport {
        self.t.as_ref()
    }

    fn guard<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, TransportError>,
    ) -> Result<T, TransportError> {
        if let Some(e) = &self.broken {
            return Err(TransportError::Invalid(format!(
                "an earlier collective on this communicator failed ({e}); open a new transport"
            )));
        }
        let r = f(self);
        if let Err(e) = &r
            && !matches!(
                e,
                TransportError::Invalid(_) | TransportError::Unsupported(_)
            )
        {
            tracing::warn!(rank = self.t.rank(), error = %e, "collective failed");
            self.broken = Some(e.clone());
        }
        r
    }

    /// Sums `count` elements of `dtype` at byte `offset` of registered buffer `buf` over all
    /// ranks, in place: every rank ends with the same sum.
    pub fn all_reduce_buf(
        &mut self,
        buf: BufId,
        offset: usize,
        count: usize,
        dtype: DType,
    ) -> Result<(), TransportError> {
        self.guard(|c| c.all_reduce_inner(buf, offset, count, dtype))
    }

    fn all_reduce_inner(
        &mut self,
        buf: BufId,
        offset: usize,
        count: usize,
        dtype: DType,
    ) -> Result<(), TransportError> {
        if dtype == DType::U8 {
            return Err(TransportError::Unsupported(
                "all_reduce of uint8 (raw bytes)".into(),
            ));
        }
        let es = dtype.size();
        check_range(self.t.as_ref(), buf, offset, count * es)?;
        let n = self.t.world();
        if n <= 1 {
            return Ok(());
        }
        let bytes = count * es;
        let two = n > 2 && bytes >= self.opts.bidirectional_min;
        let halves: Vec<(usize, usize, i64)> = if two {
            let c0 = count / 2;
            vec![(0, c0, 1), (c0, count, -1)]
        } else {
            vec![(0, count, 1)]
        };
        let window = self.opts.window.max(1);
        let mut dirs = Vec::with_capacity(2);
        let mut scratch_at = 0;
        for (lo, hi, sigma) in halves {
            let len = hi - lo;
            let segs: Vec<(usize, usize)> = (0..n)
                .map(|k| {
                    let a = lo + len * k / n;
                    let b = lo + len * (k + 1) / n;
                    (offset + a * es, offset + b * es)
                })
                .collect();
            let max_seg = len.div_ceil(n);
            let chunks = (max_seg * es)
                .div_ceil(self.opts.chunk_bytes.max(es))
                .max(1);
            let slot_bytes = max_seg.div_ceil(chunks) * es;
            dirs.push(RingDir {
                segs,
                sigma,
                chunks,
                scratch_offset: scratch_at,
                slot_bytes,
            });
            scratch_at += window * slot_bytes;
        }
        let scratch = self.scratch.ensure(self.t.as_mut(), scratch_at.max(8))?;
        let job = RingJob {
            name: "all_reduce",
            data: buf,
            scratch,
            dtype: Some(dtype),
            esize: es,
            rs: n - 1,
            ag: n - 1,
            window,
            timeout: self.opts.timeout,
        };
        ring::run(self.t.as_mut(), &mut self.comps, &job, &dirs)
    }

    /// All-reduce of a slice (copied into and out of a registered staging buffer).
    pub fn all_reduce(&mut self, data: &mut [u8], dtype: DType) -> Result<(), TransportError> {
        if !data.len().is_multiple_of(dtype.size()) {
            return Err(TransportError::Invalid(format!(
                "{} bytes is not a whole number of {} elements",
                data.len(),
                dtype.name()
            )));
        }
        let id = self.send_stage.ensure(self.t.as_mut(), data.len())?;
        self.t.buf_mut(id)[..data.len()].copy_from_slice(data);
        self.all_reduce_buf(id, 0, data.len() / dtype.size(), dtype)?;
        data.copy_from_slice(&self.t.buf(id)[..data.len()]);
        Ok(())
    }

    /// Ring all-gather in place: rank r's `per_rank` bytes are at `offset + r × per_rank` of
    /// `buf`; afterwards every rank has every rank's bytes there.
    pub fn all_gather_buf(
        &mut self,
        buf: BufId,
        offset: usize,
        per_rank: usize,
    ) -> Result<(), TransportError> {
        self.guard(|c| {
            let n = c.t.world();
            check_range(c.t.as_ref(), buf, offset, per_rank * n)?;
            if n <= 1 {
                return Ok(());
            }
            let chunks = per_rank.div_ceil(c.opts.chunk_bytes.max(1)).max(1);
            let segs = (0..n)
                .map(|k| (offset + k * per_rank, offset + (k + 1) * per_rank))
                .collect();
            let scratch = c.scratch.ensure(c.t.as_mut(), 8)?;
            let job = RingJob {
                name: "all_gather",
                data: buf,
                scratch,
                dtype: None,
                esize: 1,
                rs: 0,
                ag: n - 1,
                window: c.opts.window.max(1),
                timeout: c.opts.timeout,
            };
            let dir = RingDir {
                segs,
                sigma: 1,
                chunks,
                scratch_offset: 0,
                slot_bytes: 0,
            };
            ring::run(c.t.as_mut(), &mut c.comps, &job, &[dir])
        })
    }

    /// All-gather of a slice: returns every rank's `mine` concatenated in rank order (all ranks
    /// must pass the same length).
    pub fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<u8>, TransportError> {
        let (n, r, l) = (self.world(), self.rank(), mine.len());
        let id = self.send_stage.ensure(self.t.as_mut(), l * n)?;
        self.t.buf_mut(id)[r * l..(r + 1) * l].copy_from_slice(mine);
        self.all_gather_buf(id, 0, l)?;
        Ok(self.t.buf(id)[..l * n].to_vec())
    }

    /// Broadcast `len` bytes at `offset` of `buf` from `root` to every rank, in place.
    pub fn broadcast_buf(
        &mut self,
        buf: BufId,
        offset: usize,
        len: usize,
        root: usize,
    ) -> Result<(), TransportError> {
        self.guard(|c| {
            check_range(c.t.as_ref(), buf, offset, len)?;
            if root >= c.t.world() {
                return Err(TransportError::Invalid(format!(
                    "broadcast root {root} outside a world of {}",
                    c.t.world()
                )));
            }
            let o = c.opts.clone();
            ring::chain_broadcast(
                c.t.as_mut(),
                &mut c.comps,
                buf,
                offset,
                len,
                root,
                o.chunk_bytes,
                o.window.max(1),
                o.timeout,
            )
        })
    }

    /// Broadcast of a slice from `root` (every rank passes a slice of the same length).
    pub fn broadcast(&mut self, data: &mut [u8], root: usize) -> Result<(), TransportError> {
        let id = self.send_stage.ensure(self.t.as_mut(), data.len())?;
        if self.rank() == root {
            self.t.buf_mut(id)[..data.len()].copy_from_slice(data);
        }
        self.broadcast_buf(id, 0, data.len(), root)?;
        data.copy_from_slice(&self.t.buf(id)[..data.len()]);
        Ok(())
    }

    /// Returns once every rank has entered the barrier (a ring all-gather of one byte each).
    pub fn barrier(&mut self) -> Result<(), TransportError> {
        let n = self.world();
        let id = self.recv_stage.ensure(self.t.as_mut(), n)?;
        self.all_gather_buf(id, 0, 1).map_err(|e| match e {
            TransportError::Collective { step, source } => TransportError::Collective {
                step: format!("barrier: {step}"),
                source,
            },
            e => e,
        })
    }

    /// Sends a tensor (dtype, shape, payload) to `peer` and waits until it is handed over.
    pub fn send_tensor(
        &mut self,
        peer: usize,
        dtype: DType,
        shape: &[u64],
        payload: &[u8],
    ) -> Result<(), TransportError> {
        self.guard(|c| {
            let h = TensorHeader {
                dtype,
                shape: shape.to_vec(),
            };
            if shape.len() > super::wire::MAX_DIMS || h.payload_len() != Some(payload.len() as u64)
            {
                return Err(TransportError::Invalid(format!(
                    "tensor {} {shape:?} needs {:?} bytes, {} given",
                    dtype.name(),
                    h.payload_len(),
                    payload.len()
                )));
            }
            let total = h.len() + payload.len();
            let id = c.send_stage.ensure(c.t.as_mut(), total)?;
            let b = c.t.buf_mut(id);
            h.encode_into(&mut b[..h.len()]);
            b[h.len()..total].copy_from_slice(payload);
            c.t.post_send_at(peer, id, 0, total, 1)?;
            let step = format!("send_tensor to rank {peer}");
            wait_one(
                c.t.as_mut(),
                &mut c.comps,
                CompletionKind::Send,
                peer,
                c.opts.timeout,
                &step,
            )
            .map(|_| ())
        })
    }

    /// Receives the next tensor from `peer` (at most `max_payload` payload bytes): its header
    /// and payload. A header that does not match the payload is `Malformed` naming the peer.
    pub fn recv_tensor(
        &mut self,
        peer: usize,
        max_payload: usize,
    ) -> Result<(TensorHeader, Vec<u8>), TransportError> {
        self.guard(|c| {
            let cap = max_payload + 8 + 8 * super::wire::MAX_DIMS;
            let id = c.recv_stage.ensure(c.t.as_mut(), cap)?;
            c.t.post_recv_at(peer, id, 0, cap, 2)?;
            let step = format!("recv_tensor from rank {peer}");
            let len = wait_one(
                c.t.as_mut(),
                &mut c.comps,
                CompletionKind::Recv,
                peer,
                c.opts.timeout,
                &step,
            )?;
            let msg = &c.t.buf(id)[..len];
            let (h, at) =
                TensorHeader::decode(msg, peer).map_err(|e| TransportError::Collective {
                    step: step.clone(),
                    source: Box::new(e),
                })?;
            Ok((h, msg[at..].to_vec()))
        })
    }
}

fn check_range(
    t: &dyn Transport,
    buf: BufId,
    offset: usize,
    len: usize,
) -> Result<(), TransportError> {
    let have = t.buf(buf).len();
    match offset.checked_add(len) {
        Some(end) if end <= have => Ok(()),
        _ => Err(TransportError::Invalid(format!(
            "range {offset}..+{len} outside buffer {} of {have} bytes",
            buf.0
        ))),
    }
}

/// Waits for the single outstanding work request of `kind`; returns its length.
fn wait_one(
    t: &mut dyn Transport,
    comps: &mut Vec<Completion>,
    kind: CompletionKind,
    peer: usize,
    timeout: Duration,
    step: &str,
) -> Result<usize, TransportError> {
    let start = Instant::now();
    loop {
        comps.clear();
        t.poll(comps, timeout.saturating_sub(start.elapsed()))?;
        for c in comps.drain(..) {
            if c.kind == kind {
                return c
                    .result
                    .map(|_| c.len)
                    .map_err(|e| TransportError::Collective {
                        step: step.to_string(),
                        source: Box::new(e),
                    });
            }
        }
        if start.elapsed() >= timeout {
            return Err(TransportError::Timeout {
                peer: Some(peer),
                step: step.to_string(),
            });
        }
    }
}
