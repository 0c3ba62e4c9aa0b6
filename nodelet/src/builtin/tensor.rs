//! Tensor parallelism in the built-in executor (`tb-shard --tensor-parallel`): the ranks of a
//! service form one stage, each holding its slice of every block ([`tb_engine::tp`]: whole
//! KV-head groups and 32-aligned MLP runs), and they sum their partial outputs with tb's ring
//! all-reduce after attention and after the MLP of every block ([`TransportAllReduce`]).
//!
//! Rank 0 is the driver as in a one-stage service — it takes requests, schedules the batch,
//! samples and streams — and before each step it tells the other ranks, its followers, what to
//! run: the same [`Op::Batch`] entries (sequence, position, row count) followed by the token ids
//! ([`Followers`]). Every rank embeds the same tokens (the embedding is replicated) and runs
//! the same batch in the same order, so every all-reduce of a step pairs up across the ranks;
//! the ring gives every rank the same bits of each sum, so the residual stream stays identical
//! on every rank. Followers drop a sequence when rank 0 says [`Op::Release`] and stop at
//! [`Op::Shutdown`] ([`follow`]). Only rank 0 computes logits (the head is not split).
//!
//! The followers' control messages and the all-reduces share one communicator (one transport
//! per rank, as in a pipeline); a mutex hands it between the driver and the shard's
//! all-reduces, which never overlap in time on a rank.

use std::sync::{Arc, Mutex, MutexGuard};

use tb_engine::error::EngineError;
use tb_engine::shard::{BatchItem, Shard, StageInput};
use tb_engine::tp::AllReduce;
use tb_transport::TransportError;
use tb_transport::collectives::Communicator;
use tb_transport::wire::DType;

use super::messages::{BatchEntry, MAX_BATCH_ENTRIES, Op, Step, recv_step, send_step};
use super::stage::{IDLE_WAIT, with_timeout};

/// The communicator of a tensor-parallel group, shared by the driver (or follower loop) and
/// the shard's all-reduces.
pub type SharedComm = Arc<Mutex<Communicator>>;

fn lock(comm: &SharedComm) -> MutexGuard<'_, Communicator> {
    comm.lock().unwrap_or_else(|e| e.into_inner())
}

/// The shard's [`AllReduce`] over tb-transport (ring reduce-scatter + all-gather: every rank
/// ends with the same bits).
pub struct TransportAllReduce {
    comm: SharedComm,
    bytes: Vec<u8>,
}

impl TransportAllReduce {
    pub fn new(comm: SharedComm) -> Self {
        TransportAllReduce {
            comm,
            bytes: Vec::new(),
        }
    }
}

impl AllReduce for TransportAllReduce {
    fn all_reduce_sum(&mut self, data: &mut [f32]) -> tb_engine::error::Result<()> {
        self.bytes.clear();
        self.bytes.extend(data.iter().flat_map(|v| v.to_le_bytes()));
        lock(&self.comm)
            .all_reduce(&mut self.bytes, DType::F32)
            .map_err(|e| EngineError::TensorParallel {
                detail: format!("all-reduce: {e}"),
            })?;
        for (v, b) in data.iter_mut().zip(self.bytes.chunks_exact(4)) {
            *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        Ok(())
    }
}

/// Rank 0's line to the other ranks of its tensor-parallel group.
pub struct Followers {
    comm: SharedComm,
}

impl Followers {
    pub fn new(comm: SharedComm) -> Self {
        Followers { comm }
    }

    fn each(
        &self,
        f: impl Fn(&mut Communicator, usize) -> Result<(), TransportError>,
    ) -> Result<(), TransportError> {
        let mut comm = lock(&self.comm);
        for peer in 1..comm.world() {
            f(&mut comm, peer)?;
        }
        Ok(())
    }

    /// Tells every follower to run `entries` (one per sequence, in order) on `tokens` (each
    /// entry's rows, concatenated).
    pub fn batch(&self, entries: &[BatchEntry], tokens: &[u32]) -> Result<(), TransportError> {
        let step = Step::batch(Op::Batch, entries.to_vec());
        let ids: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        self.each(|c, peer| {
            send_step(c, peer, &step)?;
            c.send_tensor(peer, DType::U8, &[ids.len() as u64], &ids)
        })
    }

    /// Tells every follower to forget `seq`.
    pub fn release(&self, seq: u64) -> Result<(), TransportError> {
        self.each(|c, peer| send_step(c, peer, &Step::new(Op::Release, seq)))
    }

    /// Tells every follower to start `to` from the first `len` positions of `from`.
    pub fn fork(&self, from: u64, to: u64, len: usize) -> Result<(), TransportError> {
        self.each(|c, peer| send_step(c, peer, &Step::fork(from, to, len)))
    }

    /// Tells every follower to stop.
    pub fn shutdown(&self) {
        let _ = self.each(|c, peer| send_step(c, peer, &Step::new(Op::Shutdown, 0)));
    }
}

/// A follower (rank ≥ 1): runs what rank 0 says until it says stop or the transport fails.
pub fn follow(comm: &SharedComm, shard: &mut Shard) -> Result<(), TransportError> {
    loop {
        let step = {
            let mut c = lock(comm);
            with_timeout(&mut c, IDLE_WAIT, |c| recv_step(c, 0))?
        };
        match step.op {
            Op::Batch => {
                let rows: usize = step.entries.iter().map(|e| e.tokens as usize).sum();
                if step.entries.len() > MAX_BATCH_ENTRIES || rows != step.tokens as usize {
                    return Err(TransportError::Malformed {
                        peer: 0,
                        what: format!(
                            "a batch of {} entries and {} rows, entries summing to {rows}",
                            step.entries.len(),
                            step.tokens
                        ),
                    });
                }
                let ids = {
                    let mut c = lock(comm);
                    let (_, ids) = c.recv_tensor(0, rows * 4)?;
                    ids
                };
                if ids.len() != rows * 4 {
                    return Err(TransportError::Malformed {
                        peer: 0,
                        what: format!("{} bytes of token ids for {rows} rows", ids.len()),
                    });
                }
                let mut tokens = ids
                    .chunks_exact(4)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                let items: Vec<BatchItem> = step
                    .entries
                    .iter()
                    .map(|e| BatchItem {
                        seq: e.seq,
                        input: StageInput::Tokens(
                            tokens.by_ref().take(e.tokens as usize).collect(),
                        ),
                        pos: e.pos as usize,
                    })
                    .collect();
                // Outputs are rank 0's to use; a failed item failed on rank 0 too (the same
                // inputs), which handles it.
                for out in shard.forward_batch(items) {
                    if let Err(e) = out {
                        tracing::debug!("a follower's step failed: {e}");
                    }
                }
            }
            Op::Release => shard.drop_sequence(step.seq),
            Op::Fork => {
                if let Err(e) = shard.fork_sequence(step.seed, step.seq, step.pos as usize) {
                    tracing::debug!("a follower sharing a prefix: {e}");
                }
            }
            Op::Shutdown => return Ok(()),
            Op::Ping => {}
            other => {
                return Err(TransportError::Malformed {
                    peer: 0,
                    what: format!("{other:?} sent to a tensor-parallel follower"),
                });
            }
        }
    }
}
