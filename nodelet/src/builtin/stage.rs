//! A pipeline stage after the first (rank ≥ 1): receive a step from the rank before, run this
//! shard's blocks, and pass the activation on — or, on the last stage, sample the next token
//! and send it back to rank 0. An [`Op::Batch`] step carries several sequences whose rows run
//! as one forward pass ([`Shard::forward_batch`]); the last stage answers it with one
//! [`Op::Tokens`] message. Failures of a step travel down the pipeline as [`Op::Error`] so
//! that rank 0 hears of them on the one connection it waits on; a broken transport ends the
//! stage (the supervisor and the scheduler restart the gang).

use std::collections::HashMap;
use std::time::Duration;

use tb_engine::sample::Sampler;
use tb_engine::shard::{Activation, BatchItem, Shard, StageInput, StageOutput};

use super::messages::{
    BatchEntry, Op, Step, recv_activation, recv_step, send_activation, send_step,
};
use tb_transport::TransportError;
use tb_transport::collectives::Communicator;

/// How long a stage waits for the next request: services idle for long; a dead neighbour is
/// noticed at once anyway (the connection closes).
pub const IDLE_WAIT: Duration = Duration::from_secs(7 * 24 * 3600);

/// Serves steps until rank 0 says [`Op::Shutdown`] or the transport fails.
pub fn serve(
    comm: &mut Communicator,
    shard: &mut Shard,
    step_timeout: Duration,
) -> Result<(), TransportError> {
    let rank = comm.rank();
    let world = comm.world();
    let (prev, last) = (rank - 1, rank + 1 == world);
    let next = if last { 0 } else { rank + 1 };
    let hidden = shard.config().hidden;
    let mut samplers: HashMap<u64, Sampler> = HashMap::new();
    loop {
        let step = with_timeout(comm, IDLE_WAIT, |c| recv_step(c, prev))?;
        match step.op {
            Op::Forward => {
                let act = with_timeout(comm, step_timeout, |c| {
                    recv_activation(c, prev, step.tokens as usize, hidden)
                })?;
                let out = shard.forward(step.seq, StageInput::Hidden(act), step.pos as usize);
                let reply = match (out, last) {
                    (Ok(StageOutput::Hidden(a)), false) => {
                        send_step(comm, next, &step)?;
                        send_activation(comm, next, &a)?;
                        continue;
                    }
                    (Ok(StageOutput::Logits(l)), true) => {
                        if step.pos == 0 {
                            samplers.insert(step.seq, Sampler::new(&step.sampling()));
                        }
                        let sampler = samplers
                            .entry(step.seq)
                            .or_insert_with(|| Sampler::new(&step.sampling()));
                        Step {
                            token: sampler.sample(&l),
                            ..Step::new(Op::Token, step.seq)
                        }
                    }
                    (Ok(_), _) => Step::error(
                        step.seq,
                        format!("stage {rank}: its shard's output does not fit its place"),
                    ),
                    (Err(e), _) => Step::error(step.seq, format!("stage {rank}: {e}")),
                };
                send_step(comm, next, &reply)?;
            }
            Op::Batch => {
                let act = with_timeout(comm, step_timeout, |c| {
                    recv_activation(c, prev, step.tokens as usize, hidden)
                })?;
                run_batch(comm, shard, &mut samplers, step.entries, act, next, last)?;
            }
            Op::Release => {
                shard.drop_sequence(step.seq);
                samplers.remove(&step.seq);
                if !last {
                    send_step(comm, next, &step)?;
                }
            }
            Op::Fork => {
                // A prefix that failed to run here failed on rank 0's side too: that request
                // is answered there; the fork is only skipped.
                if let Err(e) = shard.fork_sequence(step.seed, step.seq, step.pos as usize) {
                    tracing::debug!("stage {rank}: sharing a prefix: {e}");
                }
                if !last {
                    send_step(comm, next, &step)?;
                }
            }
            Op::Error => send_step(comm, next, &step)?,
            // On to the next stage; the last stage's `next` is rank 0.
            Op::Ping => send_step(comm, next, &step)?,
            Op::Shutdown => {
                if !last {
                    send_step(comm, next, &step)?;
                }
                return Ok(());
            }
            Op::Token | Op::Tokens => {
                return Err(TransportError::Malformed {
                    peer: prev,
                    what: format!("a {:?} step travelling forward", step.op),
                });
            }
        }
    }
}

/// One batched step: splits the activation into the entries' rows, runs them as one pass, sends
/// an [`Op::Error`] on for every entry that failed and the rest on as a smaller batch — or, on
/// the last stage, samples each entry that asks for it and answers rank 0 with one
/// [`Op::Tokens`].
fn run_batch(
    comm: &mut Communicator,
    shard: &mut Shard,
    samplers: &mut HashMap<u64, Sampler>,
    entries: Vec<BatchEntry>,
    act: Activation,
    next: usize,
    last: bool,
) -> Result<(), TransportError> {
    let rank = comm.rank();
    let hidden = act.hidden;
    let mut items = Vec::with_capacity(entries.len());
    let mut row = 0;
    for e in &entries {
        let n = e.tokens as usize;
        items.push(BatchItem {
            seq: e.seq,
            input: StageInput::Hidden(Activation {
                tokens: n,
                hidden,
                data: act.data[row * hidden..(row + n) * hidden].to_vec(),
            }),
            pos: e.pos as usize,
        });
        row += n;
    }
    let outs = shard.forward_batch(items);
    let mut passed = Vec::with_capacity(entries.len());
    let mut rows = Vec::new();
    for (mut e, out) in entries.into_iter().zip(outs) {
        match (out, last) {
            (Ok(StageOutput::Hidden(a)), false) => {
                rows.extend_from_slice(&a.data);
                passed.push(e);
            }
            (Ok(StageOutput::Logits(l)), true) => {
                if e.pos == 0 {
                    samplers.insert(e.seq, Sampler::new(&e.sampling()));
                }
                if e.sample {
                    let sampling = e.sampling();
                    e.token = samplers
                        .entry(e.seq)
                        .or_insert_with(|| Sampler::new(&sampling))
                        .sample(&l);
                }
                passed.push(e);
            }
            (Ok(_), _) => send_step(
                comm,
                next,
                &Step::error(
                    e.seq,
                    format!("stage {rank}: its shard's output does not fit its place"),
                ),
            )?,
            (Err(err), _) => send_step(
                comm,
                next,
                &Step::error(e.seq, format!("stage {rank}: {err}")),
            )?,
        }
    }
    if passed.is_empty() {
        return Ok(());
    }
    if last {
        return send_step(comm, next, &Step::batch(Op::Tokens, passed));
    }
    let step = Step::batch(Op::Batch, passed);
    let act = Activation {
        tokens: step.tokens as usize,
        hidden,
        data: rows,
    };
    send_step(comm, next, &step)?;
    send_activation(comm, next, &act)
}

/// Runs `f` with the communicator's timeout set to `t`, then restores it.
pub fn with_timeout<T>(
    comm: &mut Communicator,
    t: Duration,
    f: impl FnOnce(&mut Communicator) -> Result<T, TransportError>,
) -> Result<T, TransportError> {
    let before = comm.options().clone();
    let mut opts = before.clone();
    opts.timeout = t;
    comm.set_options(opts);
    let r = f(comm);
    comm.set_options(before);
    r
}
