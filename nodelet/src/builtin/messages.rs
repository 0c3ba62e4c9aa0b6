//! What pipeline stages say to each other over the transport. Every step is a control message
//! (a `u8` tensor holding a [`Step`]) and, for [`Op::Forward`] and [`Op::Batch`], an `f32`
//! tensor `[tokens, hidden]` with the activation (for a batch, the rows of its sequences one
//! after another, in the order of its entries). Messages flow rank 0 → 1 → … → last; the last
//! stage answers rank 0 directly with [`Op::Token`], [`Op::Tokens`] or [`Op::Error`].

use tb_engine::sample::SamplingParams;

use tb_transport::TransportError;
use tb_transport::collectives::Communicator;
use tb_transport::wire::DType;

/// Control messages are at most this long (header + an error message).
pub const MAX_CONTROL: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    /// Run `tokens` positions of sequence `seq` from `pos`; an activation follows.
    Forward = 1,
    /// Forget sequence `seq` (its KV cache and sampler).
    Release = 2,
    /// The last stage's pick for sequence `seq` (back to rank 0).
    Token = 3,
    /// A stage failed this step of `seq`; the message says why (passed on to rank 0).
    Error = 4,
    /// Stop serving (rank 0 is shutting down).
    Shutdown = 5,
    /// One step of several sequences ([`Step::entries`]), run as one forward pass; an activation
    /// with every entry's rows follows.
    Batch = 6,
    /// The last stage's answers to a batch (back to rank 0): one entry per sequence that got
    /// through, with its token when [`BatchEntry::sample`] was set.
    Tokens = 7,
    /// Are you there: passed on by every stage, and by the last back to rank 0. Rank 0 sends
    /// one when the pipeline has been idle for a while, so that a broken link or a stage gone
    /// silent is found without waiting for a request.
    Ping = 8,
    /// Start sequence `seq` with the first `pos` positions of sequence `seed`'s KV cache (a
    /// shared prefix, [`super::prefix`]): [`Step::fork`]. Passed on by every stage; nobody
    /// answers.
    Fork = 9,
}

/// One sequence's part of an [`Op::Batch`] or [`Op::Tokens`] step.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchEntry {
    pub seq: u64,
    pub pos: u32,
    /// Rows of the activation that belong to this sequence.
    pub tokens: u32,
    /// The sampled token ([`Op::Tokens`]).
    pub token: u32,
    /// Whether the last stage samples a token after this step (false for a prefill chunk
    /// that is not the prompt's last: its logits are not wanted and sampling would advance the
    /// sequence's random state).
    pub sample: bool,
    /// Sampling of this sequence; the last stage reads it when `pos == 0`.
    pub temperature: f32,
    pub top_p: f32,
    pub seed: u64,
}

const ENTRY: usize = 40;

/// Entries that fit one control message.
pub const MAX_BATCH_ENTRIES: usize = (MAX_CONTROL - HEADER) / ENTRY;

impl BatchEntry {
    pub fn new(
        seq: u64,
        pos: usize,
        tokens: usize,
        sample: bool,
        sampling: &SamplingParams,
    ) -> Self {
        BatchEntry {
            seq,
            pos: pos as u32,
            tokens: tokens as u32,
            token: 0,
            sample,
            temperature: sampling.temperature,
            top_p: sampling.top_p,
            seed: sampling.seed,
        }
    }

    pub fn sampling(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            seed: self.seed,
            ..SamplingParams::default()
        }
    }

    fn encode(&self, b: &mut Vec<u8>) {
        b.extend_from_slice(&self.seq.to_le_bytes());
        b.extend_from_slice(&self.pos.to_le_bytes());
        b.extend_from_slice(&self.tokens.to_le_bytes());
        b.extend_from_slice(&self.token.to_le_bytes());
        b.extend_from_slice(&u32::from(self.sample).to_le_bytes());
        b.extend_from_slice(&self.temperature.to_le_bytes());
        b.extend_from_slice(&self.top_p.to_le_bytes());
        b.extend_from_slice(&self.seed.to_le_bytes());
    }

    fn decode(b: &[u8]) -> BatchEntry {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(x)
        };
        BatchEntry {
            seq: u64_at(0),
            pos: u32_at(8),
            tokens: u32_at(12),
            token: u32_at(16),
            sample: u32_at(20) != 0,
            temperature: f32::from_bits(u32_at(24)),
            top_p: f32::from_bits(u32_at(28)),
            seed: u64_at(32),
        }
    }
}

/// One control message.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub op: Op,
    pub seq: u64,
    pub pos: u32,
    pub tokens: u32,
    /// The sampled token ([`Op::Token`]).
    pub token: u32,
    /// Sampling of this sequence; the last stage reads it when `pos == 0`.
    pub temperature: f32,
    pub top_p: f32,
    pub seed: u64,
    /// Why ([`Op::Error`]).
    pub message: String,
    /// The sequences of an [`Op::Batch`] or [`Op::Tokens`] step (at most
    /// [`MAX_BATCH_ENTRIES`]); `tokens` is then the sum of theirs.
    pub entries: Vec<BatchEntry>,
}

const HEADER: usize = 40;

impl Step {
    pub fn new(op: Op, seq: u64) -> Step {
        Step {
            op,
            seq,
            pos: 0,
            tokens: 0,
            token: 0,
            temperature: 0.0,
            top_p: 1.0,
            seed: 0,
            message: String::new(),
            entries: Vec::new(),
        }
    }

    /// A batch of `entries` (rows of the activation in their order), or their answers with
    /// `op` = [`Op::Tokens`].
    pub fn batch(op: Op, entries: Vec<BatchEntry>) -> Step {
        Step {
            tokens: entries.iter().map(|e| e.tokens).sum(),
            entries,
            ..Step::new(op, 0)
        }
    }

    pub fn forward(seq: u64, pos: usize, tokens: usize, sampling: &SamplingParams) -> Step {
        Step {
            pos: pos as u32,
            tokens: tokens as u32,
            temperature: sampling.temperature,
            top_p: sampling.top_p,
            seed: sampling.seed,
            ..Step::new(Op::Forward, seq)
        }
    }

    /// [`Op::Fork`]: `to` starts with the first `len` positions of `from` (carried in `seed`).
    pub fn fork(from: u64, to: u64, len: usize) -> Step {
        Step {
            pos: len as u32,
            seed: from,
            ..Step::new(Op::Fork, to)
        }
    }

    pub fn error(seq: u64, message: impl Into<String>) -> Step {
        Step {
            message: message.into(),
            ..Step::new(Op::Error, seq)
        }
    }

    pub fn sampling(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            seed: self.seed,
            ..SamplingParams::default()
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER + self.message.len());
        b.push(self.op as u8);
        b.extend_from_slice(&[0; 3]);
        b.extend_from_slice(&self.pos.to_le_bytes());
        b.extend_from_slice(&self.seq.to_le_bytes());
        b.extend_from_slice(&self.tokens.to_le_bytes());
        b.extend_from_slice(&self.token.to_le_bytes());
        b.extend_from_slice(&self.temperature.to_le_bytes());
        b.extend_from_slice(&self.top_p.to_le_bytes());
        b.extend_from_slice(&self.seed.to_le_bytes());
        if matches!(self.op, Op::Batch | Op::Tokens) {
            // The sender keeps batches within MAX_BATCH_ENTRIES; a longer list is cut here
            // and then refused by the receiver (its rows no longer add up).
            for e in self.entries.iter().take(MAX_BATCH_ENTRIES) {
                e.encode(&mut b);
            }
            return b;
        }
        let room = MAX_CONTROL - HEADER;
        let mut end = self.message.len().min(room);
        while !self.message.is_char_boundary(end) {
            end -= 1;
        }
        b.extend_from_slice(&self.message.as_bytes()[..end]);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Step, String> {
        if b.len() < HEADER {
            return Err(format!(
                "control message of {} bytes, at least {HEADER} expected",
                b.len()
            ));
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(x)
        };
        let op = match b[0] {
            1 => Op::Forward,
            2 => Op::Release,
            3 => Op::Token,
            4 => Op::Error,
            5 => Op::Shutdown,
            6 => Op::Batch,
            7 => Op::Tokens,
            8 => Op::Ping,
            9 => Op::Fork,
            other => return Err(format!("unknown op {other}")),
        };
        let mut entries = Vec::new();
        if matches!(op, Op::Batch | Op::Tokens) {
            let body = &b[HEADER..];
            if !body.len().is_multiple_of(ENTRY) {
                return Err(format!(
                    "batch of {} bytes, not a whole number of {ENTRY}-byte entries",
                    body.len()
                ));
            }
            entries = body.chunks_exact(ENTRY).map(BatchEntry::decode).collect();
            let rows: u64 = entries
                .iter()
                .map(|e: &BatchEntry| u64::from(e.tokens))
                .sum();
            if rows != u64::from(u32_at(16)) {
                return Err(format!(
                    "batch entries hold {rows} rows, the header says {}",
                    u32_at(16)
                ));
            }
        }
        Ok(Step {
            entries,
            op,
            pos: u32_at(4),
            seq: u64_at(8),
            tokens: u32_at(16),
            token: u32_at(20),
            temperature: f32::from_bits(u32_at(24)),
            top_p: f32::from_bits(u32_at(28)),
            seed: u64_at(32),
            message: if matches!(op, Op::Batch | Op::Tokens) {
                String::new()
            } else {
                String::from_utf8_lossy(&b[HEADER..]).into_owned()
            },
        })
    }
}

/// Sends a control message to `peer`.
pub fn send_step(comm: &mut Communicator, peer: usize, step: &Step) -> Result<(), TransportError> {
    let b = step.encode();
    comm.send_tensor(peer, DType::U8, &[b.len() as u64], &b)
}

/// Receives a control message from `peer`; a wrong dtype or a garbled header is `Malformed`.
pub fn recv_step(comm: &mut Communicator, peer: usize) -> Result<Step, TransportError> {
    let (h, payload) = comm.recv_tensor(peer, MAX_CONTROL)?;
    if h.dtype != DType::U8 {
        return Err(TransportError::Malformed {
            peer,
            what: format!("control message of dtype {}, expected u8", h.dtype.name()),
        });
    }
    Step::decode(&payload).map_err(|what| TransportError::Malformed { peer, what })
}

/// Sends an activation `[tokens, hidden]` as f32.
pub fn send_activation(
    comm: &mut Communicator,
    peer: usize,
    act: &tb_engine::shard::Activation,
) -> Result<(), TransportError> {
    comm.send_tensor(
        peer,
        DType::F32,
        &[act.tokens as u64, act.hidden as u64],
        &act.to_le_bytes(),
    )
}

/// Receives an activation of `tokens` × `hidden` f32 from `peer`, checking its shape.
pub fn recv_activation(
    comm: &mut Communicator,
    peer: usize,
    tokens: usize,
    hidden: usize,
) -> Result<tb_engine::shard::Activation, TransportError> {
    let (h, payload) = comm.recv_tensor(peer, tokens * hidden * 4)?;
    if h.dtype != DType::F32 || h.shape != [tokens as u64, hidden as u64] {
        return Err(TransportError::Malformed {
            peer,
            what: format!(
                "activation {} {:?}, expected f32 [{tokens}, {hidden}]",
                h.dtype.name(),
                h.shape
            ),
        });
    }
    tb_engine::shard::Activation::from_le_bytes(tokens, hidden, &payload).map_err(|e| {
        TransportError::Malformed {
            peer,
            what: e.to_string(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_round_trip() {
        let mut s = Step::forward(
            7,
            12,
            3,
            &SamplingParams {
                temperature: 0.7,
                top_p: 0.9,
                seed: 42,
                ..SamplingParams::default()
            },
        );
        s.token = 99;
        assert_eq!(Step::decode(&s.encode()), Ok(s));
        let e = Step::error(3, "é".repeat(5000));
        let back = Step::decode(&e.encode()).expect("decodes");
        assert_eq!(back.op, Op::Error);
        assert!(back.message.len() <= MAX_CONTROL - HEADER && back.message.starts_with('é'));
        let f = Step::fork(1 << 63, 12, 300);
        assert_eq!(Step::decode(&f.encode()), Ok(f));
        assert!(Step::decode(&[200; 40]).unwrap_err().contains("unknown op"));
        assert!(Step::decode(&[1; 10]).unwrap_err().contains("at least"));
    }

    #[test]
    fn batches_round_trip() {
        let sampling = SamplingParams {
            temperature: 0.5,
            top_p: 0.8,
            seed: 7,
            ..SamplingParams::default()
        };
        let entries: Vec<BatchEntry> = (0..MAX_BATCH_ENTRIES as u64)
            .map(|i| {
                BatchEntry::new(
                    i + 1,
                    i as usize * 3,
                    1 + i as usize % 2,
                    i % 3 != 0,
                    &sampling,
                )
            })
            .collect();
        let s = Step::batch(Op::Batch, entries);
        assert!(s.encode().len() <= MAX_CONTROL);
        assert_eq!(Step::decode(&s.encode()), Ok(s.clone()));
        let mut reply = Step::batch(Op::Tokens, s.entries[..2].to_vec());
        reply.entries[1].token = 4242;
        assert_eq!(Step::decode(&reply.encode()), Ok(reply));
        let mut bad = s.encode();
        bad.pop();
        assert!(Step::decode(&bad).unwrap_err().contains("whole number"));
        let mut lying = Step::batch(Op::Batch, s.entries[..3].to_vec());
        lying.tokens += 1;
        assert!(Step::decode(&lying.encode()).unwrap_err().contains("rows"));
    }
}
