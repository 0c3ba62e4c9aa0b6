//! The slice of the verbs API that tb's RDMA transport uses, as a trait ([`Verbs`]) with three
//! providers: rdma-core's libibverbs on Linux (`ibverbs`, feature `rdma`), Apple's
//! `librdma.dylib` on macOS (`apple`, feature `rdma`), and the in-process simulation
//! [`crate::verbs_sim`] that the tests run against.
//!
//! Only what JACCL uses on Thunderbolt is here: open a device by name, a protection domain, one
//! completion queue and one queue pair per peer (UC, the only type Apple supports; RC where a
//! device lacks UC), INIT → RTR → RTS with the peer's (qpn, psn, lid, gid), memory registration,
//! signalled two-sided SEND, RECV, and CQ polling. No RDMA READ/WRITE, no SRQ, no UD.
//!
//! Handles are RAII: dropping a queue pair destroys it, dropping a memory region deregisters it
//! and then frees its memory. A provider's handle types keep what they were made from alive
//! (a QP keeps its PD, CQ and device context), so drop order cannot free a parent first.

use std::alloc::Layout;
use std::ptr::NonNull;

/// A 16-byte GID (RoCE v2 / Thunderbolt: an IPv4-mapped IPv6 address).
pub type Gid = [u8; 16];

/// Queue-pair transport type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Unreliable connected: no acks, a SEND that finds no posted RECV is silently dropped.
    /// The only type Apple's Thunderbolt verbs support.
    Uc,
    /// Reliable connected: acked; a SEND that finds no RECV is retried, then fails (RNR).
    Rc,
}

impl QpType {
    /// Wire code in the queue-pair info blob.
    pub fn code(self) -> u8 {
        match self {
            QpType::Uc => 1,
            QpType::Rc => 2,
        }
    }

    /// Inverse of [`QpType::code`].
    pub fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(QpType::Uc),
            2 => Some(QpType::Rc),
            _ => None,
        }
    }
}

/// Work-request limits of a queue pair (one SGE each way, no inline data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Outstanding SEND work requests.
    pub max_send_wr: u32,
    /// Outstanding RECV work requests.
    pub max_recv_wr: u32,
}

/// What `query_port` tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortInfo {
    /// Local identifier (0 on RoCE / Thunderbolt, where the GID addresses the port).
    pub lid: u16,
    /// Number of GID table entries.
    pub gid_table_len: u32,
    /// Active path MTU in bytes (256..4096).
    pub active_mtu: u32,
    /// Whether the port is ACTIVE.
    pub active: bool,
}

/// Everything a peer needs to connect its queue pair to ours; exchanged through the bootstrap
/// all-gather.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpEndpoint {
    /// Queue-pair number.
    pub qpn: u32,
    /// Initial packet sequence number of our send queue.
    pub psn: u32,
    /// Port LID (0 when addressed by GID).
    pub lid: u16,
    /// Port GID used as the source GID.
    pub gid: Gid,
    /// Our queue pair's type (both ends must agree).
    pub qp_type: QpType,
}

/// Path parameters for INIT → RTR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathParams {
    /// Port number (1 on every device tb meets).
    pub port: u8,
    /// Path MTU in bytes (256, 512, 1024, 2048 or 4096; JACCL uses 1024).
    pub mtu: u32,
    /// Source GID index (JACCL: 1, the IPv4-mapped entry).
    pub sgid_index: u8,
}

/// Which queue a completion is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcOpcode {
    /// A SEND work request.
    Send,
    /// A RECV work request.
    Recv,
}

/// Completion status (the subset of `ibv_wc_status` tb distinguishes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcStatus {
    /// `IBV_WC_SUCCESS`.
    Success,
    /// `IBV_WC_LOC_LEN_ERR`: the arriving message was longer than the RECV buffer.
    LocalLength,
    /// `IBV_WC_WR_FLUSH_ERR`: the queue pair went to the error state with this WR posted.
    Flushed,
    /// `IBV_WC_RNR_RETRY_EXC_ERR`: RC only: the peer had no RECV posted.
    ReceiverNotReady,
    /// `IBV_WC_REM_INV_REQ_ERR`: RC only: the peer rejected the message (e.g. too long).
    RemoteInvalidRequest,
    /// `IBV_WC_RETRY_EXC_ERR`: RC only: no ack from the peer.
    RetryExceeded,
    /// Any other status, with its numeric value.
    Other(u32),
}

impl WcStatus {
    /// A short description for error messages.
    pub fn describe(self) -> String {
        match self {
            WcStatus::Success => "success".into(),
            WcStatus::LocalLength => "local length error (message longer than the RECV)".into(),
            WcStatus::Flushed => "flushed (queue pair in error state)".into(),
            WcStatus::ReceiverNotReady => "receiver not ready (no RECV posted)".into(),
            WcStatus::RemoteInvalidRequest => "remote invalid request".into(),
            WcStatus::RetryExceeded => "transport retry exceeded".into(),
            WcStatus::Other(n) => format!("status {n}"),
        }
    }
}

/// One work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The `wr_id` given at post time.
    pub wr_id: u64,
    /// How it ended.
    pub status: WcStatus,
    /// SEND or RECV.
    pub opcode: WcOpcode,
    /// Bytes received (RECV) — meaningful only on success.
    pub byte_len: u32,
}

/// A verbs call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum VerbsError {
    /// The provider found no device at all (no driver, no hardware, or the library is missing).
    #[error("{provider}: no RDMA device ({detail})")]
    NoDevice {
        /// `libibverbs`, `librdma` or `verbs_sim`.
        provider: &'static str,
        /// Why, e.g. the errno of `ibv_get_device_list`.
        detail: String,
    },
    /// The named device does not exist.
    #[error("{provider}: RDMA device `{name}` not found (available: {available:?})")]
    DeviceNotFound {
        /// The provider.
        provider: &'static str,
        /// The name asked for.
        name: String,
        /// The names there are.
        available: Vec<String>,
    },
    /// A call returned an error.
    #[error("{op} failed: {detail}")]
    Call {
        /// The verbs function, e.g. `ibv_modify_qp(RTR)`.
        op: &'static str,
        /// errno or other detail.
        detail: String,
    },
    /// The completion queue overflowed: completions were lost and its queue pairs are in error.
    #[error("completion queue overflowed (depth {depth})")]
    CqOverflow {
        /// The CQ's depth.
        depth: u32,
    },
    /// This provider or device cannot do it.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A caller error (range outside the memory region and the like).
    #[error("invalid argument: {0}")]
    Invalid(String),
}

/// Memory owned by a registered region: page-aligned, zero-filled, never moves.
///
/// The provider learns its address at registration; after that only the owner of the region
/// (the transport) reads and writes it through [`Region::bytes`] / [`Region::bytes_mut`], and
/// only in ranges not named by a posted work request (the verbs contract).
pub struct Region {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: a Region is a uniquely owned heap allocation (like Box<[u8]>); moving it to another
// thread moves the ownership with it.
unsafe impl Send for Region {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for Region {}

impl Region {
    /// Alignment of every region: a page, as verbs registration wants.
    pub const ALIGN: usize = 4096;

    /// A zero-filled region of `len` bytes (at least one byte is allocated).
    pub fn new(len: usize) -> Result<Self, VerbsError> {
        let layout = Layout::from_size_align(len.max(1), Self::ALIGN)
            .map_err(|e| VerbsError::Invalid(format!("region of {len} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| VerbsError::Call {
            op: "alloc",
            detail: format!("out of memory for a region of {len} bytes"),
        })?;
        Ok(Region { ptr, len, layout })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Base address, for the provider's registration and scatter-gather entries.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: ptr is a live allocation of at least len initialised (zeroed) bytes, owned by
        // self; the borrow of self bounds the slice's lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `&mut self` makes this the only reference from safe code.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Checks that `offset..offset + len` lies inside the region.
    pub fn check_range(&self, offset: usize, len: usize) -> Result<(), VerbsError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(VerbsError::Invalid(format!(
                "range {offset}+{len} outside a region of {} bytes",
                self.len
            ))),
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region").field("len", &self.len).finish()
    }
}

/// A registered memory region: owns its [`Region`] and deregisters before freeing it.
pub trait MemoryRegion: Send {
    /// The memory.
    fn region(&self) -> &Region;
    /// The memory, writable (only ranges not named by a posted work request).
    fn region_mut(&mut self) -> &mut Region;
}

/// The verbs operations tb uses. One value per process (or per simulated host); handles are
/// associated types so that each provider keeps its own representation.
pub trait Verbs: Send + 'static {
    /// An open device (`ibv_context`).
    type Context: Send;
    /// A protection domain.
    type Pd: Send;
    /// A completion queue.
    type Cq: Send;
    /// A queue pair.
    type Qp: Send;
    /// A registered memory region.
    type Mr: MemoryRegion;

    /// Provider name for messages (`libibverbs`, `librdma`, `verbs_sim`).
    fn provider(&self) -> &'static str;
    /// The names of the devices there are.
    fn device_names(&self) -> Result<Vec<String>, VerbsError>;
    /// Opens the device called `name`.
    fn open(&self, name: &str) -> Result<Self::Context, VerbsError>;
    /// Allocates a protection domain.
    fn alloc_pd(&self, ctx: &Self::Context) -> Result<Self::Pd, VerbsError>;
    /// Creates a completion queue with at least `depth` entries.
    fn create_cq(&self, ctx: &Self::Context, depth: u32) -> Result<Self::Cq, VerbsError>;
    /// Creates a queue pair whose send and receive completions both go to `cq`.
    fn create_qp(
        &self,
        pd: &Self::Pd,
        cq: &Self::Cq,
        qp_type: QpType,
        caps: QpCaps,
    ) -> Result<Self::Qp, VerbsError>;
    /// The queue pair's number.
    fn qp_num(&self, qp: &Self::Qp) -> u32;
    /// Port attributes.
    fn query_port(&self, ctx: &Self::Context, port: u8) -> Result<PortInfo, VerbsError>;
    /// GID table entry `index` of `port`.
    fn query_gid(&self, ctx: &Self::Context, port: u8, index: u32) -> Result<Gid, VerbsError>;
    /// RESET → INIT (local write access only: tb uses SEND/RECV).
    fn modify_to_init(&self, qp: &mut Self::Qp, port: u8) -> Result<(), VerbsError>;
    /// INIT → RTR towards `remote`.
    fn modify_to_rtr(
        &self,
        qp: &mut Self::Qp,
        remote: &QpEndpoint,
        path: &PathParams,
    ) -> Result<(), VerbsError>;
    /// RTR → RTS with our send PSN.
    fn modify_to_rts(&self, qp: &mut Self::Qp, psn: u32) -> Result<(), VerbsError>;
    /// Registers `region` (local write access).
    fn reg_mr(&self, pd: &Self::Pd, region: Region) -> Result<Self::Mr, VerbsError>;
    /// Posts a signalled SEND of `mr[offset..offset + len]`.
    fn post_send(
        &self,
        qp: &mut Self::Qp,
        mr: &Self::Mr,
        offset: usize,
        len: usize,
        wr_id: u64,
    ) -> Result<(), VerbsError>;
    /// Posts a RECV into `mr[offset..offset + len]`.
    fn post_recv(
        &self,
        qp: &mut Self::Qp,
        mr: &Self::Mr,
        offset: usize,
        len: usize,
        wr_id: u64,
    ) -> Result<(), VerbsError>;
    /// Appends up to `max` completions to `out`; returns how many.
    fn poll_cq(
        &self,
        cq: &mut Self::Cq,
        out: &mut Vec<WorkCompletion>,
        max: usize,
    ) -> Result<usize, VerbsError>;
}

/// Whether `gid` is an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`), the GID JACCL picks.
pub fn is_ipv4_mapped(gid: &Gid) -> bool {
    gid[..10].iter().all(|b| *b == 0) && gid[10] == 0xff && gid[11] == 0xff
}

/// The `ibv_mtu` enum value for an MTU in bytes.
pub fn mtu_code(bytes: u32) -> Result<u32, VerbsError> {
    match bytes {
        256 => Ok(1),
        512 => Ok(2),
        1024 => Ok(3),
        2048 => Ok(4),
        4096 => Ok(5),
        other => Err(VerbsError::Invalid(format!(
            "path MTU {other}: expected 256, 512, 1024, 2048 or 4096"
        ))),
    }
}

/// Bytes of an `ibv_mtu` enum value (0 for an unknown value).
pub fn mtu_bytes(code: u32) -> u32 {
    match code {
        1..=5 => 128 << code,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_zeroed_aligned_and_checked() {
        let mut r = Region::new(10_000).expect("alloc");
        assert_eq!(r.as_ptr() as usize % Region::ALIGN, 0);
        assert!(r.bytes().iter().all(|b| *b == 0));
        r.bytes_mut()[9_999] = 7;
        assert_eq!(r.bytes()[9_999], 7);
        assert!(r.check_range(9_000, 1_000).is_ok());
        assert!(r.check_range(9_000, 1_001).is_err());
        assert!(r.check_range(usize::MAX, 2).is_err());
        let empty = Region::new(0).expect("alloc");
        assert!(empty.is_empty());
    }

    #[test]
    fn mtu_codes_round_trip() {
        for b in [256, 512, 1024, 2048, 4096] {
            assert_eq!(mtu_bytes(mtu_code(b).expect("valid")), b);
        }
        assert!(mtu_code(1500).is_err());
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[192, 168, 1, 2]);
        assert!(is_ipv4_mapped(&gid));
        gid[0] = 0xfe;
        assert!(!is_ipv4_mapped(&gid));
    }
}
