//! The blob each rank contributes to the bootstrap all-gather: its queue-pair endpoint for every
//! peer it has an RDMA link to, and the settings both ends of a link must agree on. Little-endian:
//!
//! `TBQ1`, version u32 (1), rank u32, world u32, chunk u32, recv_depth u32, then per rank
//! `0..world`: present u8, and when present qpn u32, psn u32, lid u16, gid (16 bytes), qp
//! type u8.

use super::verbs::{QpEndpoint, QpType};
use crate::TransportError;

const MAGIC: &[u8; 4] = b"TBQ1";
const VERSION: u32 = 1;

/// One rank's contribution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpInfo {
    /// The rank.
    pub rank: u32,
    /// World size.
    pub world: u32,
    /// Bounce-buffer (largest SEND) size in bytes.
    pub chunk: u32,
    /// RECVs posted per peer at start (the peer's initial credits).
    pub recv_depth: u32,
    /// Endpoint for each rank (`None` for itself and ranks with no RDMA link).
    pub endpoints: Vec<Option<QpEndpoint>>,
}

impl QpInfo {
    /// Encodes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(24 + self.endpoints.len() * 28);
        out.extend_from_slice(MAGIC);
        for v in [VERSION, self.rank, self.world, self.chunk, self.recv_depth] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for e in &self.endpoints {
            match e {
                None => out.push(0),
                Some(e) => {
                    out.push(1);
                    out.extend_from_slice(&e.qpn.to_le_bytes());
                    out.extend_from_slice(&e.psn.to_le_bytes());
                    out.extend_from_slice(&e.lid.to_le_bytes());
                    out.extend_from_slice(&e.gid);
                    out.push(e.qp_type.code());
                }
            }
        }
        out
    }

    /// Decodes the blob that came from rank `from`, checking it against what this rank expects.
    pub fn decode(blob: &[u8], from: usize, world: usize) -> Result<QpInfo, TransportError> {
        let bad = |what: String| {
            TransportError::Bootstrap(format!("rank {from}'s RDMA queue-pair info: {what}"))
        };
        let mut r = Reader { buf: blob, pos: 0 };
        let short = || bad(format!("truncated at {} bytes", blob.len()));
        if r.take(4).ok_or_else(short)? != MAGIC {
            return Err(bad("bad magic (not a tb RDMA blob)".into()));
        }
        let version = r.u32().ok_or_else(short)?;
        if version != VERSION {
            return Err(bad(format!("version {version}, expected {VERSION}")));
        }
        let rank = r.u32().ok_or_else(short)?;
        let w = r.u32().ok_or_else(short)?;
        if rank as usize != from || w as usize != world {
            return Err(bad(format!(
                "says rank {rank} of {w}, expected rank {from} of {world}"
            )));
        }
        let chunk = r.u32().ok_or_else(short)?;
        let recv_depth = r.u32().ok_or_else(short)?;
        let mut endpoints = Vec::with_capacity(world);
        for _ in 0..world {
            match r.take(1).ok_or_else(short)?[0] {
                0 => endpoints.push(None),
                1 => {
                    let qpn = r.u32().ok_or_else(short)?;
                    let psn = r.u32().ok_or_else(short)?;
                    let lid = r.u16().ok_or_else(short)?;
                    let mut gid = [0u8; 16];
                    gid.copy_from_slice(r.take(16).ok_or_else(short)?);
                    let code = r.take(1).ok_or_else(short)?[0];
                    let qp_type = QpType::from_code(code)
                        .ok_or_else(|| bad(format!("queue-pair type {code}")))?;
                    endpoints.push(Some(QpEndpoint {
                        qpn,
                        psn,
                        lid,
                        gid,
                        qp_type,
                    }));
                }
                other => return Err(bad(format!("entry flag {other}"))),
            }
        }
        if r.pos != blob.len() {
            return Err(bad(format!("{} trailing bytes", blob.len() - r.pos)));
        }
        Ok(QpInfo {
            rank,
            world: w,
            chunk,
            recv_depth,
            endpoints,
        })
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.buf.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }
    fn u32(&mut self) -> Option<u32> {
        let s = self.take(4)?;
        Some(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u16(&mut self) -> Option<u16> {
        let s = self.take(2)?;
        Some(u16::from_le_bytes([s[0], s[1]]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_names_the_rank_on_errors() {
        let info = QpInfo {
            rank: 1,
            world: 3,
            chunk: 4096,
            recv_depth: 32,
            endpoints: vec![
                Some(QpEndpoint {
                    qpn: 0x123,
                    psn: 7,
                    lid: 0,
                    gid: [9; 16],
                    qp_type: QpType::Uc,
                }),
                None,
                None,
            ],
        };
        let blob = info.encode();
        assert_eq!(QpInfo::decode(&blob, 1, 3).ok(), Some(info));
        let err = QpInfo::decode(&blob, 2, 3).unwrap_err().to_string();
        assert!(err.contains("rank 2"), "{err}");
        let err = QpInfo::decode(&blob[..blob.len() - 3], 1, 3)
            .unwrap_err()
            .to_string();
        assert!(err.contains("truncated"), "{err}");
        assert!(QpInfo::decode(b"nope", 1, 3).is_err());
    }
}
