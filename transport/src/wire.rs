//! The byte formats on tb's data-plane sockets, all little-endian:
//!
//! - [`Hello`] (20 bytes): the first bytes on every TCP data connection: magic `TBH1`, the
//!   connecting rank, the world size, the rail index and the number of rails.
//! - [`FrameHeader`] (40 bytes): before every stripe of a message: magic `TBW1`, kind, the
//!   message's sequence number on this (peer, direction), the stripe's offset and length, and the
//!   message's total length. A message of `total_len` bytes travels as one or more stripes, one
//!   per rail.
//! - [`TensorHeader`] (8 + 8 × ndim bytes): at the start of a point-to-point tensor message:
//!   magic `TBT1`, dtype, number of dimensions, then the shape; the payload follows.
//!
//! Decoders check everything and return [`TransportError::Malformed`] naming the peer.

use super::TransportError;

/// Magic of [`Hello`]: `TBH1`.
pub const HELLO_MAGIC: u32 = u32::from_le_bytes(*b"TBH1");
/// Magic of [`FrameHeader`]: `TBW1`.
pub const FRAME_MAGIC: u32 = u32::from_le_bytes(*b"TBW1");
/// Magic of [`TensorHeader`]: `TBT1`.
pub const TENSOR_MAGIC: u32 = u32::from_le_bytes(*b"TBT1");
/// Most dimensions a tensor on the wire may have.
pub const MAX_DIMS: usize = 8;

/// The connection greeting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The connecting rank.
    pub rank: u32,
    /// World size as the connecting rank sees it.
    pub world: u32,
    /// Which rail this connection is.
    pub rail: u32,
    /// Rails per peer.
    pub rails: u32,
}

impl Hello {
    /// Encoded size.
    pub const LEN: usize = 20;

    /// Encodes.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.rank.to_le_bytes());
        b[8..12].copy_from_slice(&self.world.to_le_bytes());
        b[12..16].copy_from_slice(&self.rail.to_le_bytes());
        b[16..20].copy_from_slice(&self.rails.to_le_bytes());
        b
    }

    /// Decodes; `from` describes the connection for the error (the peer is unknown yet).
    pub fn decode(b: &[u8; Self::LEN], from: &str) -> Result<Self, TransportError> {
        let magic = u32_at(b, 0);
        if magic != HELLO_MAGIC {
            return Err(TransportError::Bootstrap(format!(
                "connection from {from}: expected hello magic TBH1, found {magic:#010x}"
            )));
        }
        Ok(Hello {
            rank: u32_at(b, 4),
            world: u32_at(b, 8),
            rail: u32_at(b, 12),
            rails: u32_at(b, 16),
        })
    }
}

/// Kind byte of a data stripe.
pub const KIND_DATA: u8 = 1;

/// The header before every stripe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Message sequence number (0, 1, 2, ... per peer and direction).
    pub seq: u64,
    /// Where this stripe starts inside the message.
    pub offset: u64,
    /// Bytes in this stripe.
    pub stripe_len: u64,
    /// Bytes in the whole message.
    pub total_len: u64,
}

impl FrameHeader {
    /// Encoded size.
    pub const LEN: usize = 40;

    /// Encodes.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
        b[4] = KIND_DATA;
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.offset.to_le_bytes());
        b[24..32].copy_from_slice(&self.stripe_len.to_le_bytes());
        b[32..40].copy_from_slice(&self.total_len.to_le_bytes());
        b
    }

    /// Decodes and checks a header from `peer`: magic, kind, the stripe inside the message, the
    /// message no larger than `max_message`.
    pub fn decode(
        b: &[u8; Self::LEN],
        peer: usize,
        max_message: u64,
    ) -> Result<Self, TransportError> {
        let bad = |what: String| TransportError::Malformed { peer, what };
        let magic = u32_at(b, 0);
        if magic != FRAME_MAGIC {
            return Err(bad(format!(
                "expected frame magic TBW1 ({FRAME_MAGIC:#010x}), found {magic:#010x}"
            )));
        }
        if b[4] != KIND_DATA || b[5..8] != [0, 0, 0] {
            return Err(bad(format!(
                "expected frame kind {KIND_DATA} and zero reserved bytes, found {:?}",
                &b[4..8]
            )));
        }
        let h = FrameHeader {
            seq: u64_at(b, 8),
            offset: u64_at(b, 16),
            stripe_len: u64_at(b, 24),
            total_len: u64_at(b, 32),
        };
        if h.total_len > max_message {
            return Err(bad(format!(
                "message {} has {} bytes, more than the maximum {max_message}",
                h.seq, h.total_len
            )));
        }
        match h.offset.checked_add(h.stripe_len) {
            Some(end) if end <= h.total_len => Ok(h),
            _ => Err(bad(format!(
                "message {}: stripe {}..+{} lies outside the message's {} bytes",
                h.seq, h.offset, h.stripe_len, h.total_len
            ))),
        }
    }
}

/// Element types the collectives reduce and the tensor header names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DType {
    /// IEEE binary32.
    F32 = 1,
    /// IEEE binary16.
    F16 = 2,
    /// bfloat16.
    BF16 = 3,
    /// Raw bytes (no arithmetic; all-gather, broadcast and point-to-point only).
    U8 = 4,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::U8 => 1,
        }
    }

    /// The name used in tables and errors.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::U8 => "uint8",
        }
    }

    /// The dtype with wire code `b`.
    pub fn from_code(b: u8) -> Option<Self> {
        match b {
            1 => Some(DType::F32),
            2 => Some(DType::F16),
            3 => Some(DType::BF16),
            4 => Some(DType::U8),
            _ => None,
        }
    }
}

/// The header of a point-to-point tensor message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorHeader {
    /// Element type.
    pub dtype: DType,
    /// Dimensions (at most [`MAX_DIMS`]).
    pub shape: Vec<u64>,
}

impl TensorHeader {
    /// Encoded size of this header.
    pub fn len(&self) -> usize {
        8 + 8 * self.shape.len()
    }

    /// Always false (a header has at least its 8 fixed bytes).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Elements the shape holds, or `None` on overflow.
    pub fn numel(&self) -> Option<u64> {
        self.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d))
    }

    /// Payload bytes, or `None` on overflow.
    pub fn payload_len(&self) -> Option<u64> {
        self.numel()?.checked_mul(self.dtype.size() as u64)
    }

    /// Writes the header into the start of `out` (which must hold [`TensorHeader::len`] bytes).
    pub fn encode_into(&self, out: &mut [u8]) {
        out[0..4].copy_from_slice(&TENSOR_MAGIC.to_le_bytes());
        out[4] = self.dtype as u8;
        out[5] = self.shape.len() as u8;
        out[6] = 0;
        out[7] = 0;
        for (i, d) in self.shape.iter().enumerate() {
            out[8 + 8 * i..16 + 8 * i].copy_from_slice(&d.to_le_bytes());
        }
    }

    /// Decodes the header at the start of a received message `msg` from `peer` and checks that
    /// the message holds exactly the payload the shape and dtype call for. Returns the header and
    /// the payload's offset in `msg`.
    pub fn decode(msg: &[u8], peer: usize) -> Result<(Self, usize), TransportError> {
        let bad = |what: String| TransportError::Malformed { peer, what };
        if msg.len() < 8 {
            return Err(bad(format!(
                "tensor message of {} bytes is shorter than the 8-byte tensor header",
                msg.len()
            )));
        }
        let magic = u32_at(msg, 0);
        if magic != TENSOR_MAGIC {
            return Err(bad(format!(
                "expected tensor magic TBT1 ({TENSOR_MAGIC:#010x}), found {magic:#010x}"
            )));
        }
        let dtype = DType::from_code(msg[4])
            .ok_or_else(|| bad(format!("unknown tensor dtype code {}", msg[4])))?;
        let ndim = msg[5] as usize;
        if ndim > MAX_DIMS {
            return Err(bad(format!(
                "tensor has {ndim} dimensions, at most {MAX_DIMS} allowed"
            )));
        }
        let hlen = 8 + 8 * ndim;
        if msg.len() < hlen {
            return Err(bad(format!(
                "tensor message of {} bytes is shorter than its {hlen}-byte header",
                msg.len()
            )));
        }
        let shape = (0..ndim).map(|i| u64_at(msg, 8 + 8 * i)).collect();
        let h = TensorHeader { dtype, shape };
        let want = h
            .payload_len()
            .ok_or_else(|| bad(format!("tensor shape {:?} overflows", h.shape)))?;
        let have = (msg.len() - hlen) as u64;
        if want != have {
            return Err(bad(format!(
                "tensor {} {:?} needs {want} payload bytes, message carries {have}",
                dtype.name(),
                h.shape
            )));
        }
        Ok((h, hlen))
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_round_trip_and_rejects() {
        let h = FrameHeader {
            seq: 7,
            offset: 16,
            stripe_len: 16,
            total_len: 32,
        };
        let b = h.encode();
        assert_eq!(FrameHeader::decode(&b, 3, 1 << 40).ok(), Some(h));
        let mut bad = b;
        bad[0] = b'X';
        let e = FrameHeader::decode(&bad, 3, 1 << 40)
            .unwrap_err()
            .to_string();
        assert!(e.contains("rank 3") && e.contains("magic"), "{e}");
        let big = FrameHeader { offset: 30, ..h }.encode();
        let e = FrameHeader::decode(&big, 2, 1 << 40)
            .unwrap_err()
            .to_string();
        assert!(e.contains("outside"), "{e}");
        let e = FrameHeader::decode(&b, 2, 8).unwrap_err().to_string();
        assert!(e.contains("maximum"), "{e}");
    }

    #[test]
    fn tensor_header_checks_sizes() {
        let h = TensorHeader {
            dtype: DType::BF16,
            shape: vec![2, 3],
        };
        let mut msg = vec![0u8; h.len() + 12];
        h.encode_into(&mut msg);
        let (d, off) = TensorHeader::decode(&msg, 1).unwrap();
        assert_eq!((d, off), (h.clone(), 24));
        let e = TensorHeader::decode(&msg[..msg.len() - 2], 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("rank 1") && e.contains("needs 12"), "{e}");
        msg[4] = 99;
        assert!(TensorHeader::decode(&msg, 1).is_err());
    }
}
