//! [`RdmaTransport`]: the [`Transport`] API over any [`Verbs`] provider, the way JACCL drives
//! Apple's Thunderbolt verbs: one UC queue pair (RC where UC is missing) and one completion queue
//! per peer, two-sided SEND/RECV only, and every byte through pre-registered bounce buffers.
//!
//! - Bounce buffers: per peer, `send_depth` send slots and `recv_depth` receive slots of `chunk`
//!   bytes each (4 KiB..512 KiB; Apple takes more than 4 KiB from macOS 26.3), registered once.
//!   A message is cut into chunks of `chunk - 24` payload bytes behind a
//!   [`Header`](super::header::Header); the receiver copies each chunk into the user's buffer
//!   at its offset. User buffers are therefore plain page-aligned memory owned by the
//!   transport, not verbs registrations (one copy on each side, as in JACCL).
//! - Flow control: UC drops a SEND that finds no posted RECV, without an error on either side.
//!   So a sender holds credits, one per RECV the peer has posted for it (initially the peer's
//!   `recv_depth`, exchanged at bootstrap), and spends one per SEND. A receiver re-posts a slot
//!   once its data has been copied out — which needs a matching user receive, so a slow
//!   receiver throttles its sender — and returns the credits piggybacked on its next chunk, or in
//!   a credit-only message once `recv_depth / 4` have piled up. Data never spends the last
//!   credit: it is kept for credit-only messages, so two ranks cannot both end with credits they
//!   cannot return (each credit message returns at least `recv_depth / 4` for the one it costs).
//! - Order and loss: a queue pair delivers in order; every SEND carries a sequence number, so a
//!   SEND that UC lost anyway (a link fault) fails the peer at the next arrival instead of
//!   corrupting a message.
//! - Progress happens inside `poll` and the `post_*` calls (busy polling, as JACCL does).
//! - Errors: an error completion, a CQ overflow or a malformed header fails the peer: every work
//!   request in flight with it completes with the error and later posts fail at once. A UC queue
//!   pair says nothing when the peer dies, so a peer with work pending and no completion for
//!   `progress_timeout` fails with [`TransportError::Timeout`] naming it.
//! - Set-up ([`RdmaTransport::connect`]): open each peer's device, create CQ and QP, go to INIT,
//!   register and post the RECVs, all-gather the queue-pair info through `exchange` (the
//!   bootstrap), go to RTR/RTS, then all-gather once more as a barrier so that nobody sends before
//!   every peer's queue pair is ready to receive.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

pub use super::config::{MAX_CHUNK, MAX_MESSAGE, MIN_CHUNK, RdmaConfig, RdmaStats};
use super::link::{Cx, Link, RecvOp, SendOp};
use super::verbs::{Region, Verbs, WorkCompletion};
use crate::{BufId, Capabilities, Completion, Transport, TransportError};

pub use crate::bootstrap::Exchange;

/// The RDMA transport over verbs provider `V`.
pub struct RdmaTransport<V: Verbs> {
    pub(super) links: Vec<Option<Link<V>>>,
    pub(super) bufs: Vec<Region>,
    pub(super) ready: VecDeque<Completion>,
    pub(super) wcs: Vec<WorkCompletion>,
    pub(super) stats: RdmaStats,
    pub(super) rank: usize,
    pub(super) world: usize,
    pub(super) cfg: RdmaConfig,
    pub(super) verbs: V,
}

impl<V: Verbs> RdmaTransport<V> {
    /// Counters so far.
    pub fn stats(&self) -> RdmaStats {
        self.stats.clone()
    }

    /// The settings in effect.
    pub fn config(&self) -> &RdmaConfig {
        &self.cfg
    }

    /// The local queue-pair number of the link to `peer`, if there is one.
    pub fn local_qpn(&self, peer: usize) -> Option<u32> {
        self.links
            .get(peer)?
            .as_ref()
            .map(|l| self.verbs.qp_num(&l.qp))
    }

    /// The device of the link to `peer`, if there is one.
    pub fn device(&self, peer: usize) -> Option<&str> {
        self.links.get(peer)?.as_ref().map(|l| l.device.as_str())
    }

    fn link_for_post(&mut self, peer: usize) -> Result<&mut Link<V>, TransportError> {
        if peer >= self.world || peer == self.rank {
            return Err(TransportError::Invalid(format!(
                "peer {peer}: expected a rank below {} other than {}",
                self.world, self.rank
            )));
        }
        let link = self
            .links
            .get_mut(peer)
            .and_then(|l| l.as_mut())
            .ok_or_else(|| TransportError::Unsupported(format!("no RDMA link to rank {peer}")))?;
        if let Some(e) = &link.st.failed {
            return Err(e.clone());
        }
        if !link.st.busy() {
            link.st.last_progress = Instant::now();
        }
        Ok(link)
    }

    fn check_range(&self, id: BufId, offset: usize, len: usize) -> Result<usize, TransportError> {
        let index = id.0 as usize;
        let buf = self
            .bufs
            .get(index)
            .ok_or_else(|| TransportError::Invalid(format!("unknown buffer {}", id.0)))?;
        match offset.checked_add(len) {
            Some(end) if end <= buf.len() => Ok(index),
            _ => Err(TransportError::Invalid(format!(
                "range {offset}+{len} outside buffer {} of {} bytes",
                id.0,
                buf.len()
            ))),
        }
    }

    /// Makes progress on the link to `peer`: completions, copies, posts, timeouts.
    fn progress_peer(&mut self, peer: usize) {
        let Some(link) = self.links.get_mut(peer).and_then(|l| l.as_mut()) else {
            return;
        };
        if link.st.failed.is_some() {
            return;
        }
        let mut cx = Cx {
            verbs: &self.verbs,
            cfg: &self.cfg,
            bufs: &mut self.bufs,
            ready: &mut self.ready,
            stats: &mut self.stats,
            wcs: &mut self.wcs,
        };
        if let Err(e) = link.step(&mut cx) {
            link.fail(e, &mut cx);
        }
    }

    fn progress(&mut self) {
        for peer in 0..self.world {
            self.progress_peer(peer);
        }
    }
}

impl<V: Verbs> Transport for RdmaTransport<V> {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            name: "rdma",
            max_message: MAX_MESSAGE,
            write_with_immediate: false,
            rails: 1,
        }
    }

    fn register(&mut self, len: usize) -> Result<BufId, TransportError> {
        let id = u32::try_from(self.bufs.len())
            .map_err(|_| TransportError::Invalid("too many registered buffers".into()))?;
        let region = Region::new(len).map_err(|e| TransportError::Io {
            peer: None,
            source: std::io::Error::other(format!("RDMA: registering {len} bytes: {e}")),
        })?;
        self.bufs.push(region);
        Ok(BufId(id))
    }

    fn buf(&self, id: BufId) -> &[u8] {
        self.bufs[id.0 as usize].bytes()
    }

    fn buf_mut(&mut self, id: BufId) -> &mut [u8] {
        self.bufs[id.0 as usize].bytes_mut()
    }

    fn post_send(
        &mut self,
        peer: usize,
        id: BufId,
        len: usize,
        wr_id: u64,
    ) -> Result<(), TransportError> {
        self.post_send_at(peer, id, 0, len, wr_id)
    }

    fn post_recv(&mut self, peer: usize, id: BufId, wr_id: u64) -> Result<(), TransportError> {
        let len = self
            .bufs
            .get(id.0 as usize)
            .map(|b| b.len())
            .ok_or_else(|| TransportError::Invalid(format!("unknown buffer {}", id.0)))?;
        self.post_recv_at(peer, id, 0, len, wr_id)
    }

    fn post_send_at(
        &mut self,
        peer: usize,
        id: BufId,
        offset: usize,
        len: usize,
        wr_id: u64,
    ) -> Result<(), TransportError> {
        let buf = self.check_range(id, offset, len)?;
        if len > MAX_MESSAGE {
            return Err(TransportError::Invalid(format!(
                "message of {len} bytes, more than {MAX_MESSAGE}"
            )));
        }
        let link = self.link_for_post(peer)?;
        let st = &mut link.st;
        st.sends.push_back(SendOp {
            wr_id,
            seq: st.next_op_seq,
            msg: st.next_tx_msg,
            buf,
            offset,
            len,
            sent: 0,
            inflight: 0,
            all_posted: false,
        });
        st.next_op_seq += 1;
        st.next_tx_msg = st.next_tx_msg.wrapping_add(1);
        self.progress_peer(peer);
        Ok(())
    }

    fn post_recv_at(
        &mut self,
        peer: usize,
        id: BufId,
        offset: usize,
        max_len: usize,
        wr_id: u64,
    ) -> Result<(), TransportError> {
        let buf = self.check_range(id, offset, max_len)?;
        let link = self.link_for_post(peer)?;
        link.st.recvs.push_back(RecvOp {
            wr_id,
            buf,
            offset,
            cap: max_len,
        });
        self.progress_peer(peer);
        Ok(())
    }

    fn poll(
        &mut self,
        out: &mut Vec<Completion>,
        timeout: Duration,
    ) -> Result<usize, TransportError> {
        let deadline = Instant::now() + timeout;
        let mut idle_rounds: u32 = 0;
        loop {
            self.progress();
            if !self.ready.is_empty() {
                let n = self.ready.len();
                out.extend(self.ready.drain(..));
                return Ok(n);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(0);
            }
            // Busy-poll first (completions come within microseconds on a live link), then
            // back off so an idle wait does not hold a core.
            idle_rounds = idle_rounds.saturating_add(1);
            if idle_rounds < 256 {
                std::thread::yield_now();
            } else {
                std::thread::sleep((deadline - now).min(Duration::from_micros(50)));
            }
        }
    }
}
