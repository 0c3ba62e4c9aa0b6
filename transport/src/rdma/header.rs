//! The 24-byte header at the start of every SEND the RDMA transport posts (all little-endian):
//!
//! | bytes | field |
//! | --- | --- |
//! | 0 | kind: 1 = data chunk, 2 = credits only |
//! | 1 | flags: bit 0 first chunk of a message, bit 1 last chunk |
//! | 2..4 | credits: RECVs the sender re-posted for us since its last message (piggybacked) |
//! | 4..8 | seq: this SEND's number on the (sender → receiver) queue pair, from 0 |
//! | 8..12 | payload length after the header |
//! | 12..16 | message number on the (sender → receiver) direction, from 0 |
//! | 16..24 | the message's total length |
//!
//! `seq` makes a SEND that UC lost visible at the next arrival instead of corrupting a message.

use crate::TransportError;

/// Encoded size.
pub const HEADER_LEN: usize = 24;

/// A data chunk.
pub const KIND_DATA: u8 = 1;
/// A credit return with no payload.
pub const KIND_CREDIT: u8 = 2;
/// First chunk of a message.
pub const FLAG_FIRST: u8 = 1;
/// Last chunk of a message.
pub const FLAG_LAST: u8 = 2;

/// A decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// [`KIND_DATA`] or [`KIND_CREDIT`].
    pub kind: u8,
    /// [`FLAG_FIRST`] | [`FLAG_LAST`].
    pub flags: u8,
    /// Piggybacked credits.
    pub credits: u16,
    /// SEND sequence number.
    pub seq: u32,
    /// Payload bytes after the header.
    pub payload: u32,
    /// Message number.
    pub msg: u32,
    /// Total message length.
    pub total: u64,
}

impl Header {
    /// Writes the header into `out[..HEADER_LEN]`.
    pub fn encode(&self, out: &mut [u8]) {
        out[0] = self.kind;
        out[1] = self.flags;
        out[2..4].copy_from_slice(&self.credits.to_le_bytes());
        out[4..8].copy_from_slice(&self.seq.to_le_bytes());
        out[8..12].copy_from_slice(&self.payload.to_le_bytes());
        out[12..16].copy_from_slice(&self.msg.to_le_bytes());
        out[16..24].copy_from_slice(&self.total.to_le_bytes());
    }

    /// Decodes and checks a received SEND of `byte_len` bytes from `peer`.
    pub fn decode(buf: &[u8], byte_len: usize, peer: usize) -> Result<Header, TransportError> {
        let bad = |what: String| TransportError::Malformed { peer, what };
        if byte_len < HEADER_LEN || buf.len() < byte_len {
            return Err(bad(format!(
                "RDMA SEND of {byte_len} bytes, shorter than the {HEADER_LEN}-byte header"
            )));
        }
        let u32_at = |i: usize| u32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
        let mut total = [0u8; 8];
        total.copy_from_slice(&buf[16..24]);
        let h = Header {
            kind: buf[0],
            flags: buf[1],
            credits: u16::from_le_bytes([buf[2], buf[3]]),
            seq: u32_at(4),
            payload: u32_at(8),
            msg: u32_at(12),
            total: u64::from_le_bytes(total),
        };
        if h.kind != KIND_DATA && h.kind != KIND_CREDIT {
            return Err(bad(format!("RDMA header kind {}: expected 1 or 2", h.kind)));
        }
        if h.flags & !(FLAG_FIRST | FLAG_LAST) != 0 {
            return Err(bad(format!("RDMA header flags {:#x}", h.flags)));
        }
        if h.payload as usize != byte_len - HEADER_LEN {
            return Err(bad(format!(
                "RDMA header says {} payload bytes, the SEND carried {}",
                h.payload,
                byte_len - HEADER_LEN
            )));
        }
        if h.kind == KIND_CREDIT && h.payload != 0 {
            return Err(bad(format!(
                "RDMA credit message with {} payload bytes",
                h.payload
            )));
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_garbage() {
        let h = Header {
            kind: KIND_DATA,
            flags: FLAG_FIRST | FLAG_LAST,
            credits: 9,
            seq: 77,
            payload: 5,
            msg: 3,
            total: 5,
        };
        let mut buf = [0u8; 64];
        h.encode(&mut buf);
        assert_eq!(Header::decode(&buf, HEADER_LEN + 5, 2).ok(), Some(h));
        let err = Header::decode(&buf, HEADER_LEN + 6, 2).unwrap_err();
        assert_eq!(err.peer(), Some(2));
        assert!(err.to_string().contains("payload"), "{err}");
        assert!(Header::decode(&buf, 3, 2).is_err());
        buf[0] = 9;
        assert!(Header::decode(&buf, HEADER_LEN + 5, 2).is_err());
    }
}
