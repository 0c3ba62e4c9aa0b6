//! Job lifecycle for TrainingJobs and InferenceServices run by the exec executor:
//! Pending → Scheduled → Running → Succeeded | Failed.
//!
//! A job's ranks are a gang: placed all together (one allocation each, sharing an epoch), and
//! when one fails the whole gang is stopped and placed again under a new epoch, after an
//! exponential backoff, until `backoffLimit`. InferenceServices restart forever. A job whose
//! Mac is lost is placed again at once.

use std::collections::{BTreeMap, BTreeSet};
use tb_api::reason::Reason;

use tb_api::specs::{
    AdapterAssignment, AdapterRef, AllocationPhase, AllocationSpec, Backend, BuiltinAssignment,
    Checkpoints, Desired, Executor, FineTuneSpec, InferenceServiceSpec, JobRef, LayerRange,
    MlxAssignment, ModelSpec, TrainingJobSpec, allocation, parse_spec,
};
use tb_api::status::{JobPhase, JobStatus, PlacedStage, PlacementSummary, RankPlacement};
use tb_api::{Kind, Object, ObjectKey, ObjectMeta, Timestamp};

use super::placement::{GangRequest, RankSlot, place};
use super::view::{Alloc, ClusterView, JobFacts};
use super::{Clock, SchedulerConfig, event, preemption, time_of};
use crate::placement::{self as model_placement, Options, Topology, Workload, live};
use crate::store::{Plan, PlanWrite};

/// What the scheduler needs from either kind of job.
#[derive(Debug)]
pub(super) struct JobShape {
    kind: Kind,
    executor: Executor,
    ranks: u32,
    memory_bytes: u64,
    command: Vec<String>,
    env: BTreeMap<String, String>,
    working_dir: Option<String>,
    /// Where the job's manifest was applied from (its annotation), for the nodelets to look for
    /// a relative program in.
    manifest_dir: Option<String>,
    backend: Backend,
    node_selector: BTreeMap<String, String>,
    exclusive: bool,
    /// None: restart forever (services).
    backoff_limit: Option<u32>,
    active_deadline_seconds: Option<u64>,
    ttl_seconds_after_finished: Option<u64>,
    /// Built-in InferenceServices: the Model, context, batch and endpoint port asked for.
    service: Option<ServiceShape>,
    /// Built-in TrainingJobs: the Model, the dataset and what to train.
    trainer: Option<TrainerShape>,
    /// Where a TrainingJob saves checkpoints (given to its ranks, which resume from them).
    checkpoints: Option<Checkpoints>,
    /// Sized from a Model by the planner (services, and TrainingJobs naming a model without
    /// memory), rather than ranks × memory.
    sized_from_model: bool,
}

/// A built-in fine-tune: data parallel, every rank holds the whole model.
#[derive(Debug, Clone)]
struct TrainerShape {
    model: String,
    dataset: String,
    /// The Node holding `dataset`, which the other ranks fetch their examples from.
    dataset_node: Option<String>,
    finetune: FineTuneSpec,
    /// The job's own `memory`, which overrides the prediction.
    memory_bytes: Option<u64>,
}

#[derive(Debug, Clone)]
struct ServiceShape {
    model: String,
    adapter: Option<AdapterRef>,
    context: Option<u32>,
    batch: Option<u32>,
    endpoint_port: Option<u16>,
}

pub(super) fn shape(job: &Object, cfg: &SchedulerConfig) -> Option<JobShape> {
    match job.kind()? {
        Kind::TrainingJob => {
            let s: TrainingJobSpec = parse_spec(&job.spec).ok()?;
            let trainer = match (&s.executor, &s.model, &s.dataset, &s.finetune) {
                (Executor::Builtin, Some(model), Some(dataset), Some(finetune)) => {
                    Some(TrainerShape {
                        model: model.clone(),
                        dataset: dataset.clone(),
                        dataset_node: s.dataset_node.clone(),
                        finetune: finetune.clone(),
                        memory_bytes: s.memory.as_ref().map(|q| q.bytes()),
                    })
                }
                _ => None,
            };
            Some(JobShape {
                kind: Kind::TrainingJob,
                sized_from_model: s.model.is_some() && s.memory.is_none() && trainer.is_none(),
                trainer,
                checkpoints: s.checkpoints.clone(),
                executor: s.executor,
                ranks: s.ranks,
                memory_bytes: s
                    .memory
                    .as_ref()
                    .map_or(cfg.default_memory_bytes, |q| q.bytes()),
                backoff_limit: Some(s.backoff_limit()),
                command: s.command,
                env: s.env,
                working_dir: s.working_dir,
                manifest_dir: manifest_dir(job),
                backend: s.backend,
                node_selector: s.node_selector,
                exclusive: s.exclusive,
                active_deadline_seconds: s.active_deadline_seconds,
                ttl_seconds_after_finished: s.ttl_seconds_after_finished,
                service: None,
            })
        }
        Kind::InferenceService => {
            let s: InferenceServiceSpec = parse_spec(&job.spec).ok()?;
            let service = (s.executor == Executor::Builtin).then(|| ServiceShape {
                model: s.model.clone(),
                adapter: s.adapter.clone(),
                context: s.context,
                batch: s.batch,
                endpoint_port: s.endpoint.as_ref().and_then(|e| e.port),
            });
            Some(JobShape {
                kind: Kind::InferenceService,
                sized_from_model: true,
                checkpoints: None,
                executor: s.executor,
                ranks: s.nodes.min,
                memory_bytes: s
                    .memory
                    .as_ref()
                    .map_or(cfg.default_memory_bytes, |q| q.bytes()),
                command: s.command,
                env: s.env,
                working_dir: None,
                manifest_dir: manifest_dir(job),
                backend: Backend::Ring,
                node_selector: s.node_selector,
                exclusive: false,
                backoff_limit: None,
                active_deadline_seconds: None,
                ttl_seconds_after_finished: None,
                service,
                trainer: None,
            })
        }
        _ => None,
    }
}

/// The job's recorded manifest directory (validated by the API when the job was applied).
fn manifest_dir(job: &Object) -> Option<String> {
    job.metadata
        .annotations
        .get(allocation::ANNOTATION_MANIFEST_DIR)
        .cloned()
}

/// An InferenceService's stable URL: the controllers' services listener forwards
/// `/services/NAMESPACE/NAME/v1/...` to its current rank 0, so the address does not move when
/// the service is placed again.
fn stable_url(cfg: &SchedulerConfig, job: &Object) -> String {
    cfg.services_base
        .as_deref()
        .map(|base| {
            format!(
                "{}/services/{}/{}/v1",
                base.trim_end_matches('/'),
                job.metadata.namespace,
                job.metadata.name
            )
        })
        .unwrap_or_default()
}

/// Reconcile one job against the cluster; placements it makes are taken out of `view` so the
/// next job in the same pass sees them.
///
/// The steps, in order: retire ranks of older epochs; end of life (a finished job stops its
/// ranks and is deleted after its ttl); the deadline; the running gang (a spec change, a
/// drained Mac, or the ranks' own progress); then, when nothing is meant to run and any
/// backoff has passed, admission by the job's queue and placement.
pub fn reconcile_job(
    job: &Object,
    view: &mut ClusterView,
    clock: &Clock,
    cfg: &SchedulerConfig,
) -> Option<Plan> {
    let parsed = view.parsed_job(job, cfg);
    let Some(shape) = parsed.shape.as_ref() else {
        // Only a spec stored before the API refused it gets here.
        let error = match job.kind()? {
            Kind::TrainingJob => parse_spec::<TrainingJobSpec>(&job.spec).err(),
            Kind::InferenceService => parse_spec::<InferenceServiceSpec>(&job.spec).err(),
            _ => None,
        }?;
        return Some(super::invalid_spec(job, &error));
    };
    let mut status = parsed.status.clone();
    let before = &parsed.status;
    let mut plan = Plan::default();
    plan.guards.push((job.key(), job.metadata.resource_version));
    if shape.kind == Kind::InferenceService {
        status.url = stable_url(cfg, job);
    }

    let current = current_epoch(job, shape, &status, view, &mut plan);
    if status.phase.is_terminal() {
        end_of_life(job, shape, &status, &current, view, clock, &mut plan);
        return finish(job, status, before, plan);
    }
    if past_deadline(job, shape, &current, &mut status, clock, &mut plan) {
        return finish(job, status, before, plan);
    }
    let live = follow_gang(
        job,
        shape,
        &current,
        &mut status,
        &mut plan,
        view,
        clock,
        cfg,
    );
    if status.phase.is_terminal() {
        return finish(job, status, before, plan);
    }

    // Place when nothing of the current epoch is meant to run and any backoff has passed.
    let running_wanted = live && !plan_stops_all(&plan, &current);
    // No backoff lasts longer than the cap, so a retry time further away than that was set by
    // a clock that has since gone back (or by a leader whose clock ran ahead): it is over
    // rather than an hour-long wait after a clock jump.
    let backoff_over = time_of(&status.next_retry_time)
        .is_none_or(|t| clock.now >= t || t.signed_duration_since(clock.now) > cfg.backoff_cap);
    let stopping = ranks_still_stopping(job, shape, view);
    if !running_wanted && backoff_over && stopping == 0 && status.phase == JobPhase::Pending {
        match admit_and_place(job, shape, parsed.fields.queue.clone(), view) {
            Ok((placed, queue)) => {
                let admitted = Admitted { placed, queue };
                scheduled(job, shape, admitted, &mut status, view, clock, &mut plan);
            }
            // A preempted job keeps saying so until it is placed again.
            Err(why)
                if why.reason == Reason::Unschedulable
                    && matches!(
                        Reason::of(&status.reason),
                        Some(Reason::Preempted | Reason::Reclaimed)
                    ) => {}
            Err(why) => unschedulable(job, shape, why, &mut status, view, clock, &mut plan),
        }
    }
    finish(job, status, before, plan)
}

/// The job's allocations of its current epoch; those of older epochs (or an older object of
/// the same name) are retired in `plan`.
fn current_epoch(
    job: &Object,
    shape: &JobShape,
    status: &JobStatus,
    view: &ClusterView,
    plan: &mut Plan,
) -> Vec<Alloc> {
    let (ns, kind, name) = (
        job.metadata.namespace.as_str(),
        shape.kind.as_str(),
        job.metadata.name.as_str(),
    );
    let (current, stale): (Vec<Alloc>, Vec<Alloc>) =
        view.allocations_of(ns, kind, name).cloned().partition(|a| {
            a.spec.epoch == status.epoch && status.epoch > 0 && a.spec.job.uid == job.metadata.uid
        });
    for a in &stale {
        retire(a, plan);
    }
    current
}

/// A finished job: its ranks are stopped, and once `ttlSecondsAfterFinished` has passed it is
/// deleted with its allocations.
fn end_of_life(
    job: &Object,
    shape: &JobShape,
    status: &JobStatus,
    current: &[Alloc],
    view: &ClusterView,
    clock: &Clock,
    plan: &mut Plan,
) {
    for a in current {
        stop(a, plan);
    }
    let (Some(ttl), Some(done)) = (
        shape.ttl_seconds_after_finished,
        time_of(&status.completion_time),
    ) else {
        return;
    };
    if clock.now < done + chrono::TimeDelta::seconds(ttl as i64) {
        return;
    }
    let (ns, kind, name) = (
        job.metadata.namespace.as_str(),
        shape.kind.as_str(),
        job.metadata.name.as_str(),
    );
    for a in view.allocations_of(ns, kind, name) {
        plan.guards
            .push((a.object.key(), a.object.metadata.resource_version));
        plan.writes.push(PlanWrite::Delete {
            key: a.object.key(),
        });
    }
    plan.writes.push(PlanWrite::Delete { key: job.key() });
    plan.events.push(event(
        job,
        false,
        Reason::Deleted,
        &format!("finished {ttl}s ago (ttlSecondsAfterFinished)"),
    ));
}

/// Fail a job that ran longer than `activeDeadlineSeconds`, stopping its ranks.
fn past_deadline(
    job: &Object,
    shape: &JobShape,
    current: &[Alloc],
    status: &mut JobStatus,
    clock: &Clock,
    plan: &mut Plan,
) -> bool {
    let (Some(deadline), Some(start)) =
        (shape.active_deadline_seconds, time_of(&status.start_time))
    else {
        return false;
    };
    if clock.now < start + chrono::TimeDelta::seconds(deadline as i64) {
        return false;
    }
    for a in current {
        stop(a, plan);
    }
    let message = format!("ran longer than activeDeadlineSeconds ({deadline}s)");
    fail(status, Reason::DeadlineExceeded, &message, clock);
    plan.events
        .push(event(job, true, Reason::DeadlineExceeded, &message));
    true
}

/// The running gang: replaced when the spec changed, moved off a draining Mac, else followed
/// (`gang_progress`). Returns whether any rank of the current epoch is meant to run.
#[allow(clippy::too_many_arguments)]
fn follow_gang(
    job: &Object,
    shape: &JobShape,
    current: &[Alloc],
    status: &mut JobStatus,
    plan: &mut Plan,
    view: &ClusterView,
    clock: &Clock,
    cfg: &SchedulerConfig,
) -> bool {
    let spec_changed = status.epoch > 0 && status.observed_generation != job.metadata.generation;
    let live: Vec<&Alloc> = current
        .iter()
        .filter(|a| a.spec.desired == Desired::Run && !a.status.phase.is_terminal())
        .collect();
    if spec_changed && !live.is_empty() {
        for a in current {
            stop(a, plan);
        }
        let message = format!(
            "generation {} replaces the running ranks",
            job.metadata.generation
        );
        back_to_pending(status, Reason::SpecChanged, message, clock);
        plan.events
            .push(event(job, false, Reason::SpecChanged, &status.message));
    } else if let Some(a) = live
        .iter()
        .find(|a| view.nodes.get(&a.spec.node).is_none_or(|n| n.draining()))
    {
        // Moved off a draining (or deleted) Mac: not the job's fault, no retry used.
        for c in current {
            stop(c, plan);
        }
        let message = format!(
            "node {} is being drained; placing the gang again",
            a.spec.node
        );
        back_to_pending(status, Reason::Evicted, message, clock);
        plan.events
            .push(event(job, false, Reason::Evicted, &status.message.clone()));
    } else if matches!(status.phase, JobPhase::Scheduled | JobPhase::Running) && !current.is_empty()
    {
        // Pending means the gang's end was already handled (backing off, or re-placing).
        gang_progress(job, shape, current, status, plan, clock, cfg);
        if shape.service.is_some() {
            refresh_prediction(job, current, status, view);
        }
    }
    !live.is_empty()
}

/// A service's prediction kept current, one status change per change of what it rests on:
/// - placed on the chips' figures, it is costed again once every stage's Mac reports figures
///   measured on tb's engine (a nodelet measures them after it starts, so the first placement
///   often comes before);
/// - once rank 0 has observed its streams, what the same figures predict for one stream at
///   the context they held, beside what they did.
fn refresh_prediction(job: &Object, current: &[Alloc], status: &mut JobStatus, view: &ClusterView) {
    let Some(placed) = status.model_placement.as_ref() else {
        return;
    };
    let all_measured = placed.stages.iter().all(|s| {
        view.nodes
            .get(&s.node)
            .is_some_and(|n| n.status.capacity.engine.is_some())
    });
    let recost = placed.figures != "engine" && !placed.stages.is_empty() && all_measured;
    let observed_context = current
        .iter()
        .find(|a| a.spec.rank == 0)
        .and_then(|a| a.status.observed_context_tokens);
    let reassess = observed_context.is_some() && observed_context != placed.observed_context_tokens;
    if !recost && !reassess {
        return;
    }
    let Ok(Some(workload)) = workload(job, view) else {
        return;
    };
    let topology = view.topology();
    let mut next = placed.clone();
    if recost && let Some(costed) = live::recost(&topology, &workload, placed) {
        next = costed;
    }
    if let Some(context) = observed_context {
        next.observed_context_tokens = Some(context);
        next.predicted_at_observed_tokens_per_second =
            live::predict_for_stream(&topology, &workload, &next, context);
    }
    status.model_placement = Some(next);
}

/// Pending again, to be placed at once (no backoff), for a reason that is not the job's fault.
fn back_to_pending(status: &mut JobStatus, reason: Reason, message: String, clock: &Clock) {
    not_ready(status, reason, clock);
    status.phase = JobPhase::Pending;
    status.reason = reason.into();
    status.message = message;
    status.next_retry_time = None;
}

/// Admission and placement: the job's queue (if any) must exist and take it, the gang must fit
/// on Macs, and the queue's quota must hold the placement. Returns the placement and the queue.
fn admit_and_place(
    job: &Object,
    shape: &JobShape,
    queue: Option<String>,
    view: &ClusterView,
) -> Result<(Placed, Option<String>), Refusal> {
    let queue = view
        .queues
        .resolve(&job.metadata.namespace, queue)
        .map_err(|h| refuse(h.reason, h.message))?;
    let placed = place_job(job, shape, view)?;
    let Some(q) = &queue else {
        return Ok((placed, queue));
    };
    match admit(view, q, &placed) {
        Ok(()) => Ok((placed, queue)),
        // Placement spreads ranks over the emptiest Macs; a queue short of Macs may still fit
        // on the ones it holds (and the few more it may take).
        Err(held) => match place_within_mac_quota(job, shape, view, q) {
            Some(placed) if admit(view, q, &placed).is_ok() => Ok((placed, queue)),
            _ => Err(refuse(held.reason, held.message)),
        },
    }
}

/// A placement its queue took.
struct Admitted {
    placed: Placed,
    queue: Option<String>,
}

/// A placed gang: its allocations under the next epoch, charged to its queue, and the job's
/// status says where.
fn scheduled(
    job: &Object,
    shape: &JobShape,
    Admitted { placed, queue }: Admitted,
    status: &mut JobStatus,
    view: &mut ClusterView,
    clock: &Clock,
    plan: &mut Plan,
) {
    let epoch = status.epoch + 1;
    create_gang(job, shape, &placed, epoch, view, plan);
    if let Some(q) = &queue {
        view.queues.charge(
            q,
            placed.memory_bytes.iter().sum(),
            placed.slots.iter().map(|s| s.node.clone()),
        );
    }
    let slots = &placed.slots;
    status.epoch = epoch;
    // A new gang: it has not run yet, whatever its predecessor did.
    status.running_since = None;
    status.phase = JobPhase::Scheduled;
    status.reason = Reason::Scheduled.into();
    status.message = String::new();
    status.next_retry_time = None;
    status.observed_generation = job.metadata.generation;
    if status.start_time.is_none() {
        status.start_time = Some(clock.stamp.clone());
    }
    status.placement = slots
        .iter()
        .enumerate()
        .map(|(rank, s)| RankPlacement {
            rank: rank as u32,
            node: s.node.clone(),
            allocation: allocation::allocation_name(&job.metadata.name, epoch, rank as u32),
        })
        .collect();
    status.nodes = slots.iter().map(|s| s.node.clone()).collect();
    status.set_condition("Scheduled", true, Reason::Scheduled, "", &clock.stamp);
    let mut message = format!(
        "epoch {epoch}: {} rank(s) on {}",
        slots.len(),
        status.nodes.join(",")
    );
    if shape.trainer.is_some() {
        if let Some(p) = &placed.summary {
            message.push_str(&format!(" (data parallel; {})", p.note));
        }
    } else if let Some(p) = &placed.summary {
        message.push_str(&format!(
            " ({}, {:.1} tok/s predicted)",
            p.strategy, p.predicted_tokens_per_second
        ));
    }
    status.model_placement = placed.summary;
    plan.events
        .push(event(job, false, Reason::Scheduled, &message));
}

/// Not placed: try to make room by preemption when nothing fits, and say why it waits (an
/// event only when the reason's text changes).
fn unschedulable(
    job: &Object,
    shape: &JobShape,
    why: Refusal,
    status: &mut JobStatus,
    view: &mut ClusterView,
    clock: &Clock,
    plan: &mut Plan,
) {
    let why = if why.reason == Reason::Unschedulable {
        make_room(job, shape, why, view, clock, plan)
    } else {
        why
    };
    status.reason = why.reason.into();
    if status.message != why.message {
        plan.events
            .push(event(job, true, Reason::FailedScheduling, &why.message));
    }
    status.message = why.message;
    status.set_condition(
        "Scheduled",
        false,
        why.reason,
        &status.message.clone(),
        &clock.stamp,
    );
}

/// Follow the current gang: all running, all done, or one failed.
fn gang_progress(
    job: &Object,
    shape: &JobShape,
    current: &[Alloc],
    status: &mut JobStatus,
    plan: &mut Plan,
    clock: &Clock,
    cfg: &SchedulerConfig,
) {
    let world = current.first().map_or(shape.ranks, |a| a.spec.world_size) as usize;
    let phase_count = |p: AllocationPhase| current.iter().filter(|a| a.status.phase == p).count();
    // Whose end the gang's end is: a lost Mac first, then a rank's own failure, and a stage
    // that only saw its peer go away last.
    let failed = current
        .iter()
        .filter(|a| {
            matches!(
                a.status.phase,
                AllocationPhase::Failed | AllocationPhase::Lost | AllocationPhase::Stopped
            )
        })
        .min_by_key(|a| (blame_order(a), a.spec.rank));
    if let Some(a) = failed
        && waits_for_the_culprit(a, current, clock, cfg)
    {
        // The peer's own report, or its Mac's loss, is due within the node grace: wait for it,
        // so that a lost Mac re-places the gang at once instead of counting a failure.
        not_ready(status, Reason::RankEnded, clock);
        return;
    }
    let succeeded_service =
        shape.kind == Kind::InferenceService && phase_count(AllocationPhase::Succeeded) > 0;

    if let Some(a) = failed.or_else(|| {
        // A service that exits, even cleanly, is down: treat as a failure to restart.
        if succeeded_service {
            current
                .iter()
                .find(|a| a.status.phase == AllocationPhase::Succeeded)
        } else {
            None
        }
    }) {
        for c in current {
            stop(c, plan);
        }
        not_ready(status, Reason::RankEnded, clock);
        let ran_healthy = time_of(&status.running_since)
            .is_some_and(|t| clock.now.signed_duration_since(t) >= cfg.backoff_reset);
        status.running_since = None;
        let lost = a.status.phase == AllocationPhase::Lost;
        let what = describe_end(a);
        if Reason::of(&a.status.reason).is_some_and(Reason::is_permanent) {
            let message = format!("rank {} on {}: {}", a.spec.rank, a.spec.node, what);
            fail(status, &a.status.reason, &message, clock);
            plan.events
                .push(event(job, true, &a.status.reason, &message));
            return;
        }
        if lost {
            // Losing a Mac is not the job's fault: place again now, without using a retry.
            status.phase = JobPhase::Pending;
            status.reason = Reason::NodeLost.into();
            status.message = format!(
                "rank {} lost with node {}; placing the gang again",
                a.spec.rank, a.spec.node
            );
            status.next_retry_time = None;
            plan.events
                .push(event(job, true, Reason::NodeLost, &status.message.clone()));
            return;
        }
        if let Some(limit) = shape.backoff_limit
            && status.restarts >= limit
        {
            let message = format!(
                "rank {} on {}: {}; backoffLimit {limit} reached",
                a.spec.rank, a.spec.node, what
            );
            fail(status, Reason::BackoffLimitExceeded, &message, clock);
            plan.events
                .push(event(job, true, Reason::BackoffLimitExceeded, &message));
            return;
        }
        status.restarts += 1;
        // A gang that had been running well for a while starts its backoff afresh: one
        // failure a day should not wait out the cap.
        status.failure_streak = if ran_healthy {
            1
        } else {
            status.failure_streak.saturating_add(1)
        };
        let delay = backoff(status.failure_streak, cfg);
        status.phase = JobPhase::Pending;
        status.reason = Reason::BackOff.into();
        status.message = format!(
            "rank {} on {}: {}; restarting the gang in {}s (restart {})",
            a.spec.rank,
            a.spec.node,
            what,
            delay.num_milliseconds() as f64 / 1000.0,
            status.restarts
        );
        status.next_retry_time = Some(Timestamp::from_datetime(clock.now + delay));
        plan.events
            .push(event(job, true, Reason::BackOff, &status.message.clone()));
        return;
    }

    if shape.trainer.is_some()
        && let Some(rank0) = current.iter().find(|a| a.spec.rank == 0)
        && let Some(progress) = &rank0.status.training
    {
        let mut progress = progress.clone().bounded();
        if let Some(a) = &mut progress.adapter {
            a.node = rank0.spec.node.clone();
        }
        status.training = Some(progress);
    }
    if shape.kind == Kind::TrainingJob
        && phase_count(AllocationPhase::Succeeded) == world
        && current.len() == world
    {
        status.phase = JobPhase::Succeeded;
        status.reason = Reason::Succeeded.into();
        status.message = format!("all {world} rank(s) exited 0");
        status.completion_time = Some(clock.stamp.clone());
        status.set_condition(
            "Complete",
            true,
            Reason::Succeeded,
            &status.message.clone(),
            &clock.stamp,
        );
        plan.events.push(event(
            job,
            false,
            Reason::Completed,
            &status.message.clone(),
        ));
        return;
    }
    let running = phase_count(AllocationPhase::Running) + phase_count(AllocationPhase::Succeeded);
    if running == world && status.running_since.is_none() {
        status.running_since = Some(clock.stamp.clone());
    }
    if running == world && status.phase != JobPhase::Running {
        status.phase = JobPhase::Running;
        status.reason = Reason::Running.into();
        status.message = format!("all {world} rank(s) running");
        if shape.kind == Kind::InferenceService && shape.service.is_none() {
            status.set_condition("Ready", true, Reason::Running, "", &clock.stamp);
        }
        plan.events
            .push(event(job, false, Reason::Started, &status.message.clone()));
    }
    // A built-in service is Ready once rank 0 has answered through every stage.
    if shape.service.is_some() {
        let rank0 = current.iter().find(|a| a.spec.rank == 0);
        status.endpoint = rank0.map(|a| a.status.endpoint.clone()).unwrap_or_default();
        if let Some(p) = status.model_placement.as_mut() {
            p.observed_tokens_per_second = rank0.and_then(|a| a.status.observed_tokens_per_second);
        }
        let ready = running == world && rank0.is_some_and(|a| a.status.ready);
        let was = status
            .condition("Ready")
            .is_some_and(|c| c.status == "True");
        if ready != was || status.condition("Ready").is_none() {
            let (reason, message) = if ready {
                (
                    Reason::EndpointReady,
                    format!("{} answers", status.endpoint),
                )
            } else {
                (
                    Reason::EndpointNotReady,
                    "waiting for rank 0 to answer through every stage".to_string(),
                )
            };
            status.set_condition("Ready", ready, reason, &message, &clock.stamp);
            if ready {
                plan.events.push(event(job, false, "Ready", &message));
            }
        }
    }
}

/// A service whose gang ended is not ready (and has no endpoint) until placed again.
fn not_ready(status: &mut JobStatus, reason: Reason, clock: &Clock) {
    status.endpoint.clear();
    if status
        .condition("Ready")
        .is_some_and(|c| c.status == "True")
    {
        status.set_condition("Ready", false, reason.as_str(), "", &clock.stamp);
    }
}

fn describe_end(a: &Alloc) -> String {
    let s = &a.status;
    let end = match (s.exit_code, s.signal) {
        (_, Some(sig)) => format!("killed by signal {sig}"),
        (Some(code), None) => format!("exited with code {code}"),
        (None, None) if !s.message.is_empty() => return s.message.clone(),
        (None, None) => return s.phase.as_str().to_ascii_lowercase(),
    };
    // A process that said why it failed (tb-shard's ModelLoadFailed, say): keep its words.
    match s.message.split_once(": ") {
        Some((_, why))
            if !s.reason.is_empty()
                && !matches!(
                    Reason::of(&s.reason),
                    Some(Reason::Error | Reason::Completed | Reason::Stopped)
                ) =>
        {
            format!("{end}: {}: {why}", s.reason)
        }
        _ => end,
    }
}

fn fail(status: &mut JobStatus, reason: impl AsRef<str>, message: &str, clock: &Clock) {
    let reason = reason.as_ref();
    status.phase = JobPhase::Failed;
    status.reason = reason.to_string();
    status.message = message.to_string();
    status.completion_time = Some(clock.stamp.clone());
    status.next_retry_time = None;
    status.set_condition("Failed", true, reason, message, &clock.stamp);
}

/// The order in which ended ranks are blamed for a gang's end (lower first).
fn blame_order(a: &Alloc) -> u8 {
    match (a.status.phase, Reason::of(&a.status.reason)) {
        (AllocationPhase::Lost, _) => 0,
        (_, Some(Reason::PeerLost)) => 2,
        _ => 1,
    }
}

/// Whether the rank to blame only saw a peer go away while other ranks of the gang have not
/// ended yet, and not much more than a node grace has passed since: the culprit has yet to
/// report (or its Mac to be found lost).
fn waits_for_the_culprit(
    blamed: &Alloc,
    current: &[Alloc],
    clock: &Clock,
    cfg: &SchedulerConfig,
) -> bool {
    if Reason::of(&blamed.status.reason) != Some(Reason::PeerLost) {
        return false;
    }
    let others_running = current
        .iter()
        .any(|a| !a.status.phase.is_terminal() && a.spec.rank != blamed.spec.rank);
    // The peer's Mac is found lost a node grace after its last heartbeat, which came before
    // the peer went; half a grace more covers the pass that finds it.
    let wait = cfg.node_grace + cfg.node_grace / 2;
    let recent = time_of(&blamed.status.finished_at)
        .is_some_and(|t| clock.now.signed_duration_since(t) < wait);
    others_running && recent
}

/// 10 s, doubling with each failure in a row, capped (the base and cap are configurable for
/// tests).
fn backoff(failures: u32, cfg: &SchedulerConfig) -> chrono::TimeDelta {
    let factor = 1i32
        .checked_shl(failures.saturating_sub(1).min(20))
        .unwrap_or(i32::MAX);
    (cfg.backoff_base * factor).min(cfg.backoff_cap)
}

/// Ask the nodelet to stop a rank (kept until it reports how the process ended).
fn stop(a: &Alloc, plan: &mut Plan) {
    if a.spec.desired == Desired::Stop
        || a.status.phase.is_terminal()
        || plan_touches(plan, &a.object.key())
    {
        return;
    }
    let mut obj = (*a.object).clone();
    let mut spec = a.spec.clone();
    spec.desired = Desired::Stop;
    obj.spec = serde_json::to_value(&spec).unwrap_or_default();
    plan.guards
        .push((a.object.key(), a.object.metadata.resource_version));
    plan.writes.push(PlanWrite::Put(obj));
}

/// A job that fits nowhere: stop lower-priority gangs, or gangs of queues borrowing beyond
/// their quota when this job's queue is under its own, if that makes room (see `preemption`).
fn make_room(
    job: &Object,
    shape: &JobShape,
    why: Refusal,
    view: &ClusterView,
    clock: &Clock,
    plan: &mut Plan,
) -> Refusal {
    let key = (
        job.kind.clone(),
        job.metadata.namespace.clone(),
        job.metadata.name.clone(),
    );
    let (priority, queue) = match view.facts.get(&key) {
        Some(f) => (f.priority, f.queue.clone()),
        None => (
            view.queues.priority_of(job),
            view.queues.queue_of(job).ok().flatten(),
        ),
    };
    let gang_memory = shape.memory_bytes.saturating_mul(u64::from(shape.ranks));
    let reclaim = queue
        .clone()
        .filter(|q| view.queues.within_quota(q, gang_memory, shape.ranks));
    // Whose lower-priority work this job may stop is its queue's policy (unqueued work: only
    // its own namespace's). Reclaiming borrowed capacity is what borrowing agreed to, so it
    // crosses namespaces whatever the policy says.
    let policy = queue
        .as_deref()
        .and_then(|q| view.queues.specs.get(q))
        .map(|q| q.preemption)
        .unwrap_or_default();
    let namespace = job.metadata.namespace.as_str();
    let eligible = |their_namespace: &str, theirs: &JobFacts| -> Option<Reason> {
        let p = theirs.priority;
        if p < priority && policy.towards(namespace, their_namespace).allows() {
            return Some(Reason::Preempted);
        }
        let ours = reclaim.as_deref()?;
        let theirs = theirs.queue.as_deref()?;
        (theirs != ours && p <= priority && view.queues.borrowing(theirs))
            .then_some(Reason::Reclaimed)
    };
    // Room is made only if the job then also fits its queue's quota (stopping the queue's own
    // lower-priority work counts), else it would preempt on every pass and still not start.
    let fits = |trial: &ClusterView| match place_job(job, shape, trial) {
        Ok(placed) => queue.as_deref().is_none_or(|q| {
            let memory = placed.memory_bytes.iter().sum();
            let macs = placed.slots.iter().map(|s| s.node.clone()).collect();
            trial.queues.admit(q, memory, &macs).is_ok()
        }),
        Err(_) => false,
    };
    // Nothing to stop for one job is nothing to stop for the next of the same priority, queue
    // standing and shape, until capacity changes (which clears the memo).
    let hopeless_key = (!shape.sized_from_model && shape.service.is_none()).then(|| {
        format!(
            "hopeless:{priority}:{queue:?}:{namespace}:{reclaim:?}:{}x{}:{}:{:?}",
            shape.ranks, shape.memory_bytes, shape.exclusive, shape.node_selector
        )
    });
    if let Some(k) = &hopeless_key
        && view.unplaceable.borrow().contains_key(k)
    {
        return why;
    }
    match preemption::choose(job, view, &eligible, fits) {
        preemption::Choice::Hopeless => {
            if let Some(k) = hopeless_key {
                view.unplaceable.borrow_mut().insert(k, String::new());
            }
            // A gang bigger than its queue may ever hold says so, not just that the lab is full.
            match queue.as_deref().map(|q| {
                view.queues
                    .admit(q, gang_memory, &std::collections::BTreeSet::new())
            }) {
                Some(Err(held)) => refuse(held.reason, held.message),
                _ => why,
            }
        }
        preemption::Choice::Waiting => refuse(
            Reason::WaitingForPreemption,
            "waiting for the ranks of preempted jobs to end",
        ),
        preemption::Choice::Preempt(victims) => {
            let names: Vec<String> = victims
                .iter()
                .map(|v| format!("{}/{}", v.job.kind, v.job.metadata.name))
                .collect();
            for v in &victims {
                preempt(v, job, priority, reclaim.as_deref(), clock, plan);
            }
            let what = if victims.iter().all(|v| v.reason == Reason::Reclaimed) {
                "borrowed capacity held by"
            } else {
                "lower-priority"
            };
            refuse(
                Reason::WaitingForPreemption,
                format!("stopping {what} {} to make room", names.join(", ")),
            )
        }
    }
}

/// Stop a gang for `by` and put it back in line (Pending, reason Preempted or Reclaimed); its
/// retries are not used.
fn preempt(
    v: &preemption::Victim,
    by: &Object,
    priority: i32,
    queue: Option<&str>,
    clock: &Clock,
    plan: &mut Plan,
) {
    for a in &v.allocations {
        stop(a, plan);
    }
    let mut status = JobStatus::from_value(&v.job.status);
    status.phase = JobPhase::Pending;
    status.reason = v.reason.into();
    status.message = if v.reason == Reason::Reclaimed {
        format!(
            "its queue borrowed beyond its quota; queue {} reclaimed the capacity for {}/{}; \
             waiting to be placed again",
            queue.unwrap_or("-"),
            by.kind,
            by.metadata.name
        )
    } else {
        format!(
            "preempted by {}/{} (priority {priority} over {}); waiting to be placed again",
            by.kind, by.metadata.name, v.priority
        )
    };
    status.next_retry_time = None;
    status.set_condition(
        "Scheduled",
        false,
        v.reason,
        &status.message.clone(),
        &clock.stamp,
    );
    plan.guards
        .push((v.job.key(), v.job.metadata.resource_version));
    plan.writes.push(PlanWrite::Status {
        key: v.job.key(),
        status: status.to_value(),
    });
    plan.events
        .push(event(&v.job, true, v.reason, &status.message.clone()));
}

/// An allocation of an older epoch: stopped, then deleted once it has ended.
fn retire(a: &Alloc, plan: &mut Plan) {
    if a.status.phase.is_terminal() {
        plan.guards
            .push((a.object.key(), a.object.metadata.resource_version));
        plan.writes.push(PlanWrite::Delete {
            key: a.object.key(),
        });
    } else {
        stop(a, plan);
    }
}

fn plan_touches(plan: &Plan, key: &ObjectKey) -> bool {
    plan.guards.iter().any(|(k, _)| k == key)
}

/// Ranks of the job (of any epoch) not yet known to have stopped on a Mac the controllers still
/// hear from. A new gang waits for them, so two epochs of one rank never run at once (a rank
/// that moves to another Mac would otherwise start while its predecessor is still being
/// stopped). Ranks on a Mac that went silent do not count: its nodelet fences them at 3/4 of
/// the node grace, before the Mac is found lost.
fn ranks_still_stopping(job: &Object, shape: &JobShape, view: &ClusterView) -> usize {
    let (ns, kind, name) = (
        job.metadata.namespace.as_str(),
        shape.kind.as_str(),
        job.metadata.name.as_str(),
    );
    view.allocations_of(ns, kind, name)
        .filter(|a| {
            !a.status.phase.is_terminal() && view.nodes.get(&a.spec.node).is_some_and(|n| n.ready)
        })
        .count()
}

fn plan_stops_all(plan: &Plan, current: &[Alloc]) -> bool {
    current
        .iter()
        .filter(|a| a.spec.desired == Desired::Run && !a.status.phase.is_terminal())
        .all(|a| plan_touches(plan, &a.object.key()))
}

/// Where a gang goes: one slot per rank, in rank order, with what each rank holds.
struct Placed {
    slots: Vec<RankSlot>,
    memory_bytes: Vec<u64>,
    layers: Vec<Option<LayerRange>>,
    ibv_devices: Option<Vec<Vec<Option<String>>>>,
    summary: Option<PlacementSummary>,
    /// Built-in services: the port rank 0 serves the API on.
    endpoint_port: Option<u16>,
}

/// Why a gang was not placed.
struct Refusal {
    reason: Reason,
    message: String,
}

fn refuse(reason: Reason, message: impl Into<String>) -> Refusal {
    Refusal {
        reason,
        message: message.into(),
    }
}

/// The workload of a job sized by a Model, or None for `ranks` × `memory` jobs.
fn workload(job: &Object, view: &ClusterView) -> Result<Option<Workload>, Refusal> {
    live::workload_for(job, &view.models).map_err(|e| match e {
        live::WorkloadError::ModelNotFound(m) => refuse(Reason::ModelNotFound, m),
        live::WorkloadError::ModelIncomplete(m) => refuse(Reason::ModelIncomplete, m),
    })
}

/// Whether `placed` fits queue `q`'s quota (plus what it may borrow).
fn admit(view: &ClusterView, q: &str, placed: &Placed) -> Result<(), super::queues::Held> {
    let memory: u64 = placed.memory_bytes.iter().sum();
    let macs = placed.slots.iter().map(|s| s.node.clone()).collect();
    view.queues.admit(q, memory, &macs)
}

/// For a queue with a Mac quota: place the gang on the Macs the queue already holds plus as
/// many others (most free memory first) as the quota and borrowing limit still allow, ranks
/// stacking where they must. None when the queue has no Mac quota or there is no such fit.
fn place_within_mac_quota(
    job: &Object,
    shape: &JobShape,
    view: &ClusterView,
    q: &str,
) -> Option<Placed> {
    let spec = view.queues.specs.get(q)?;
    let quota = spec.quota.macs?;
    let limit = quota
        + spec
            .borrowing_limit
            .as_ref()
            .and_then(|b| b.macs)
            .unwrap_or(0);
    let held = view
        .queues
        .usage
        .get(q)
        .map(|u| u.macs.clone())
        .unwrap_or_default();
    let room = (limit as usize).saturating_sub(held.len());
    let mut others: Vec<&super::view::NodeView> = view
        .nodes
        .values()
        .filter(|n| !held.contains(&n.name) && n.schedulable())
        .collect();
    others.sort_by(|a, b| b.free_bytes.cmp(&a.free_bytes).then(a.name.cmp(&b.name)));
    let allowed: std::collections::BTreeSet<&str> = held
        .iter()
        .map(String::as_str)
        .chain(others.iter().take(room).map(|n| n.name.as_str()))
        .collect();
    let mut trial = view.clone();
    trial.unplaceable.borrow_mut().clear();
    for n in trial.nodes.values_mut() {
        if !allowed.contains(n.name.as_str()) {
            n.spec.unschedulable = true;
        }
    }
    let placed = place_job(job, shape, &trial).ok();
    trial.unplaceable.borrow_mut().clear();
    placed
}

/// Place a job: a Model's layers split by the topology-aware planner, or `ranks` × `memory`
/// spread by memory and ordered along the cables.
fn place_job(job: &Object, shape: &JobShape, view: &ClusterView) -> Result<Placed, Refusal> {
    if let Some(t) = &shape.trainer {
        return place_trainer(job, shape, t, view);
    }
    if let Some(adapter) = shape.service.as_ref().and_then(|s| s.adapter.as_ref()) {
        resolve_adapter(job, adapter, view)?;
    }
    let workload = if shape.sized_from_model {
        workload(job, view)?
    } else {
        None
    };
    // Plain ranks × memory gangs: a shape that did not fit still does not, until a gang is
    // created or resources are freed in a trial view (both clear the memo).
    let plain = workload.is_none() && shape.service.is_none() && !shape.backend.is_jaccl();
    let memo_key = plain.then(|| {
        format!(
            "{}x{}:{}:{:?}",
            shape.ranks, shape.memory_bytes, shape.exclusive, shape.node_selector
        )
    });
    if let Some(k) = &memo_key
        && let Some(message) = view.unplaceable.borrow().get(k)
    {
        return Err(refuse(Reason::Unschedulable, message.clone()));
    }
    let topology = view.topology();
    let result = place_workload(shape, view, &topology, workload);
    if let (Some(k), Err(why)) = (memo_key, &result)
        && why.reason == Reason::Unschedulable
    {
        view.unplaceable.borrow_mut().insert(k, why.message.clone());
    }
    result
}

/// Place a job whose workload is known (see `place_job`).
fn place_workload(
    shape: &JobShape,
    view: &ClusterView,
    topology: &Topology,
    workload: Option<Workload>,
) -> Result<Placed, Refusal> {
    let mut placed = match workload {
        Some(w) => place_model(topology, &w, view)?,
        None if shape.service.is_some() => {
            return Err(refuse(
                Reason::ModelIncomplete,
                "the built-in executor needs the Model's shape (layers, hiddenSize, heads, ...)",
            ));
        }
        None => place_ranks(topology, shape, shape.memory_bytes, view)?,
    };
    if let Some(svc) = &shape.service {
        let rank0 = &placed.slots[0];
        let port = match svc.endpoint_port {
            Some(p) => p,
            None => view
                .nodes
                .get(&rank0.node)
                .and_then(|n| {
                    let r = n.status.port_range;
                    (r.start..=r.end)
                        .find(|p| *p != 0 && *p != rank0.port && !n.used_ports.contains(p))
                })
                .ok_or_else(|| {
                    refuse(
                        Reason::Unschedulable,
                        format!("{} has no free port for the endpoint", rank0.node),
                    )
                })?,
        };
        placed.endpoint_port = Some(port);
    }
    if shape.backend.is_jaccl() {
        let nodes: Vec<String> = placed.slots.iter().map(|s| s.node.clone()).collect();
        placed.ibv_devices = Some(jaccl_matrix(topology, &nodes, shape.backend)?);
    }
    Ok(placed)
}

fn place_model(topology: &Topology, w: &Workload, view: &ClusterView) -> Result<Placed, Refusal> {
    let plan = model_placement::plan(topology, w, &Options::default())
        .map_err(|u| refuse(Reason::Unschedulable, u.message))?;
    let mut slots = Vec::with_capacity(plan.stages.len());
    for stage in &plan.stages {
        let port = view.nodes.get(&stage.node).and_then(|n| {
            let r = n.status.port_range;
            (r.start..=r.end).find(|p| *p != 0 && !n.used_ports.contains(p))
        });
        let Some(port) = port else {
            return Err(refuse(
                Reason::Unschedulable,
                format!("{} has no free port in its port range", stage.node),
            ));
        };
        slots.push(RankSlot {
            node: stage.node.clone(),
            port,
        });
    }
    let pipeline = plan.strategy == model_placement::Strategy::Pipeline;
    Ok(Placed {
        slots,
        memory_bytes: plan.stages.iter().map(|s| s.memory_bytes).collect(),
        layers: plan
            .stages
            .iter()
            .map(|s| {
                pipeline.then_some(LayerRange {
                    first: s.first_layer,
                    count: s.layers,
                })
            })
            .collect(),
        ibv_devices: None,
        summary: Some(live::summary(&plan)),
        endpoint_port: None,
    })
}

/// A built-in fine-tune: `ranks` Macs each holding the whole model (data parallel), each
/// reserving what the trainer is predicted to need (or the job's `memory`).
fn place_trainer(
    job: &Object,
    shape: &JobShape,
    t: &TrainerShape,
    view: &ClusterView,
) -> Result<Placed, Refusal> {
    let ns = &job.metadata.namespace;
    let model = view
        .models
        .get(&(ns.clone(), t.model.clone()))
        .ok_or_else(|| {
            refuse(
                Reason::ModelNotFound,
                format!("Model {ns}/{} does not exist (apply it first)", t.model),
            )
        })?;
    if let Some(node) = &t.dataset_node
        && probe_address(view, node).is_none()
    {
        return Err(refuse(
            Reason::DatasetNotReady,
            format!("the dataset is on Node {node} (datasetNode), which is not Ready to serve it"),
        ));
    }
    let predicted =
        model_placement::finetune::finetune_memory(&t.model, model, &t.finetune, shape.ranks)
            .map_err(|m| refuse(Reason::ModelIncomplete, m))?;
    let memory_bytes = t.memory_bytes.unwrap_or(predicted.total_bytes);
    let mut placed = place_ranks(&view.topology(), shape, memory_bytes, view)?;
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    placed.summary = Some(PlacementSummary {
        strategy: "data".into(),
        objective: "throughput".into(),
        stages: placed
            .slots
            .iter()
            .map(|s| PlacedStage {
                node: s.node.clone(),
                first_layer: 0,
                layers: model.layers.unwrap_or(0),
                memory_bytes,
                weight_bytes: predicted.base_bytes,
                kv_bytes: 0,
            })
            .collect(),
        note: format!(
            "predicted per rank: {:.2} GiB f32 base weights + {:.3} GiB adapters, gradients and \
             AdamW moments + {:.2} GiB activations + runtime = {:.2} GiB{}",
            gib(predicted.base_bytes),
            gib(predicted.adapter_bytes),
            gib(predicted.activation_bytes),
            gib(predicted.total_bytes),
            if t.memory_bytes.is_some() {
                format!(
                    "; the job's memory ({:.2} GiB) is reserved",
                    gib(memory_bytes)
                )
            } else {
                String::new()
            }
        ),
        ..Default::default()
    });
    Ok(placed)
}

fn place_ranks(
    topology: &Topology,
    shape: &JobShape,
    memory_bytes: u64,
    view: &ClusterView,
) -> Result<Placed, Refusal> {
    let req = GangRequest {
        ranks: shape.ranks,
        memory_bytes,
        node_selector: shape.node_selector.clone(),
        exclusive: shape.exclusive,
    };
    let mut slots =
        place(&req, &view.nodes).map_err(|u| refuse(Reason::Unschedulable, u.message))?;
    // Rank order is ring order for MLX: follow the cables.
    let nodes: Vec<String> = slots.iter().map(|s| s.node.clone()).collect();
    let (order, _ring) = model_placement::search::cable_order(topology, &nodes);
    let mut ordered = Vec::with_capacity(slots.len());
    for node in order {
        if let Some(i) = slots.iter().position(|s| s.node == node) {
            ordered.push(slots.remove(i));
        }
    }
    ordered.append(&mut slots);
    Ok(Placed {
        memory_bytes: vec![memory_bytes; ordered.len()],
        layers: vec![None; ordered.len()],
        slots: ordered,
        ibv_devices: None,
        summary: None,
        endpoint_port: None,
    })
}

/// JACCL's device matrix, or why the cables cannot carry it: a mesh needs an RDMA cable
/// between every pair of Macs, a ring between neighbours.
fn jaccl_matrix(
    topology: &Topology,
    nodes: &[String],
    backend: Backend,
) -> Result<Vec<Vec<Option<String>>>, Refusal> {
    let matrix = live::ibv_matrix(topology, nodes);
    let n = nodes.len();
    let needed = |i: usize, j: usize| match backend {
        Backend::JacclRing => j == (i + 1) % n || i == (j + 1) % n,
        _ => true,
    };
    for i in 0..n {
        for j in 0..n {
            if i != j && nodes[i] != nodes[j] && needed(i, j) && matrix[i][j].is_none() {
                return Err(refuse(
                    Reason::Unschedulable,
                    format!(
                        "backend {backend} needs an RDMA cable between {} and {}; there is none \
                         (use backend: ring for TCP)",
                        nodes[i], nodes[j]
                    ),
                ));
            }
        }
    }
    Ok(matrix)
}

fn create_gang(
    job: &Object,
    shape: &JobShape,
    placed: &Placed,
    epoch: u64,
    view: &mut ClusterView,
    plan: &mut Plan,
) {
    view.unplaceable.borrow_mut().clear();
    let slots = &placed.slots;
    let host = |node: &str| {
        view.nodes
            .get(node)
            .map(|n| n.status.host().to_string())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "127.0.0.1".into())
    };
    let hosts: Vec<String> = slots
        .iter()
        .map(|s| format!("{}:{}", host(&s.node), s.port))
        .collect();
    let mlx = MlxAssignment {
        backend: shape.backend,
        coordinator: match shape.backend {
            Backend::Ring => None,
            _ => hosts.first().cloned(),
        },
        hosts,
        ibv_devices: placed.ibv_devices.clone(),
    };
    let model_name = shape
        .service
        .as_ref()
        .map(|svc| &svc.model)
        .or(shape.trainer.as_ref().map(|t| &t.model));
    let model = model_name.and_then(|name| {
        view.models
            .get(&(job.metadata.namespace.clone(), name.clone()))
    });
    // Per rank: where it stages the model from, and whether it keeps a whole copy.
    let staging: Vec<(Vec<String>, bool)> = match model {
        Some(m) => {
            let copies = ModelCopies::of(m, view, slots);
            slots
                .iter()
                .enumerate()
                .map(|(rank, slot)| {
                    (
                        copies.sources_for(&slot.node, &host),
                        copies.replicate.contains(&rank),
                    )
                })
                .collect()
        }
        None => Vec::new(),
    };
    // Resolved when the gang was placed; a service without one was refused there.
    let adapter = shape
        .service
        .as_ref()
        .and_then(|s| s.adapter.as_ref())
        .and_then(|a| resolve_adapter(job, a, view).ok());
    let builtin = model_name.map(|name| {
        let model_path = model
            .and_then(|m| m.source.path.clone())
            .unwrap_or_default();
        let ips: Vec<String> = slots.iter().map(|s| host(&s.node)).collect();
        BuiltinAssignment {
            model: name.clone(),
            model_path,
            coordinator: format!("{}:{}", ips[0], slots[0].port),
            hosts: ips,
            endpoint_port: placed.endpoint_port,
            context: shape.service.as_ref().and_then(|svc| svc.context),
            batch: shape.service.as_ref().and_then(|svc| svc.batch),
            sources: Vec::new(),
            replicate: false,
            tensor_parallel: shape.service.is_some()
                && placed
                    .summary
                    .as_ref()
                    .is_some_and(|s| s.strategy == "tensor"),
            dataset: shape.trainer.as_ref().map(|t| t.dataset.clone()),
            dataset_source: None,
            finetune: shape
                .trainer
                .as_ref()
                .and_then(|t| serde_json::to_value(&t.finetune).ok()),
            adapter: None,
        }
    });
    let name = job.metadata.name.as_str();
    let world_size = slots.len() as u32;
    for (rank, slot) in slots.iter().enumerate() {
        let memory_bytes = placed
            .memory_bytes
            .get(rank)
            .copied()
            .unwrap_or(shape.memory_bytes);
        let layers = placed.layers.get(rank).copied().flatten();
        let mut env = shape.env.clone();
        if let Some(c) = &shape.checkpoints {
            // The nodelet points TB_RESUME_FROM at the newest entry found there, so a requeued
            // or restarted gang resumes.
            env.entry("TB_CHECKPOINT_DIR".into())
                .or_insert_with(|| c.dir.clone());
            if let Some(n) = c.every_steps {
                env.entry("TB_CHECKPOINT_EVERY_STEPS".into())
                    .or_insert_with(|| n.to_string());
            }
        }
        if let Some(l) = layers {
            // Programs that load only their own layers read these.
            env.insert("TB_LAYER_FIRST".into(), l.first.to_string());
            env.insert("TB_LAYER_COUNT".into(), l.count.to_string());
        }
        let rank = rank as u32;
        let spec = AllocationSpec {
            job: JobRef {
                kind: shape.kind.as_str().into(),
                name: name.into(),
                uid: job.metadata.uid.clone(),
            },
            node: slot.node.clone(),
            rank,
            world_size,
            epoch,
            desired: Desired::Run,
            memory_bytes,
            executor: shape.executor,
            command: shape.command.clone(),
            env,
            working_dir: shape.working_dir.clone(),
            mlx: builtin.is_none().then(|| mlx.clone()),
            layers,
            builtin: builtin.clone().map(|mut b| {
                if rank != 0 {
                    b.endpoint_port = None;
                }
                if let Some((sources, replicate)) = staging.get(rank as usize) {
                    b.sources = sources.clone();
                    b.replicate = *replicate;
                }
                b.adapter = adapter.as_ref().map(|a| a.for_node(&slot.node));
                b.dataset_source = shape
                    .trainer
                    .as_ref()
                    .and_then(|t| t.dataset_node.as_deref())
                    .filter(|holder| *holder != slot.node)
                    .and_then(|holder| probe_address(view, holder));
                b
            }),
            stop_grace_seconds: 10,
        };
        let labels = BTreeMap::from([
            (allocation::LABEL_JOB.to_string(), name.to_string()),
            (
                allocation::LABEL_JOB_KIND.to_string(),
                shape.kind.as_str().to_ascii_lowercase(),
            ),
            (allocation::LABEL_NODE.to_string(), slot.node.clone()),
        ]);
        let obj = Object {
            api_version: tb_api::API_VERSION.into(),
            kind: Kind::Allocation.as_str().into(),
            metadata: ObjectMeta {
                name: allocation::allocation_name(name, epoch, rank),
                namespace: job.metadata.namespace.clone(),
                labels,
                annotations: shape
                    .manifest_dir
                    .iter()
                    .map(|d| (allocation::ANNOTATION_MANIFEST_DIR.to_string(), d.clone()))
                    .collect(),
                ..Default::default()
            },
            spec: serde_json::to_value(&spec).unwrap_or_default(),
            status: serde_json::Value::Null,
        };
        plan.guards.push((obj.key(), 0));
        plan.writes.push(PlanWrite::Put(obj));
        if let Some(n) = view.nodes.get_mut(&slot.node) {
            n.free_bytes = n.free_bytes.saturating_sub(memory_bytes);
            n.used_ports.insert(slot.port);
            if rank == 0
                && let Some(p) = placed.endpoint_port
            {
                n.used_ports.insert(p);
            }
        }
    }
}

/// A service's adapter as placement found it: its directory, and the Node that holds it with
/// that node's probe server (None: every node reads the directory itself).
struct ResolvedAdapter {
    path: String,
    holder: Option<(String, String)>,
}

impl ResolvedAdapter {
    /// What a rank on `node` is told: read the directory there, or fetch it from the holder.
    fn for_node(&self, node: &str) -> AdapterAssignment {
        AdapterAssignment {
            path: self.path.clone(),
            source: self
                .holder
                .as_ref()
                .filter(|(holder, _)| holder != node)
                .map(|(_, probe)| probe.clone()),
        }
    }
}

/// Finds a service's adapter: `path` as given (held by `node`, when named), or the adapter the
/// named TrainingJob of the same namespace reported in `status.training.adapter` once it
/// succeeded. Refused (the service waits) while that is not there or its holder is not Ready.
fn resolve_adapter(
    job: &Object,
    adapter: &AdapterRef,
    view: &ClusterView,
) -> Result<ResolvedAdapter, Refusal> {
    let namespace = &job.metadata.namespace;
    let (path, node) = match (&adapter.path, &adapter.training_job) {
        (Some(path), _) => (path.clone(), adapter.node.clone()),
        (None, Some(name)) => {
            let key = (
                Kind::TrainingJob.as_str().to_string(),
                namespace.clone(),
                name.clone(),
            );
            let Some(tj) = view.jobs.get(&key) else {
                return Err(refuse(
                    Reason::AdapterNotReady,
                    format!(
                        "adapter.trainingJob: TrainingJob {name} does not exist in namespace {namespace}"
                    ),
                ));
            };
            let status = JobStatus::from_value(&tj.status);
            if status.phase != JobPhase::Succeeded {
                return Err(refuse(
                    Reason::AdapterNotReady,
                    format!(
                        "adapter.trainingJob: TrainingJob {name} is {:?}; its adapter is served once it has succeeded",
                        status.phase
                    ),
                ));
            }
            let written = &tj.status["training"]["adapter"];
            let (Some(path), Some(node)) = (written["path"].as_str(), written["node"].as_str())
            else {
                return Err(refuse(
                    Reason::AdapterNotReady,
                    format!(
                        "adapter.trainingJob: TrainingJob {name} reports no adapter (status.training.adapter); is it a built-in fine-tune?"
                    ),
                ));
            };
            (
                path.to_string(),
                (!node.is_empty()).then(|| node.to_string()),
            )
        }
        (None, None) => {
            return Err(refuse(
                Reason::InvalidSpec,
                "adapter: neither path nor trainingJob",
            ));
        }
    };
    let holder = match node {
        None => None,
        Some(node) => {
            let probe = probe_address(view, &node).ok_or_else(|| {
                refuse(
                    Reason::AdapterNotReady,
                    format!("the adapter is on Node {node}, which is not Ready to serve it"),
                )
            })?;
            Some((node, probe))
        }
    };
    Ok(ResolvedAdapter { path, holder })
}

/// The staging address (`host:port` of its probe server) of `node`, when it is Ready to serve.
fn probe_address(view: &ClusterView, node: &str) -> Option<String> {
    view.nodes
        .get(node)
        .filter(|n| n.ready && n.status.probe_port != 0)
        .map(|n| {
            let host = Some(n.status.host())
                .filter(|h| !h.is_empty())
                .unwrap_or("127.0.0.1");
            format!("{host}:{}", n.status.probe_port)
        })
}

/// Where a built-in service's ranks get the model file: the nodes that hold it (the Model's
/// `source.nodes`, which have it at its path, and Ready nodes that keep a whole staged copy,
/// `status.models`), and which ranks make another copy while fewer than two Ready nodes hold
/// one — so that losing a holder does not stop the service from being placed again.
struct ModelCopies<'a> {
    /// The Model's `source.nodes` (empty: every node reads the file at its path).
    listed: &'a [String],
    /// Ready nodes that hold the file, listed ones first, with their probe ports (which also
    /// serve staging).
    holders: Vec<(&'a str, u16)>,
    /// Ranks that fetch the whole file and keep it.
    replicate: BTreeSet<usize>,
}

impl<'a> ModelCopies<'a> {
    fn of(model: &'a ModelSpec, view: &'a ClusterView, slots: &[RankSlot]) -> ModelCopies<'a> {
        let listed = model.source.nodes.as_slice();
        let path = model.source.path.as_deref().unwrap_or_default();
        let copy_holders = view
            .nodes
            .values()
            .filter(|n| !path.is_empty() && n.status.models.iter().any(|m| m == path))
            .filter(|n| !listed.contains(&n.name));
        let holders: Vec<(&str, u16)> = listed
            .iter()
            .filter_map(|n| view.nodes.get(n))
            .chain(copy_holders)
            .filter(|n| n.ready && n.status.probe_port != 0)
            .map(|n| (n.name.as_str(), n.status.probe_port))
            .collect();
        let mut replicate = BTreeSet::new();
        if !listed.is_empty() {
            let mut wanted = 2usize.saturating_sub(holders.len());
            let mut seen = BTreeSet::new();
            for (rank, slot) in slots.iter().enumerate() {
                if wanted == 0 {
                    break;
                }
                let holds = holders.iter().any(|(h, _)| *h == slot.node);
                if !holds && seen.insert(slot.node.as_str()) {
                    replicate.insert(rank);
                    wanted -= 1;
                }
            }
        }
        ModelCopies {
            listed,
            holders,
            replicate,
        }
    }

    /// The staging sources of a rank on `node`: none on a listed holder (it reads the file at
    /// its path), else every Ready holder, `node` itself first when it keeps a copy (staging
    /// then reads it locally).
    fn sources_for(&self, node: &str, host: &dyn Fn(&str) -> String) -> Vec<String> {
        if self.listed.is_empty() || self.listed.iter().any(|n| n == node) {
            return Vec::new();
        }
        let mut holders = self.holders.clone();
        holders.sort_by_key(|(h, _)| *h != node);
        holders
            .iter()
            .map(|(h, port)| format!("{}:{port}", host(h)))
            .collect()
    }
}

/// Write the status if it changed; a plan with nothing to do is no plan.
fn finish(job: &Object, status: JobStatus, before: &JobStatus, mut plan: Plan) -> Option<Plan> {
    if &status != before {
        plan.deferrable = plan.writes.is_empty()
            && status.phase == JobPhase::Pending
            && before.phase == JobPhase::Pending
            && !before.reason.is_empty()
            && status.reason == before.reason;
        plan.writes.push(PlanWrite::Status {
            key: job.key(),
            status: status.to_value(),
        });
    }
    if plan.writes.is_empty() && plan.events.is_empty() {
        None
    } else {
        Some(plan)
    }
}
