//! Rank 0 of a built-in service: takes requests from the HTTP side, runs the first stage
//! (embedding and its blocks), sends each step down the pipeline and turns the tokens that come
//! back into text. Several sequences are served at once (continuous batching): the sequences
//! whose next input is ready run as ONE batched step ([`Op::Batch`]: one forward pass per stage,
//! every weight applied once to all their rows), sequences join and leave between steps. The
//! active sequences are split into as many micro-batches as there are stages, so that while one
//! is in the later stages rank 0 already runs the next and every stage keeps working; never
//! more micro-batches than stages ([`micro_batches`]).
//!
//! Prompts are prefilled in chunks that ride in a batch with the other sequences' decode steps:
//! at most [`PREFILL_CHUNK`] tokens of one prompt and [`Driver::prefill_per_step`] in all per
//! step (the sequence that has waited longest first: a new request, then the oldest), so
//! neither one long prompt nor many joining at once stall the running decodes for more than
//! that much work; then one token per step. Generation ends at an end-of-sequence token, a stop
//! string, `max_tokens` or the context length.
//!
//! An idle pipeline is checked: after [`PING_IDLE_EVERY`] without a request, rank 0 sends an
//! [`Op::Ping`] round the stages and waits [`PING_TIMEOUT`] for it to come back. A link cut
//! silently (packets dropped, no connection reset) or a stage hung is found that way within
//! seconds — the pipeline fails as PeerLost, the service goes NotReady and tb places it again
//! — instead of at the next request, which would wait the whole step timeout.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use tb_engine::generate::FinishReason;
use tb_engine::sample::{Sampler, SamplingParams, StopMatcher};
use tb_engine::shard::{Activation, BatchItem, Shard, StageInput, StageOutput};
use tb_engine::tokenizer::{Decoder, Tokenizer};
use tokio::sync::mpsc::UnboundedSender;

use super::messages::{
    BatchEntry, MAX_BATCH_ENTRIES, Op, Step, recv_step, send_activation, send_step,
};
use super::stage::with_timeout;
use tb_transport::collectives::Communicator;

/// Tokens of one prompt prefilled in one step; longer prompts take several.
pub const PREFILL_CHUNK: usize = 256;
/// Prompt tokens prefilled in one step by default, across all its sequences: two whole
/// chunks, so that many requests joining at once (each with its own chunk) do not make one
/// step as long as all their prompts. Not lower: spreading short prompts over more steps
/// lengthens more of the running streams' gaps (measured with serve-bench at 16 streams: a
/// budget of 128 doubled the inter-token p99 against 512).
pub const PREFILL_PER_STEP: usize = 2 * PREFILL_CHUNK;
/// How long the pipeline may sit idle before rank 0 checks it with a ping.
pub const PING_IDLE_EVERY: Duration = Duration::from_secs(2);
/// How long a ping may take round the stages (they are idle: milliseconds on a good link).
pub const PING_TIMEOUT: Duration = Duration::from_secs(5);

/// One generation request.
#[derive(Debug)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    pub events: UnboundedSender<Event>,
    /// Its place in the service ([`super::admission`]); freed when the driver is done with it.
    pub permit: Option<super::admission::Permit>,
}

/// What a request hears back, in order: text pieces, then `Done` or `Failed`.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Text(String),
    Done(Finish),
    Failed(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finish {
    pub reason: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache (OpenAI's
    /// `usage.prompt_tokens_details.cached_tokens`).
    pub cached_tokens: usize,
    /// The generated token ids (an end-of-sequence token that ended generation excluded).
    pub token_ids: Vec<u32>,
}

/// Whether the whole pipeline has answered a request end to end (and not failed since), and
/// how many steps it has run.
#[derive(Debug, Default)]
pub struct Health {
    ready: AtomicBool,
    failed: AtomicBool,
    steps: AtomicU64,
}

impl Health {
    /// Forward passes rank 0 has started through the whole pipeline (each reads every stage's
    /// weights once, for all the sequences it carries): what a bench turns into the rate at
    /// which weights are read.
    pub fn steps(&self) -> u64 {
        self.steps.load(Ordering::Relaxed)
    }

    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst) && !self.failed.load(Ordering::SeqCst)
    }
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }
}

struct Active {
    /// Tokens still to run: the rest of the prompt, or the last sampled token.
    input: Option<Vec<u32>>,
    pos: usize,
    /// The micro-batch it rides in while a step of it is in the later stages (named by the
    /// batch's first sequence).
    in_flight: Option<u64>,
    /// When its last step started (None: not yet): the sequences that have waited longest
    /// go first when not all of the ready ones fit the steps that can start.
    launched: Option<Instant>,
    /// Only when rank 0 is also the last stage.
    sampler: Option<Sampler>,
    params: SamplingParams,
    decoder: Decoder,
    stops: StopMatcher,
    generated: usize,
    token_ids: Vec<u32>,
    prompt_tokens: usize,
    events: UnboundedSender<Event>,
    /// Bytes of KV cache reserved for the sequence (its prompt and `max_tokens`, within the
    /// context).
    kv_reserved: u64,
    /// Prompt tokens taken from the prefix cache.
    cached_tokens: usize,
    /// The prompt, while it is to be kept in the prefix cache once prefilled.
    keep: Option<Vec<u32>>,
    _permit: Option<super::admission::Permit>,
}

/// Rank 0's loop.
pub struct Driver {
    /// The pipeline to the later stages (None: rank 0 is the only stage).
    pub comm: Option<Communicator>,
    /// The other ranks of rank 0's stage when it is split by tensor parallelism
    /// ([`super::tensor`]): told every step before rank 0 runs it.
    pub followers: Option<super::tensor::Followers>,
    pub shard: Shard,
    pub tokenizer: Tokenizer,
    /// Sequences served at once.
    pub batch: usize,
    /// Bytes of KV cache rank 0's stage may hold for its sequences (`None`: bounded by `batch`
    /// alone). A request waits until its reservation fits; the first one always runs.
    pub kv_budget: Option<u64>,
    /// How long one step may take in the later stages.
    pub step_timeout: Duration,
    /// Recent prompts kept for requests that start like them ([`super::prefix`]).
    pub prefixes: super::prefix::PrefixCache,
    /// Prompt tokens one step prefills at most, across its sequences ([`PREFILL_PER_STEP`]
    /// by default; at least 1).
    pub prefill_per_step: usize,
}

/// The micro-batches to start now from the `ready` sequences (longest waiting first), with
/// `active` sequences in all and `in_flight` micro-batches in the later stages of a pipeline
/// of `stages`: batches of an equal share of the active sequences, at most one per stage in
/// flight. A sequence that is ready while every stage has a batch waits for the next answer
/// and joins that batch: a further batch would only queue behind the others and make every
/// sequence's round trip one stage longer, for as long as the batches stayed apart (they
/// never merge on their own).
fn micro_batches(ready: &[u64], active: usize, in_flight: usize, stages: usize) -> Vec<&[u64]> {
    let size = active.div_ceil(stages.max(1)).clamp(1, MAX_BATCH_ENTRIES);
    ready
        .chunks(size)
        .take(stages.max(1).saturating_sub(in_flight))
        .collect()
}

/// How many micro-batches are in the later stages.
fn groups_in_flight(active: &BTreeMap<u64, Active>) -> usize {
    let groups: std::collections::BTreeSet<u64> =
        active.values().filter_map(|a| a.in_flight).collect();
    groups.len()
}

/// Why the pipeline stopped.
#[derive(Debug)]
pub enum PipelineError {
    /// Another stage went away (its process or its Mac died, or the link broke): not this
    /// stage's fault, and the scheduler does not count it as one.
    PeerLost(String),
    /// This stage's own failure, or a peer that answered wrongly.
    Own(String),
}

impl PipelineError {
    fn transport(e: tb_transport::TransportError) -> PipelineError {
        if e.is_peer_loss() {
            PipelineError::PeerLost(format!("pipeline: {e}"))
        } else {
            PipelineError::Own(format!("pipeline: {e}"))
        }
    }
}

impl std::fmt::Display for PipelineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PipelineError::PeerLost(m) | PipelineError::Own(m) => f.write_str(m),
        }
    }
}

impl Driver {
    /// Serves requests until the request channel closes (then tells the stages to stop) or
    /// the pipeline breaks (then every open request fails, and so does this call).
    pub fn run(
        mut self,
        requests: Receiver<Request>,
        health: Arc<Health>,
    ) -> Result<(), PipelineError> {
        let mut active: BTreeMap<u64, Active> = BTreeMap::new();
        let mut pending: VecDeque<Request> = VecDeque::new();
        let mut next_seq = 1u64;
        let mut in_flight = 0usize;
        // The readiness check: one token through every stage.
        let (probe_tx, mut probe_rx) = tokio::sync::mpsc::unbounded_channel();
        let probe = self
            .tokenizer
            .encode("Hello")
            .map_err(|e| PipelineError::Own(format!("tokenizing the readiness prompt: {e}")))?;
        let probe_seq = 0u64;
        active.insert(
            probe_seq,
            self.active(
                probe,
                SamplingParams {
                    max_tokens: 1,
                    ..SamplingParams::default()
                },
                probe_tx,
            ),
        );
        let mut probed = false;
        let result = loop {
            if !probed && !active.contains_key(&probe_seq) {
                probed = true;
                let mut failed = None;
                while let Ok(event) = probe_rx.try_recv() {
                    if let Event::Failed(e) = event {
                        failed = Some(e);
                    }
                }
                if let Some(e) = failed {
                    break Err(PipelineError::Own(format!("readiness check failed: {e}")));
                }
                health.ready.store(true, Ordering::SeqCst);
                tracing::info!("pipeline ready: a token went through every stage");
            }
            // Take new requests (block only when there is nothing else to do, pinging the
            // pipeline while idle), then admit waiting ones while there is room: `batch`
            // sequences and the KV budget. The HTTP side bounds how many wait (admission
            // permits).
            let mut closed = false;
            let mut unanswered = None;
            loop {
                let req = if active.is_empty() && pending.is_empty() {
                    match requests.recv_timeout(PING_IDLE_EVERY) {
                        Ok(r) => r,
                        Err(RecvTimeoutError::Timeout) => match self.ping() {
                            Ok(()) => continue,
                            Err(e) => {
                                unanswered = Some(e);
                                break;
                            }
                        },
                        Err(RecvTimeoutError::Disconnected) => {
                            closed = true;
                            break;
                        }
                    }
                } else {
                    match requests.try_recv() {
                        Ok(r) => r,
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => {
                            closed = pending.is_empty();
                            break;
                        }
                    }
                };
                let context = self.shard.context();
                if req.prompt.is_empty() || req.prompt.len() >= context {
                    let _ = req.events.send(Event::Failed(format!(
                        "the prompt has {} tokens; 1 to {} fit this model's context",
                        req.prompt.len(),
                        context - 1
                    )));
                    continue;
                }
                pending.push_back(req);
            }
            pending.retain(|r| !r.events.is_closed());
            let mut broken = None;
            while active.len() < self.batch.max(1) {
                let Some(req) = pending.front() else { break };
                let need = self.kv_reservation(req);
                let reserved: u64 = active.values().map(|a| a.kv_reserved).sum::<u64>()
                    + self.prefixes.positions() as u64 * self.shard.kv_bytes_per_position();
                if let Some(budget) = self.kv_budget
                    && !active.is_empty()
                    && reserved + need > budget
                {
                    // Kept prefixes give way to requests.
                    match self.prefixes.evict() {
                        Some(seq) => {
                            if let Err(e) = self.release(seq) {
                                broken = Some(e);
                                break;
                            }
                            continue;
                        }
                        None => break,
                    }
                }
                let Some(req) = pending.pop_front() else {
                    break;
                };
                let keep = self
                    .prefixes
                    .worth_keeping(&req.prompt)
                    .then(|| req.prompt.clone());
                let hit = self.prefixes.lookup(&req.prompt);
                let mut a = self.active(req.prompt, req.params, req.events);
                if let Some((from, len)) = hit {
                    match self.fork(from, next_seq, len) {
                        Ok(true) => {
                            a.input = a.input.take().map(|mut p| p.split_off(len));
                            a.pos = len;
                            a.cached_tokens = len;
                        }
                        Ok(false) => self.prefixes.remove(from),
                        Err(e) => {
                            broken = Some(e);
                            break;
                        }
                    }
                }
                a.keep = keep;
                a.kv_reserved = need;
                a._permit = req.permit;
                active.insert(next_seq, a);
                next_seq += 1;
            }
            if let Some(e) = broken {
                break Err(e);
            }
            if let Some(e) = unanswered {
                break Err(e);
            }
            if closed && active.is_empty() {
                break Ok(());
            }
            // Requests whose client went away: forget them between steps.
            let gone: Vec<u64> = active
                .iter()
                .filter(|(_, a)| a.in_flight.is_none() && a.events.is_closed())
                .map(|(s, _)| *s)
                .collect();
            let mut broken = None;
            for seq in gone {
                active.remove(&seq);
                if let Err(e) = self.release(seq) {
                    broken = Some(e);
                    break;
                }
            }
            if let Some(e) = broken {
                break Err(e);
            }
            // Start the sequences that have their input, in micro-batches: as many as there
            // are stages, so that every stage has one to work on.
            let mut ready: Vec<(Option<Instant>, u64)> = active
                .iter()
                .filter(|(_, a)| a.in_flight.is_none() && a.input.is_some())
                .map(|(s, a)| (a.launched, *s))
                .collect();
            ready.sort_unstable();
            let ready: Vec<u64> = ready.into_iter().map(|(_, s)| s).collect();
            let stages = self.comm.as_ref().map_or(1, |c| c.world());
            let mut broken = None;
            for seqs in micro_batches(&ready, active.len(), groups_in_flight(&active), stages) {
                if let Err(e) = self.launch(seqs, &mut active, &mut in_flight, &health) {
                    broken = Some(e);
                    break;
                }
            }
            if let Some(e) = broken {
                break Err(e);
            }
            if in_flight == 0 {
                continue;
            }
            // One answer from the last stage.
            let Some(comm) = self.comm.as_mut() else {
                break Err(PipelineError::Own(
                    "steps in flight without a pipeline".into(),
                ));
            };
            let last = comm.world() - 1;
            let step = match with_timeout(comm, self.step_timeout, |c| recv_step(c, last)) {
                Ok(s) => s,
                Err(e) => break Err(PipelineError::transport(e)),
            };
            if let Err(e) = self.on_answer(step, &mut active, &mut in_flight) {
                break Err(e);
            }
        };
        match &result {
            Ok(()) => {
                if let Some(comm) = self.comm.as_mut() {
                    let _ = send_step(comm, 1, &Step::new(Op::Shutdown, 0));
                }
                if let Some(f) = &self.followers {
                    f.shutdown();
                }
            }
            Err(e) => {
                health.failed.store(true, Ordering::SeqCst);
                tracing::error!("pipeline failed: {e}");
                for a in active.values() {
                    let _ = a
                        .events
                        .send(Event::Failed(format!("the pipeline failed: {e}")));
                }
                // Requests that arrive from now on are refused by the HTTP side (health).
                for r in pending.drain(..) {
                    let _ = r
                        .events
                        .send(Event::Failed(format!("the pipeline failed: {e}")));
                }
                while let Ok(r) = requests.try_recv() {
                    let _ = r
                        .events
                        .send(Event::Failed(format!("the pipeline failed: {e}")));
                }
            }
        }
        result
    }

    /// Sends a ping round the stages and waits for it (nothing else is in flight); a lone
    /// stage has nothing to ask.
    fn ping(&mut self) -> Result<(), PipelineError> {
        let Some(comm) = self.comm.as_mut() else {
            return Ok(());
        };
        let last = comm.world() - 1;
        let lost = |e: tb_transport::TransportError| {
            PipelineError::PeerLost(format!(
                "pipeline: an idle check got no answer from the later stages within                  {PING_TIMEOUT:?}: {e}"
            ))
        };
        send_step(comm, 1, &Step::new(Op::Ping, 0)).map_err(lost)?;
        let step = with_timeout(comm, PING_TIMEOUT, |c| recv_step(c, last)).map_err(lost)?;
        if step.op != Op::Ping {
            return Err(PipelineError::Own(format!(
                "rank {last} answered an idle check with {:?}",
                step.op
            )));
        }
        Ok(())
    }

    fn active(
        &self,
        prompt: Vec<u32>,
        params: SamplingParams,
        events: UnboundedSender<Event>,
    ) -> Active {
        Active {
            prompt_tokens: prompt.len(),
            input: Some(prompt),
            pos: 0,
            in_flight: None,
            launched: None,
            sampler: self.comm.is_none().then(|| Sampler::new(&params)),
            decoder: self.tokenizer.decoder(),
            stops: StopMatcher::new(&params.stop),
            params,
            generated: 0,
            token_ids: Vec::new(),
            events,
            kv_reserved: 0,
            cached_tokens: 0,
            keep: None,
            _permit: None,
        }
    }

    /// Bytes of KV cache `req` may come to hold on this stage.
    fn kv_reservation(&self, req: &Request) -> u64 {
        let positions = (req.prompt.len() + req.params.max_tokens).min(self.shard.context());
        positions as u64 * self.shard.kv_bytes_per_position()
    }

    /// What the last stage answered: tokens for a batch, or one sequence's failure.
    fn on_answer(
        &mut self,
        step: Step,
        active: &mut BTreeMap<u64, Active>,
        in_flight: &mut usize,
    ) -> Result<(), PipelineError> {
        let last = self.comm.as_ref().map_or(0, |c| c.world() - 1);
        let answers: Vec<(u64, Result<Option<u32>, String>)> = match step.op {
            Op::Tokens => step
                .entries
                .into_iter()
                .map(|e| (e.seq, Ok(e.sample.then_some(e.token))))
                .collect(),
            Op::Token => vec![(step.seq, Ok(Some(step.token)))],
            Op::Error => vec![(step.seq, Err(step.message))],
            other => {
                return Err(PipelineError::Own(format!(
                    "rank {last} answered with {other:?}"
                )));
            }
        };
        for (seq, answer) in answers {
            let Some(a) = active.get_mut(&seq) else {
                return Err(PipelineError::Own(format!(
                    "rank {last} answered for unknown sequence {seq}"
                )));
            };
            if a.in_flight.is_none() {
                return Err(PipelineError::Own(format!(
                    "rank {last} answered for sequence {seq}, which has no step in flight"
                )));
            }
            a.in_flight = None;
            *in_flight -= 1;
            match answer {
                // A prefill chunk that is not the prompt's last: the rest is in `input`.
                Ok(None) => {}
                Ok(Some(token)) => {
                    if let Some(done) = self.on_token(a, token) {
                        let _ = a.events.send(Event::Done(done));
                        active.remove(&seq);
                        self.release(seq)?;
                    }
                }
                Err(why) => {
                    let _ = a.events.send(Event::Failed(why));
                    active.remove(&seq);
                    self.release(seq)?;
                }
            }
        }
        Ok(())
    }

    /// Runs the first stage for `seqs` as one batched step and sends it on (or samples, when
    /// rank 0 is the only stage). Each sequence runs its next token or prefill chunk.
    fn launch(
        &mut self,
        seqs: &[u64],
        active: &mut BTreeMap<u64, Active>,
        in_flight: &mut usize,
        health: &Health,
    ) -> Result<(), PipelineError> {
        let mut items = Vec::with_capacity(seqs.len());
        let mut entries = Vec::with_capacity(seqs.len());
        // `seqs` is longest waiting first, and so gets the prompt budget first.
        let mut prompt_budget = self.prefill_per_step.max(1);
        let now = Instant::now();
        for &seq in seqs {
            let Some(a) = active.get_mut(&seq) else {
                continue;
            };
            let prefilling = a.pos < a.prompt_tokens;
            if prefilling && prompt_budget == 0 {
                // Its prompt waits for a later step.
                continue;
            }
            let Some(mut input) = a.input.take() else {
                continue;
            };
            if prefilling {
                let take = prompt_budget.min(PREFILL_CHUNK);
                if input.len() > take {
                    a.input = Some(input.split_off(take));
                }
                prompt_budget -= input.len();
            }
            let (pos, n) = (a.pos, input.len());
            a.pos += n;
            a.launched = Some(now);
            entries.push(BatchEntry::new(seq, pos, n, a.input.is_none(), &a.params));
            items.push(BatchItem {
                seq,
                input: StageInput::Tokens(input),
                pos,
            });
        }
        if items.is_empty() {
            return Ok(());
        }
        if let Some(f) = &self.followers {
            let tokens: Vec<u32> = items
                .iter()
                .flat_map(|i| match &i.input {
                    StageInput::Tokens(t) => t.clone(),
                    StageInput::Hidden(_) => Vec::new(),
                })
                .collect();
            f.batch(&entries, &tokens)
                .map_err(PipelineError::transport)?;
        }
        let outs = self.shard.forward_batch(items);
        health.steps.fetch_add(1, Ordering::Relaxed);
        // Single stage: every shard has run the prompts now (a pipeline keeps them once the
        // step is on its way, below, so that the stages fork after running it).
        if self.comm.is_none() {
            self.keep_prompts(&entries, active)?;
        }
        let mut passed = Vec::with_capacity(entries.len());
        let mut rows = Vec::new();
        let hidden = self.shard.config().hidden;
        for (entry, out) in entries.into_iter().zip(outs) {
            let seq = entry.seq;
            match (out, self.comm.is_some()) {
                (Ok(StageOutput::Hidden(act)), true) => {
                    rows.extend_from_slice(&act.data);
                    passed.push(entry);
                }
                (Ok(StageOutput::Logits(l)), false) => {
                    if !entry.sample {
                        continue;
                    }
                    let Some(a) = active.get_mut(&seq) else {
                        continue;
                    };
                    let token = match a.sampler.as_mut() {
                        Some(s) => s.sample(&l),
                        None => {
                            return Err(PipelineError::Own(
                                "no sampler on a single-stage pipeline".into(),
                            ));
                        }
                    };
                    if let Some(done) = self.on_token(a, token) {
                        let _ = a.events.send(Event::Done(done));
                        active.remove(&seq);
                        self.release(seq)?;
                    }
                }
                (Ok(_), _) => {
                    return Err(PipelineError::Own(
                        "rank 0's shard does not fit its place in the pipeline".into(),
                    ));
                }
                (Err(e), _) => {
                    if let Some(a) = active.remove(&seq) {
                        let _ = a.events.send(Event::Failed(format!("stage 0: {e}")));
                    }
                    self.release(seq)?;
                }
            }
        }
        let Some(comm) = self.comm.as_mut() else {
            return Ok(());
        };
        if passed.is_empty() {
            return Ok(());
        }
        let group = passed[0].seq;
        for e in &passed {
            if let Some(a) = active.get_mut(&e.seq) {
                a.in_flight = Some(group);
                *in_flight += 1;
            }
        }
        let step = Step::batch(Op::Batch, passed);
        let act = Activation {
            tokens: step.tokens as usize,
            hidden,
            data: rows,
        };
        send_step(comm, 1, &step)
            .and_then(|_| send_activation(comm, 1, &act))
            .map_err(PipelineError::transport)?;
        self.keep_prompts(&step.entries, active)
    }

    /// Keeps in the prefix cache the prompts of `entries` that have just been prefilled (their
    /// last chunk ran) and were worth keeping.
    fn keep_prompts(
        &mut self,
        entries: &[BatchEntry],
        active: &mut BTreeMap<u64, Active>,
    ) -> Result<(), PipelineError> {
        for e in entries.iter().filter(|e| e.sample) {
            let Some(prompt) = active.get_mut(&e.seq).and_then(|a| a.keep.take()) else {
                continue;
            };
            let len = prompt.len();
            let (kept, evicted) = self.prefixes.insert(prompt);
            if let Some(old) = evicted {
                self.release(old)?;
            }
            if !self.fork(e.seq, kept, len)? {
                self.prefixes.remove(kept);
            }
        }
        Ok(())
    }

    /// Starts `to` from the first `len` positions of `from` here and in every other rank;
    /// false when this rank cannot (then nobody is told).
    fn fork(&mut self, from: u64, to: u64, len: usize) -> Result<bool, PipelineError> {
        if let Err(e) = self.shard.fork_sequence(from, to, len) {
            tracing::debug!("sharing a prefix of {len} positions: {e}");
            return Ok(false);
        }
        if let Some(f) = &self.followers {
            f.fork(from, to, len).map_err(PipelineError::transport)?;
        }
        if let Some(comm) = self.comm.as_mut() {
            send_step(comm, 1, &Step::fork(from, to, len)).map_err(PipelineError::transport)?;
        }
        Ok(true)
    }

    /// A new token for `a`: emits its text; `Some` when the sequence is finished.
    fn on_token(&self, a: &mut Active, token: u32) -> Option<Finish> {
        let finish = |a: &Active, reason| Finish {
            reason,
            prompt_tokens: a.prompt_tokens,
            completion_tokens: a.generated,
            cached_tokens: a.cached_tokens,
            token_ids: a.token_ids.clone(),
        };
        if self.tokenizer.eos_ids().contains(&token) {
            let rest = a.decoder.finish();
            let check = a.stops.push(&rest);
            let tail = check.text + &a.stops.finish();
            if !tail.is_empty() {
                let _ = a.events.send(Event::Text(tail));
            }
            return Some(finish(a, FinishReason::Stop));
        }
        a.generated += 1;
        a.token_ids.push(token);
        let piece = a.decoder.push(token);
        let check = a.stops.push(&piece);
        if !check.text.is_empty() {
            let _ = a.events.send(Event::Text(check.text));
        }
        if check.stopped {
            return Some(finish(a, FinishReason::Stop));
        }
        if a.generated >= a.params.max_tokens || a.pos + 1 >= self.shard.context() {
            let rest = a.decoder.finish();
            let check = a.stops.push(&rest);
            let tail = check.text + &a.stops.finish();
            if !tail.is_empty() {
                let _ = a.events.send(Event::Text(tail));
            }
            return Some(finish(a, FinishReason::Length));
        }
        a.input = Some(vec![token]);
        None
    }

    /// Forgets `seq` here and in every later stage.
    fn release(&mut self, seq: u64) -> Result<(), PipelineError> {
        self.shard.drop_sequence(seq);
        if let Some(f) = &self.followers {
            f.release(seq).map_err(PipelineError::transport)?;
        }
        match self.comm.as_mut() {
            Some(comm) => {
                send_step(comm, 1, &Step::new(Op::Release, seq)).map_err(PipelineError::transport)
            }
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lone_stage_runs_every_ready_sequence_in_one_batch() {
        let ready: Vec<u64> = (1..=8).collect();
        assert_eq!(micro_batches(&ready, 8, 0, 1), vec![&ready[..]]);
    }

    #[test]
    fn a_pipeline_gets_one_equal_batch_per_stage() {
        let ready: Vec<u64> = (1..=8).collect();
        assert_eq!(
            micro_batches(&ready, 8, 0, 2),
            vec![&ready[..4], &ready[4..]]
        );
        assert_eq!(
            micro_batches(&ready[..7], 7, 0, 3),
            vec![&ready[..3], &ready[3..6], &ready[6..7]]
        );
    }

    #[test]
    fn no_more_batches_are_started_than_stages_are_free() {
        // One request ran alone; seven joined while it was in flight: one batch of four
        // starts, the other three wait to ride with the first one when it comes back.
        let ready: Vec<u64> = (2..=8).collect();
        assert_eq!(micro_batches(&ready, 8, 1, 2), vec![&ready[..4]]);
        assert!(micro_batches(&ready, 8, 2, 2).is_empty());
        // Back from the later stages, the first sequence and the three that waited.
        let ready = [1, 6, 7, 8];
        assert_eq!(micro_batches(&ready, 8, 1, 2), vec![&ready[..]]);
    }

    #[test]
    fn a_batch_is_no_larger_than_a_step_can_carry() {
        let ready: Vec<u64> = (0..(3 * MAX_BATCH_ENTRIES as u64)).collect();
        let batches = micro_batches(&ready, ready.len(), 0, 1);
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].len(), MAX_BATCH_ENTRIES);
    }
}
