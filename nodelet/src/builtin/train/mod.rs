//! `tb-train`: one rank of a built-in LoRA fine-tune (a TrainingJob with `executor: builtin`).
//! Data parallel: every rank holds the whole model ([`tb_engine::train::Trainer`]), takes its
//! share of each global batch (items rank, rank + world, ... of it), and the ranks sum their
//! gradients and token counts over tb-transport before every rank applies the same update —
//! so the result is that of the whole batch on one Mac.
//!
//! - [`dataset`]: the rank's examples, from the file or staged from the Node that holds it;
//! - [`group`]: the ranks' collectives (bootstrap as `tb-shard`, bucketed all-reduce);
//! - [`train_step`]: one step of a rank (its share forward and backward, the all-reduce, the
//!   update), also what `tb-trainbench-dp` measures;
//! - [`checkpoints`]: `step-N` checkpoints, saved whole and pruned; resumed from
//!   TB_RESUME_FROM;
//! - [`progress`]: rank 0's progress file, which the nodelet passes on to the job's status.
//!
//! Order of work: the tokenizer and the dataset first (a bad line fails the job in a second,
//! naming file and line), then the weights, then the other ranks.

pub mod checkpoints;
pub mod dataset;
pub mod group;
pub mod progress;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use tb_api::specs::{FineTuneSpec, LoraTarget, LrSchedule};
use tb_engine::adapter::{LoraConfig, Target};
use tb_engine::chat::ChatTemplate;
use tb_engine::gguf::GgufIndex;
use tb_engine::shard::default_device;
use tb_engine::tokenizer::Tokenizer;
use tb_engine::train::data::{Batches, split_eval};
use tb_engine::train::{Applied, Example, StepLoss, TrainConfig, Trainer};
use tb_transport::{Preference, TransportError};

use super::StartError;
use group::Group;
use progress::Progress;

/// One rank of a built-in fine-tune.
#[derive(Debug, Clone)]
pub struct TrainOptions {
    pub model_path: PathBuf,
    /// The Model's name (the adapter's base model).
    pub model_name: String,
    pub rank: usize,
    /// Every rank's data-plane IP, in rank order.
    pub hosts: Vec<IpAddr>,
    /// Rank 0's bootstrap coordinator.
    pub coordinator: SocketAddr,
    /// The JSONL file (the holder's path when `dataset_source` is set).
    pub dataset: PathBuf,
    /// The holder's staging address, when this rank fetches its examples from there.
    pub dataset_source: Option<SocketAddr>,
    pub finetune: FineTuneSpec,
    /// Where rank 0 writes the PEFT adapter.
    pub output: PathBuf,
    /// TB_CHECKPOINT_DIR and TB_CHECKPOINT_EVERY_STEPS.
    pub checkpoint_dir: Option<PathBuf>,
    pub checkpoint_every: Option<u64>,
    /// TB_RESUME_FROM (rank 0's choice is every rank's).
    pub resume_from: Option<PathBuf>,
    /// Rank 0's progress file.
    pub progress: Option<PathBuf>,
    /// The allocation's memory; a trainer predicted to need more says so in its log.
    pub memory_limit: Option<u64>,
    pub connect_timeout: Duration,
    /// How long a collective may wait for the slowest rank's step.
    pub step_timeout: Duration,
    pub transport: Preference,
}

fn fail(reason: &'static str) -> impl FnOnce(anyhow::Error) -> StartError {
    move |error| StartError { reason, error }
}

fn transport(e: TransportError, doing: &str) -> StartError {
    let reason = if e.is_peer_loss() {
        "PeerLost"
    } else {
        "TransportFailed"
    };
    StartError {
        reason,
        error: anyhow::Error::from(e).context(doing.to_string()),
    }
}

fn target(t: LoraTarget) -> Target {
    match t {
        LoraTarget::Q => Target::Q,
        LoraTarget::K => Target::K,
        LoraTarget::V => Target::V,
        LoraTarget::O => Target::O,
        LoraTarget::Gate => Target::Gate,
        LoraTarget::Up => Target::Up,
        LoraTarget::Down => Target::Down,
    }
}

/// The engine's configuration for `f` over `total_steps`.
pub fn train_config(f: &FineTuneSpec, model_name: &str, total_steps: u64) -> TrainConfig {
    let mut cfg = TrainConfig::new(LoraConfig {
        rank: f.lora.rank as usize,
        alpha: f.lora.alpha as f32,
        dropout: f.lora.dropout as f32,
        rslora: false,
        targets: f.lora.targets.iter().copied().map(target).collect(),
        base_model: model_name.to_string(),
    });
    cfg.learning_rate = f.learning_rate;
    cfg.warmup_steps = f.warmup_steps;
    cfg.total_steps = total_steps.max(1);
    cfg.min_lr_ratio = match f.schedule {
        LrSchedule::Constant => 1.0,
        LrSchedule::Cosine => 0.0,
    };
    cfg.weight_decay = f.weight_decay;
    cfg.grad_clip = f.grad_clip;
    cfg.seed = f.seed;
    cfg
}

/// What a finished run did.
#[derive(Debug, Clone)]
pub struct Finished {
    pub steps: u64,
    pub loss: Option<f64>,
    pub eval_loss: Option<f64>,
    pub seconds: f64,
}

/// Runs this rank to the end of training.
pub fn run(opts: TrainOptions) -> Result<Finished, StartError> {
    let started = Instant::now();
    let world = opts.hosts.len();
    if world == 0 || opts.rank >= world {
        return Err(StartError {
            reason: "InvalidSpec",
            error: anyhow!("rank {} of {} hosts", opts.rank, world),
        });
    }
    let f = &opts.finetune;
    let (rank, is_root) = (opts.rank, opts.rank == 0);

    // The dataset first: a bad file fails the job before the weights are read.
    let (tokenizer, template) = (|| -> anyhow::Result<_> {
        let index = GgufIndex::open(&opts.model_path)?;
        Ok((
            Tokenizer::from_gguf(index.content())?,
            ChatTemplate::from_gguf(index.content())?,
        ))
    })()
    .with_context(|| format!("reading {}", opts.model_path.display()))
    .map_err(fail("ModelLoadFailed"))?;
    let examples = dataset::read(&opts, &tokenizer, &template)?;
    let (train_idx, eval_idx) = split_eval(examples.len(), f.eval_fraction, f.seed);
    if train_idx.is_empty() {
        return Err(StartError {
            reason: "DatasetInvalid",
            error: anyhow!(
                "{}: {} example(s) leave none to train on after holding out evalFraction {}",
                opts.dataset.display(),
                examples.len(),
                f.eval_fraction
            ),
        });
    }
    // Example i, which this rank has when it uses it (a staged dataset holds only those).
    let example = |i: usize| -> Result<Example, StartError> {
        examples[i].clone().ok_or_else(|| StartError {
            reason: "TrainingFailed",
            error: anyhow!("example {i} was not staged to rank {rank}, which uses it"),
        })
    };
    let total_steps = dataset::total_steps(f, train_idx.len());
    // This rank's share of the held-out split (every rank joins each evaluation's sum).
    let eval_mine: Vec<Example> = eval_idx
        .iter()
        .skip(rank)
        .step_by(world)
        .map(|&i| example(i))
        .collect::<Result<_, _>>()?;
    tracing::info!(
        rank,
        world,
        dataset = %opts.dataset.display(),
        train = train_idx.len(),
        eval = eval_idx.len(),
        total_steps,
        "dataset read"
    );

    let cfg = train_config(f, &opts.model_name, total_steps);
    let mut trainer = Trainer::load(&opts.model_path, cfg, &default_device())
        .map_err(|e| anyhow!("{e}"))
        .with_context(|| format!("loading {} for training", opts.model_path.display()))
        .map_err(fail("ModelLoadFailed"))?;
    let held = trainer.memory_bytes();
    tracing::info!(
        rank,
        trainable = trainer.parameter_count(),
        memory_bytes = held,
        "model loaded"
    );
    if let Some(limit) = opts.memory_limit
        && held > limit
    {
        tracing::warn!(
            "the trainer holds {held} bytes before activations, more than the {limit} bytes the \
             allocation reserves; set the job's memory to reserve more"
        );
    }

    let mut group = Group::connect(
        rank,
        &opts.hosts,
        opts.coordinator,
        opts.transport,
        opts.connect_timeout,
        opts.step_timeout,
    )
    .map_err(|e| transport(e, "connecting the ranks"))?;

    // Resume: rank 0 picks the checkpoint, every rank loads its copy of it.
    let mine = if is_root {
        opts.resume_from
            .as_deref()
            .filter(|p| p.join(tb_engine::train::checkpoint::COMPLETE).is_file())
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .filter(|n| checkpoints::step_of(n).is_some())
            .unwrap_or_default()
    } else {
        String::new()
    };
    let resume = group
        .broadcast_name(&mine)
        .map_err(|e| transport(e, "agreeing on the checkpoint to resume from"))?;
    if !resume.is_empty() {
        let dir = opts
            .checkpoint_dir
            .as_deref()
            .map(|d| d.join(&resume))
            .ok_or_else(|| {
                anyhow!("rank 0 resumes from {resume}, but this rank has no TB_CHECKPOINT_DIR")
            })
            .map_err(fail("CheckpointInvalid"))?;
        trainer
            .load_checkpoint(&dir)
            .map_err(|e| anyhow!("{e}"))
            .with_context(|| format!("resuming from {}", dir.display()))
            .map_err(fail("CheckpointInvalid"))?;
        tracing::info!(rank, step = trainer.step(), from = %dir.display(), "resumed");
    }

    let mut progress = Progress::new(opts.progress.clone().filter(|_| is_root), total_steps);
    if trainer.step() > 0 {
        progress.resumed(trainer.step());
    }
    let batches = Batches::new(train_idx.len(), f.batch_size as usize, f.seed);
    // This rank keeps its own checkpoint unless rank 0's Mac (the same directory) does.
    let saves = is_root || opts.hosts[rank] != opts.hosts[0];
    let mut last_loss = None;
    let mut last_eval = None;
    while trainer.step() < total_steps {
        let step = trainer.step();
        let t0 = Instant::now();
        let share: Vec<Example> = batches
            .rank_batch(step, rank, world)
            .into_iter()
            .map(|i| example(train_idx[i]))
            .collect::<Result<_, _>>()?;
        let micro = share.len().div_ceil(f.accumulation as usize).max(1);
        let StepDone {
            loss_sum,
            targets,
            tokens,
            applied,
            ..
        } = train_step(&mut trainer, &mut group, &share, micro)?;
        let done = trainer.step();
        let loss = loss_sum / targets.max(1) as f64;
        last_loss = Some(loss);
        let took = t0.elapsed();
        if is_root {
            tracing::info!(
                step = done,
                total_steps,
                loss = format!("{loss:.4}"),
                lr = format!("{:.3e}", applied.lr),
                grad_norm = format!("{:.3}", applied.grad_norm),
                tokens_per_second = format!("{:.0}", tokens as f64 / took.as_secs_f64().max(1e-9)),
                "step"
            );
        }
        progress.step(done, loss, tokens, took);

        if !eval_idx.is_empty() && (done % f.eval_every == 0 || done == total_steps) {
            let l = evaluate(&trainer, &mut group, &eval_mine, micro)?;
            if is_root {
                tracing::info!(step = done, eval_loss = format!("{l:.4}"), "eval");
            }
            last_eval = Some(l);
            progress.eval(l);
        }
        if let (Some(dir), Some(every)) = (&opts.checkpoint_dir, opts.checkpoint_every)
            && done % every == 0
            && done < total_steps
            && saves
        {
            let saved = checkpoints::save(dir, done, rank, |p| {
                trainer.save_checkpoint(p).map_err(|e| anyhow!("{e}"))
            })
            .map_err(fail("CheckpointFailed"))?;
            tracing::info!(rank, step = done, path = %saved.display(), "checkpoint saved");
        }
    }

    if is_root {
        trainer
            .adapter()
            .and_then(|a| {
                a.save(&opts.output, trainer.model_config())
                    .map_err(Into::into)
            })
            .map_err(|e| anyhow!("{e}"))
            .with_context(|| format!("writing the adapter to {}", opts.output.display()))
            .map_err(fail("AdapterWriteFailed"))?;
        tracing::info!(path = %opts.output.display(), "adapter written");
        progress.adapter(opts.output.display().to_string());
    }
    // Nobody leaves before rank 0 has written the adapter: a gang whose rank 0 fails there is
    // restarted whole.
    group
        .barrier()
        .map_err(|e| transport(e, "the last barrier"))?;
    Ok(Finished {
        steps: trainer.step(),
        loss: last_loss,
        eval_loss: last_eval,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// What one step did, summed over every rank of the group.
#[derive(Debug, Clone, Copy)]
pub struct StepDone {
    pub loss_sum: f64,
    /// Target tokens of the global batch.
    pub targets: u64,
    /// Tokens of the global batch.
    pub tokens: u64,
    pub applied: Applied,
    /// Time this rank spent in the gradient all-reduce, waiting for the slowest rank included
    /// (zero for a group of one).
    pub all_reduce: Duration,
}

/// One optimizer step of this rank: forward and backward of `share` (its part of the global
/// batch) in micro-batches of `micro` examples, then the gradients, loss and token counts summed
/// over `group`, and the same AdamW update of the summed gradients on every rank.
pub fn train_step(
    trainer: &mut Trainer,
    group: &mut Group,
    share: &[Example],
    micro: usize,
) -> Result<StepDone, StartError> {
    let step = trainer.step();
    let mut local = StepLoss::default();
    let mut tokens = 0u64;
    for chunk in share.chunks(micro.max(1)) {
        let l = trainer
            .accumulate(chunk)
            .map_err(|e| anyhow!("{e}"))
            .with_context(|| format!("step {}", step + 1))
            .map_err(fail("TrainingFailed"))?;
        local.loss_sum += l.loss_sum;
        local.tokens += l.tokens;
        tokens += chunk.iter().map(|e| e.tokens.len() as u64).sum::<u64>();
    }
    let mut all_reduce = Duration::ZERO;
    let (loss_sum, targets, tokens) = if group.world() > 1 {
        let mut flat = trainer.gradients_flat();
        let n = flat.len();
        flat.extend([local.loss_sum as f32, local.tokens as f32, tokens as f32]);
        let t = Instant::now();
        group
            .all_reduce(&mut flat)
            .map_err(|e| transport(e, "summing the gradients"))?;
        all_reduce = t.elapsed();
        trainer
            .set_gradients_flat(&flat[..n])
            .map_err(|e| anyhow!("{e}"))
            .map_err(fail("TrainingFailed"))?;
        (
            f64::from(flat[n]),
            f64::from(flat[n + 1]).round() as u64,
            f64::from(flat[n + 2]).round() as u64,
        )
    } else {
        (local.loss_sum, local.tokens, tokens)
    };
    let applied = trainer
        .apply(targets)
        .map_err(|e| anyhow!("{e}"))
        .with_context(|| format!("step {}", step + 1))
        .map_err(fail("TrainingFailed"))?;
    Ok(StepDone {
        loss_sum,
        targets,
        tokens,
        applied,
        all_reduce,
    })
}

/// Mean loss per token on the held-out split: each rank evaluates its share (`mine`, every
/// world-th example), and the sums are added up over the ranks.
fn evaluate(
    trainer: &Trainer,
    group: &mut Group,
    mine: &[Example],
    micro: usize,
) -> Result<f64, StartError> {
    let mut sum = StepLoss::default();
    for chunk in mine.chunks(micro.max(1)) {
        let l = trainer
            .eval_loss(chunk)
            .map_err(|e| anyhow!("{e}"))
            .context("evaluating")
            .map_err(fail("TrainingFailed"))?;
        sum.loss_sum += l.loss_sum;
        sum.tokens += l.tokens;
    }
    let mut both = [sum.loss_sum as f32, sum.tokens as f32];
    group
        .all_reduce(&mut both)
        .map_err(|e| transport(e, "summing the eval loss"))?;
    Ok(f64::from(both[0]) / f64::from(both[1]).max(1.0))
}

/// `path` as the rank sees it: absolute as is, else under `base`.
pub fn under(base: &Path, path: &str) -> PathBuf {
    let p = super::command::expand_home(path);
    if p.is_absolute() { p } else { base.join(p) }
}
