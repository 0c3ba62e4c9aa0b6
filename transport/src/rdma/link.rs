//! One peer's link: its verbs objects and the protocol state machine over them — completions,
//! credits, chunking and reassembly, the progress timeout and failing the peer. See
//! [`super::transport`] for the protocol in prose.

use std::collections::VecDeque;
use std::time::Instant;

use super::config::{MAX_MESSAGE, RdmaConfig, RdmaStats};
use super::header::{FLAG_FIRST, FLAG_LAST, HEADER_LEN, Header, KIND_CREDIT, KIND_DATA};
use super::verbs::{MemoryRegion, Region, Verbs, VerbsError, WcOpcode, WcStatus, WorkCompletion};
use crate::{Completion, CompletionKind, TransportError};

/// Credits data never spends: kept for credit-only messages.
const RESERVE: u32 = 1;
/// Marks a RECV's `wr_id` (the low 32 bits are the slot).
pub(super) const RECV_BIT: u64 = 1 << 63;
/// Marks a credit-only SEND's `wr_id`.
const CREDIT_BIT: u64 = 1 << 62;
/// Completions taken off a CQ per call.
pub(super) const POLL_BATCH: usize = 32;

pub(super) struct SendOp {
    pub(super) wr_id: u64,
    pub(super) seq: u64,
    pub(super) msg: u32,
    pub(super) buf: usize,
    pub(super) offset: usize,
    pub(super) len: usize,
    /// Bytes put into SENDs so far.
    pub(super) sent: usize,
    /// SENDs posted and not yet completed.
    pub(super) inflight: u32,
    pub(super) all_posted: bool,
}

pub(super) struct RecvOp {
    pub(super) wr_id: u64,
    pub(super) buf: usize,
    pub(super) offset: usize,
    pub(super) cap: usize,
}

pub(super) struct RxMsg {
    pub(super) op: RecvOp,
    pub(super) msg: u32,
    pub(super) total: usize,
    pub(super) got: usize,
    pub(super) too_long: bool,
}

/// Protocol state of one peer.
pub(super) struct LinkState {
    pub(super) peer: usize,
    /// RECVs the peer has posted for us that we have not used.
    pub(super) credits: u32,
    /// Our re-posted RECVs not yet announced to the peer.
    pub(super) to_return: u32,
    pub(super) peer_depth: u32,
    pub(super) free_send: Vec<u32>,
    pub(super) slot_op: Vec<Option<u64>>,
    pub(super) tx_seq: u32,
    pub(super) rx_seq: u32,
    pub(super) next_tx_msg: u32,
    pub(super) next_rx_msg: u32,
    pub(super) next_op_seq: u64,
    pub(super) sends: VecDeque<SendOp>,
    pub(super) first_unposted: usize,
    pub(super) recvs: VecDeque<RecvOp>,
    /// Received data chunks waiting for a user receive: (slot, header).
    pub(super) held: VecDeque<(u32, Header)>,
    pub(super) rx: Option<RxMsg>,
    pub(super) failed: Option<TransportError>,
    pub(super) last_progress: Instant,
    pub(super) stalled: bool,
}

impl LinkState {
    pub(super) fn busy(&self) -> bool {
        !self.sends.is_empty() || !self.recvs.is_empty() || self.rx.is_some()
    }
}

/// One peer's verbs objects. Field order is drop order: the queue pair goes before the memory
/// it may still reference, the CQ it reports to, its PD and the device.
pub(super) struct Link<V: Verbs> {
    pub(super) qp: V::Qp,
    pub(super) send_mr: V::Mr,
    pub(super) recv_mr: V::Mr,
    pub(super) cq: V::Cq,
    pub(super) _pd: V::Pd,
    pub(super) _ctx: V::Context,
    pub(super) device: String,
    pub(super) st: LinkState,
}

/// What link operations need from the transport besides the link.
pub(super) struct Cx<'a, V: Verbs> {
    pub(super) verbs: &'a V,
    pub(super) cfg: &'a RdmaConfig,
    pub(super) bufs: &'a mut [Region],
    pub(super) ready: &'a mut VecDeque<Completion>,
    pub(super) stats: &'a mut RdmaStats,
    pub(super) wcs: &'a mut Vec<WorkCompletion>,
}

pub(super) fn verbs_err(peer: usize, device: &str, e: VerbsError) -> TransportError {
    let what = format!("RDMA link to rank {peer} on device `{device}`: {e}");
    match e {
        VerbsError::NoDevice { .. }
        | VerbsError::DeviceNotFound { .. }
        | VerbsError::Unsupported(_) => TransportError::Unsupported(what),
        _ => TransportError::Io {
            peer: Some(peer),
            source: std::io::Error::other(what),
        },
    }
}

impl<V: Verbs> Link<V> {
    fn err(&self, e: VerbsError) -> TransportError {
        verbs_err(self.st.peer, &self.device, e)
    }

    pub(super) fn step(&mut self, cx: &mut Cx<'_, V>) -> Result<(), TransportError> {
        loop {
            cx.wcs.clear();
            let n = cx
                .verbs
                .poll_cq(&mut self.cq, cx.wcs, POLL_BATCH)
                .map_err(|e| self.err(e))?;
            let wcs = std::mem::take(cx.wcs);
            let mut result = Ok(());
            for wc in &wcs {
                result = self.on_completion(wc, cx);
                if result.is_err() {
                    break;
                }
            }
            *cx.wcs = wcs;
            result?;
            if n < POLL_BATCH {
                break;
            }
        }
        self.drain_held(cx)?;
        self.pump(cx)?;
        self.check_timeout(cx)
    }

    fn on_completion(
        &mut self,
        wc: &WorkCompletion,
        cx: &mut Cx<'_, V>,
    ) -> Result<(), TransportError> {
        let peer = self.st.peer;
        if wc.status != WcStatus::Success {
            let what = match wc.opcode {
                WcOpcode::Send => "SEND",
                WcOpcode::Recv => "RECV",
            };
            return Err(TransportError::Io {
                peer: Some(peer),
                source: std::io::Error::other(format!(
                    "RDMA {what} with rank {peer} on device `{}` failed: {}",
                    self.device,
                    wc.status.describe()
                )),
            });
        }
        self.st.last_progress = Instant::now();
        let slot = (wc.wr_id & 0xffff_ffff) as u32;
        if wc.wr_id & RECV_BIT != 0 {
            if slot >= cx.cfg.recv_depth {
                return Err(self.err(VerbsError::Invalid(format!(
                    "RECV completion for unknown slot {slot}"
                ))));
            }
            let chunk = cx.cfg.chunk;
            let start = slot as usize * chunk;
            let bytes = &self.recv_mr.region().bytes()[start..start + chunk];
            let h = Header::decode(bytes, wc.byte_len as usize, peer)?;
            if h.seq != self.st.rx_seq {
                return Err(TransportError::Io {
                    peer: Some(peer),
                    source: std::io::Error::other(format!(
                        "lost {} SEND(s) from rank {peer} on the UC queue pair (expected \
                         sequence {}, got {})",
                        h.seq.wrapping_sub(self.st.rx_seq),
                        self.st.rx_seq,
                        h.seq
                    )),
                });
            }
            self.st.rx_seq = self.st.rx_seq.wrapping_add(1);
            let credits = self.st.credits + u32::from(h.credits);
            if credits > self.st.peer_depth {
                return Err(TransportError::Malformed {
                    peer,
                    what: format!(
                        "returned credits add up to {credits}, more than its {} RECVs",
                        self.st.peer_depth
                    ),
                });
            }
            self.st.credits = credits;
            if h.kind == KIND_CREDIT {
                self.repost(slot, cx)?;
            } else {
                self.st.held.push_back((slot, h));
            }
        } else {
            if slot as usize >= self.st.slot_op.len() {
                return Err(self.err(VerbsError::Invalid(format!(
                    "SEND completion for unknown slot {slot}"
                ))));
            }
            self.st.free_send.push(slot);
            if let Some(seq) = self.st.slot_op[slot as usize].take()
                && let Some(op) = self.st.sends.iter_mut().find(|o| o.seq == seq)
            {
                op.inflight = op.inflight.saturating_sub(1);
            }
            while self
                .st
                .sends
                .front()
                .is_some_and(|o| o.all_posted && o.inflight == 0)
            {
                if let Some(op) = self.st.sends.pop_front() {
                    self.st.first_unposted = self.st.first_unposted.saturating_sub(1);
                    cx.ready.push_back(Completion {
                        wr_id: op.wr_id,
                        peer,
                        kind: CompletionKind::Send,
                        len: op.len,
                        result: Ok(()),
                    });
                }
            }
        }
        Ok(())
    }

    fn repost(&mut self, slot: u32, cx: &mut Cx<'_, V>) -> Result<(), TransportError> {
        let chunk = cx.cfg.chunk;
        cx.verbs
            .post_recv(
                &mut self.qp,
                &self.recv_mr,
                slot as usize * chunk,
                chunk,
                RECV_BIT | u64::from(slot),
            )
            .map_err(|e| self.err(e))?;
        self.st.to_return += 1;
        Ok(())
    }

    /// Copies held chunks into posted user receives, in order; stops at the first chunk of a
    /// message that has no receive yet (its slot stays held: that is the back-pressure).
    fn drain_held(&mut self, cx: &mut Cx<'_, V>) -> Result<(), TransportError> {
        let peer = self.st.peer;
        let bad = |what: String| TransportError::Malformed { peer, what };
        while let Some(&(slot, h)) = self.st.held.front() {
            if self.st.rx.is_none() {
                if h.flags & FLAG_FIRST == 0 || h.msg != self.st.next_rx_msg {
                    return Err(bad(format!(
                        "chunk of message {} (flags {:#x}) where message {} should start",
                        h.msg, h.flags, self.st.next_rx_msg
                    )));
                }
                if h.total > MAX_MESSAGE as u64 {
                    return Err(bad(format!(
                        "message of {} bytes, more than {MAX_MESSAGE}",
                        h.total
                    )));
                }
                let Some(op) = self.st.recvs.pop_front() else {
                    break;
                };
                let total = h.total as usize;
                self.st.rx = Some(RxMsg {
                    too_long: total > op.cap,
                    op,
                    msg: h.msg,
                    total,
                    got: 0,
                });
            }
            let Some(rx) = self.st.rx.as_mut() else {
                break;
            };
            if (h.flags & FLAG_FIRST != 0 && rx.got != 0)
                || h.msg != rx.msg
                || h.total as usize != rx.total
            {
                return Err(bad(format!(
                    "chunk of message {} ({} bytes) inside message {} ({} bytes)",
                    h.msg, h.total, rx.msg, rx.total
                )));
            }
            let n = h.payload as usize;
            let end = rx.got + n;
            let last = end == rx.total;
            if end > rx.total || last != (h.flags & FLAG_LAST != 0) {
                return Err(bad(format!(
                    "chunk of {n} bytes at {} of a {}-byte message (flags {:#x})",
                    rx.got, rx.total, h.flags
                )));
            }
            if !rx.too_long {
                let src_at = slot as usize * cx.cfg.chunk + HEADER_LEN;
                let src = &self.recv_mr.region().bytes()[src_at..src_at + n];
                let dst_at = rx.op.offset + rx.got;
                cx.bufs[rx.op.buf].bytes_mut()[dst_at..dst_at + n].copy_from_slice(src);
            }
            rx.got = end;
            self.st.held.pop_front();
            self.repost(slot, cx)?;
            if last && let Some(rx) = self.st.rx.take() {
                self.st.next_rx_msg = self.st.next_rx_msg.wrapping_add(1);
                let result = if rx.too_long {
                    Err(bad(format!(
                        "message of {} bytes for a receive of {} bytes",
                        rx.total, rx.op.cap
                    )))
                } else {
                    Ok(())
                };
                cx.ready.push_back(Completion {
                    wr_id: rx.op.wr_id,
                    peer,
                    kind: CompletionKind::Recv,
                    len: rx.total,
                    result,
                });
            }
        }
        Ok(())
    }

    /// Posts data chunks while credits and send slots last, then returns credits if due.
    fn pump(&mut self, cx: &mut Cx<'_, V>) -> Result<(), TransportError> {
        let chunk = cx.cfg.chunk;
        let max_payload = chunk - HEADER_LEN;
        while self.st.first_unposted < self.st.sends.len() {
            if self.st.credits <= RESERVE {
                if !self.st.stalled {
                    self.st.stalled = true;
                    cx.stats.credit_stalls += 1;
                }
                break;
            }
            self.st.stalled = false;
            let Some(slot) = self.st.free_send.pop() else {
                break;
            };
            let op = &mut self.st.sends[self.st.first_unposted];
            let n = max_payload.min(op.len - op.sent);
            let mut flags = 0;
            if op.sent == 0 {
                flags |= FLAG_FIRST;
            }
            if op.sent + n == op.len {
                flags |= FLAG_LAST;
            }
            let credits = self.st.to_return.min(u32::from(u16::MAX));
            let h = Header {
                kind: KIND_DATA,
                flags,
                credits: credits as u16,
                seq: self.st.tx_seq,
                payload: n as u32,
                msg: op.msg,
                total: op.len as u64,
            };
            let at = slot as usize * chunk;
            let src = &cx.bufs[op.buf].bytes()[op.offset + op.sent..op.offset + op.sent + n];
            let dst = &mut self.send_mr.region_mut().bytes_mut()[at..at + HEADER_LEN + n];
            h.encode(dst);
            dst[HEADER_LEN..].copy_from_slice(src);
            let posted = cx.verbs.post_send(
                &mut self.qp,
                &self.send_mr,
                at,
                HEADER_LEN + n,
                u64::from(slot),
            );
            if let Err(e) = posted {
                self.st.free_send.push(slot);
                return Err(verbs_err(self.st.peer, &self.device, e));
            }
            let op = &mut self.st.sends[self.st.first_unposted];
            op.sent += n;
            op.inflight += 1;
            self.st.slot_op[slot as usize] = Some(op.seq);
            if flags & FLAG_LAST != 0 {
                op.all_posted = true;
                self.st.first_unposted += 1;
            }
            self.st.to_return -= credits;
            self.st.tx_seq = self.st.tx_seq.wrapping_add(1);
            self.st.credits -= 1;
            cx.stats.chunks_sent += 1;
            let outstanding = self.st.peer_depth - self.st.credits;
            cx.stats.max_outstanding = cx.stats.max_outstanding.max(outstanding);
        }
        if self.st.to_return >= cx.cfg.credit_threshold()
            && self.st.credits >= 1
            && let Some(slot) = self.st.free_send.pop()
        {
            let credits = self.st.to_return.min(u32::from(u16::MAX));
            let h = Header {
                kind: KIND_CREDIT,
                flags: 0,
                credits: credits as u16,
                seq: self.st.tx_seq,
                payload: 0,
                msg: 0,
                total: 0,
            };
            let at = slot as usize * chunk;
            h.encode(&mut self.send_mr.region_mut().bytes_mut()[at..at + HEADER_LEN]);
            let posted = cx.verbs.post_send(
                &mut self.qp,
                &self.send_mr,
                at,
                HEADER_LEN,
                CREDIT_BIT | u64::from(slot),
            );
            if let Err(e) = posted {
                self.st.free_send.push(slot);
                return Err(verbs_err(self.st.peer, &self.device, e));
            }
            self.st.to_return -= credits;
            self.st.tx_seq = self.st.tx_seq.wrapping_add(1);
            self.st.credits -= 1;
            cx.stats.credit_messages += 1;
            let outstanding = self.st.peer_depth - self.st.credits;
            cx.stats.max_outstanding = cx.stats.max_outstanding.max(outstanding);
        }
        Ok(())
    }

    fn check_timeout(&mut self, cx: &mut Cx<'_, V>) -> Result<(), TransportError> {
        if !self.st.busy() {
            return Ok(());
        }
        let idle = self.st.last_progress.elapsed();
        if idle < cx.cfg.progress_timeout {
            return Ok(());
        }
        let peer = self.st.peer;
        Err(TransportError::Timeout {
            peer: Some(peer),
            step: format!(
                "RDMA with {} send(s) and {} receive(s) pending and no completion for {:.1?} \
                 (a UC queue pair reports nothing when the peer is gone)",
                self.st.sends.len(),
                self.st.recvs.len() + usize::from(self.st.rx.is_some()),
                idle
            ),
        })
    }

    /// Fails the peer: every work request in flight with it completes with `e`.
    pub(super) fn fail(&mut self, e: TransportError, cx: &mut Cx<'_, V>) {
        let peer = self.st.peer;
        tracing::warn!(peer, device = %self.device, error = %e, "RDMA link failed");
        for op in self.st.sends.drain(..) {
            cx.ready.push_back(Completion {
                wr_id: op.wr_id,
                peer,
                kind: CompletionKind::Send,
                len: op.len,
                result: Err(e.clone()),
            });
        }
        let rx = self.st.rx.take().map(|rx| rx.op);
        for op in rx.into_iter().chain(self.st.recvs.drain(..)) {
            cx.ready.push_back(Completion {
                wr_id: op.wr_id,
                peer,
                kind: CompletionKind::Recv,
                len: 0,
                result: Err(e.clone()),
            });
        }
        self.st.held.clear();
        self.st.first_unposted = 0;
        self.st.failed = Some(e);
    }
}
