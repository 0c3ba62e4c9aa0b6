//! Settings ([`RdmaConfig`]) and counters ([`RdmaStats`]) of the RDMA transport, and its size
//! limits.

use std::time::Duration;

use super::verbs::QpType;
use crate::TransportError;

/// Smallest bounce buffer (JACCL's frame size).
pub const MIN_CHUNK: usize = 4096;
/// Largest bounce buffer (JACCL's largest class, macOS >= 26.3).
pub const MAX_CHUNK: usize = 512 * 1024;
/// Largest message one `post_send` may carry (as the TCP transport).
pub const MAX_MESSAGE: usize = 1 << 40;

/// Settings of the RDMA transport; both ends of a link must use the same `chunk`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaConfig {
    /// Bounce-buffer size in bytes: a power of two in 4 KiB..=512 KiB.
    pub chunk: usize,
    /// RECVs posted per peer (the peer's credits), 2..=1024. JACCL: 32.
    pub recv_depth: u32,
    /// SEND work requests (and send bounce buffers) per peer, >= 1. JACCL: 32.
    pub send_depth: u32,
    /// Completion-queue entries per peer; 0 = `send_depth + recv_depth`, the least that
    /// cannot overflow.
    pub cq_depth: u32,
    /// Port number.
    pub port: u8,
    /// Source GID index; `None` picks the first IPv4-mapped GID (JACCL uses index 1).
    pub sgid_index: Option<u8>,
    /// Path MTU in bytes (JACCL: 1024).
    pub mtu: u32,
    /// Queue-pair type to create first.
    pub qp_type: QpType,
    /// Create an RC queue pair when the device refuses UC (both ends must end up alike).
    pub rc_fallback: bool,
    /// A peer with work pending and no completion for this long fails (UC reports nothing when
    /// the peer dies; JACCL's default is 600 s).
    pub progress_timeout: Duration,
    /// Deadline of each bootstrap all-gather.
    pub connect_timeout: Duration,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            chunk: MIN_CHUNK,
            recv_depth: 32,
            send_depth: 32,
            cq_depth: 0,
            port: 1,
            sgid_index: None,
            mtu: 1024,
            qp_type: QpType::Uc,
            rc_fallback: true,
            progress_timeout: Duration::from_secs(600),
            connect_timeout: Duration::from_secs(60),
        }
    }
}

impl RdmaConfig {
    /// The CQ depth in effect.
    pub fn effective_cq_depth(&self) -> u32 {
        if self.cq_depth == 0 {
            self.send_depth.saturating_add(self.recv_depth)
        } else {
            self.cq_depth
        }
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<(), TransportError> {
        let bad = |what: String| Err(TransportError::Invalid(format!("RDMA config: {what}")));
        if !self.chunk.is_power_of_two() || !(MIN_CHUNK..=MAX_CHUNK).contains(&self.chunk) {
            return bad(format!(
                "chunk {} bytes: expected a power of two from {MIN_CHUNK} to {MAX_CHUNK}",
                self.chunk
            ));
        }
        if !(2..=1024).contains(&self.recv_depth) {
            return bad(format!("recv_depth {}: expected 2..=1024", self.recv_depth));
        }
        if !(1..=1024).contains(&self.send_depth) {
            return bad(format!("send_depth {}: expected 1..=1024", self.send_depth));
        }
        let need = self.send_depth + self.recv_depth;
        if self.effective_cq_depth() < need {
            return bad(format!(
                "cq_depth {} is less than send_depth + recv_depth = {need}: the CQ could overflow",
                self.cq_depth
            ));
        }
        super::verbs::mtu_code(self.mtu).map_err(|e| TransportError::Invalid(e.to_string()))?;
        Ok(())
    }

    pub(super) fn credit_threshold(&self) -> u32 {
        (self.recv_depth / 4).max(1)
    }
}

/// Counters of one transport (for tests and diagnostics).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RdmaStats {
    /// Data chunks posted.
    pub chunks_sent: u64,
    /// Credit-only messages posted.
    pub credit_messages: u64,
    /// Times a sender had data but no credit to spend.
    pub credit_stalls: u64,
    /// Most SENDs ever outstanding towards one peer (posted, not yet returned as credits); never
    /// more than the peer's `recv_depth`.
    pub max_outstanding: u32,
}
