//! Schedules: start TrainingJobs from a template on a cron schedule. Pure, like the rest of the
//! scheduler: from the Schedules, their jobs and the time, the plans that start, skip or replace
//! runs and prune history.
//!
//! A slot is handled by one plan that creates the job (guarded: the job must not exist — its
//! name is derived from the slot) and writes `lastScheduleTime` (guarded: the Schedule must not
//! have changed). Raft commits both or neither, so a leader change at the slot never runs it
//! twice and never loses it. After downtime only the most recent missed slot runs (if it is
//! still inside `startingDeadlineSeconds`); the older ones are recorded in one MissedSchedule
//! event.
//!
//! Slots are wall-clock minutes in the Schedule's time zone (UTC when none is given, so every
//! controller reads a schedule the same way). In a repeated hour (autumn DST change) a slot in
//! that hour fires on both passes; in a skipped hour it does not fire.

use std::collections::BTreeMap;
use std::sync::Arc;
use tb_api::reason::Reason;

use chrono::{DateTime, Datelike, TimeDelta, Timelike, Utc};
use tb_api::specs::{
    ANNOTATION_SCHEDULE_UID, ConcurrencyPolicy, LABEL_SCHEDULE, ScheduleSpec, ScheduleStatus,
    job_from_template, parse_spec,
};
use tb_api::status::{JobPhase, JobStatus};
use tb_api::{CronSchedule, Kind, Object, Timestamp};

use super::{Clock, event, stamp, time_of};
use crate::store::{Plan, PlanWrite, State};

/// How far back slots are looked for after downtime: older ones are neither run nor counted.
pub const LOOKBACK: TimeDelta = TimeDelta::days(7);

/// The most recent slot in `(after, upto]` and how many slots that range holds (both within
/// [`LOOKBACK`] of `upto`).
pub fn slots_between(
    cron: &CronSchedule,
    tz: chrono_tz::Tz,
    after: DateTime<Utc>,
    upto: DateTime<Utc>,
) -> (Option<DateTime<Utc>>, u32) {
    let start = after.max(upto - LOOKBACK);
    // The first whole minute after `start`.
    let mut t = start
        .with_second(0)
        .and_then(|t| t.with_nanosecond(0))
        .unwrap_or(start)
        + TimeDelta::minutes(1);
    let (mut latest, mut count) = (None, 0);
    while t <= upto {
        let local = t.with_timezone(&tz);
        if cron.matches(
            local.minute(),
            local.hour(),
            local.day(),
            local.month(),
            local.weekday().num_days_from_sunday(),
        ) {
            latest = Some(t);
            count += 1;
        }
        t += TimeDelta::minutes(1);
    }
    (latest, count)
}

/// How far ahead [`next_slot`] looks: four years and a day, so a schedule of 29 February is found.
pub const LOOKAHEAD: TimeDelta = TimeDelta::days(4 * 365 + 2);

/// The first slot strictly after `after` (within [`LOOKAHEAD`]): the next run a Schedule will
/// start, unless it is suspended or a run it forbids overlapping is still going.
pub fn next_slot(
    cron: &CronSchedule,
    tz: chrono_tz::Tz,
    after: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let mut t = after
        .with_second(0)
        .and_then(|t| t.with_nanosecond(0))
        .unwrap_or(after)
        + TimeDelta::minutes(1);
    let end = after + LOOKAHEAD;
    while t <= end {
        let local = t.with_timezone(&tz);
        if cron.matches(
            local.minute(),
            local.hour(),
            local.day(),
            local.month(),
            local.weekday().num_days_from_sunday(),
        ) {
            return Some(t);
        }
        t += TimeDelta::minutes(1);
    }
    None
}

/// The next run of a Schedule after `now`: `None` when it is suspended, its cron expression or
/// time zone is invalid, or no slot comes within [`LOOKAHEAD`].
pub fn next_run(spec: &ScheduleSpec, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    if spec.suspend {
        return None;
    }
    let cron = spec.cron().ok()?;
    let tz: chrono_tz::Tz = spec.time_zone.as_deref().unwrap_or("UTC").parse().ok()?;
    next_slot(&cron, tz, now)
}

/// The job a slot creates: deterministic, so a slot can be created once only.
pub fn job_name(schedule: &str, slot: DateTime<Utc>) -> String {
    format!("{schedule}-{}", slot.timestamp() / 60)
}

/// One job a Schedule started, with what the scheduler says of it.
struct Run {
    object: Arc<Object>,
    status: JobStatus,
}

impl Run {
    fn finished(&self) -> bool {
        self.status.phase.is_terminal()
    }
}

pub fn reconcile_schedules(state: &State, clock: &Clock) -> Vec<Plan> {
    let jobs = state.list(Kind::TrainingJob.as_str(), "");
    let mut plans = Vec::new();
    for schedule in state.list(Kind::Schedule.as_str(), "") {
        let spec = match parse_spec::<ScheduleSpec>(&schedule.spec) {
            Ok(spec) => spec,
            Err(e) => {
                plans.push(super::invalid_spec(&schedule, &e));
                continue;
            }
        };
        let runs: Vec<Run> = jobs
            .iter()
            .filter(|j| {
                j.metadata.namespace == schedule.metadata.namespace
                    && j.metadata.labels.get(LABEL_SCHEDULE) == Some(&schedule.metadata.name)
                    && j.metadata.annotations.get(ANNOTATION_SCHEDULE_UID)
                        == Some(&schedule.metadata.uid)
            })
            .map(|j| Run {
                object: j.clone(),
                status: JobStatus::from_value(&j.status),
            })
            .collect();
        if let Some(plan) = reconcile_schedule(&schedule, &spec, &runs, clock) {
            plans.push(plan);
        }
    }
    plans
}

fn reconcile_schedule(
    schedule: &Object,
    spec: &ScheduleSpec,
    runs: &[Run],
    clock: &Clock,
) -> Option<Plan> {
    let before = ScheduleStatus::from_value(&schedule.status);
    let mut status = before.clone();
    let mut plan = Plan::default();
    plan.guards
        .push((schedule.key(), schedule.metadata.resource_version));

    let mut active: Vec<&Run> = runs.iter().filter(|r| !r.finished()).collect();
    active.sort_by(|a, b| a.object.metadata.name.cmp(&b.object.metadata.name));
    status.active = active
        .iter()
        .map(|r| r.object.metadata.name.clone())
        .collect();
    if let Some(last_ok) = runs
        .iter()
        .filter(|r| r.status.phase == JobPhase::Succeeded)
        .map(|r| r.status.completion_time.clone())
        .max()
    {
        status.last_successful_time = last_ok;
    }
    prune_history(spec, runs, &mut plan);

    let due = due_slot(schedule, spec, &before, clock, &mut plan);
    if let Some(slot) = due {
        status.last_schedule_time = Some(Timestamp::from_datetime(slot));
        run_slot(schedule, spec, slot, &active, clock, &mut status, &mut plan);
    }

    if status != before {
        plan.writes.push(PlanWrite::Status {
            key: schedule.key(),
            status: status.to_value(),
        });
    }
    (!plan.writes.is_empty() || !plan.events.is_empty()).then_some(plan)
}

/// The slot to handle now, if any; events for slots missed before it, for a bad time zone.
fn due_slot(
    schedule: &Object,
    spec: &ScheduleSpec,
    status: &ScheduleStatus,
    clock: &Clock,
    plan: &mut Plan,
) -> Option<DateTime<Utc>> {
    let cron = spec.cron().ok()?;
    let tz: chrono_tz::Tz = match spec.time_zone.as_deref().unwrap_or("UTC").parse() {
        Ok(tz) => tz,
        Err(_) => {
            plan.events.push(event(
                schedule,
                true,
                Reason::UnknownTimeZone,
                &format!(
                    "time zone {:?} is not in the controller's zone database; no runs start",
                    spec.time_zone.as_deref().unwrap_or("")
                ),
            ));
            return None;
        }
    };
    let after = time_of(&status.last_schedule_time)
        .or_else(|| time_of(&schedule.metadata.creation_timestamp))
        .unwrap_or(clock.now);
    let (latest, count) = slots_between(&cron, tz, after, clock.now);
    let slot = latest?;
    if count > 1 {
        plan.events.push(event(
            schedule,
            true,
            Reason::MissedSchedule,
            &format!(
                "{} run(s) missed between {} and {} (only the latest is considered)",
                count - 1,
                stamp(after),
                stamp(slot)
            ),
        ));
    }
    Some(slot)
}

fn run_slot(
    schedule: &Object,
    spec: &ScheduleSpec,
    slot: DateTime<Utc>,
    active: &[&Run],
    clock: &Clock,
    status: &mut ScheduleStatus,
    plan: &mut Plan,
) {
    let when = stamp(slot);
    if spec.suspend {
        return;
    }
    if let Some(deadline) = spec.starting_deadline_seconds
        && clock.now - slot > TimeDelta::seconds(deadline as i64)
    {
        plan.events.push(event(
            schedule,
            true,
            Reason::MissedSchedule,
            &format!(
                "the run due at {when} is past startingDeadlineSeconds ({deadline}s); skipped"
            ),
        ));
        return;
    }
    match spec.concurrency_policy {
        ConcurrencyPolicy::Forbid if !active.is_empty() => {
            plan.events.push(event(
                schedule,
                false,
                Reason::JobSkipped,
                &format!(
                    "the run due at {when} is skipped: {} still running (concurrencyPolicy Forbid)",
                    active[0].object.metadata.name
                ),
            ));
            return;
        }
        ConcurrencyPolicy::Replace => {
            for run in active {
                plan.guards
                    .push((run.object.key(), run.object.metadata.resource_version));
                plan.writes.push(PlanWrite::Delete {
                    key: run.object.key(),
                });
                plan.events.push(event(
                    schedule,
                    false,
                    Reason::JobReplaced,
                    &format!(
                        "{} replaced by the run due at {when} (concurrencyPolicy Replace)",
                        run.object.metadata.name
                    ),
                ));
            }
            status.active.clear();
        }
        _ => {}
    }
    let name = job_name(&schedule.metadata.name, slot);
    let job = job_from_template(schedule, spec, &name, &when);
    plan.guards.push((job.key(), 0));
    plan.writes.push(PlanWrite::Put(job));
    plan.events.push(event(
        schedule,
        false,
        Reason::SuccessfulCreate,
        &format!("created TrainingJob {name} for {when}"),
    ));
    status.active.push(name);
    status.active.sort();
}

/// Finished runs beyond the history limits go, oldest first.
fn prune_history(spec: &ScheduleSpec, runs: &[Run], plan: &mut Plan) {
    let mut by_phase: BTreeMap<bool, Vec<&Run>> = BTreeMap::new();
    for r in runs.iter().filter(|r| r.finished()) {
        by_phase
            .entry(r.status.phase == JobPhase::Succeeded)
            .or_default()
            .push(r);
    }
    for (succeeded, mut list) in by_phase {
        let keep = if succeeded {
            spec.successful_history_limit()
        } else {
            spec.failed_history_limit()
        } as usize;
        list.sort_by(|a, b| {
            a.object
                .metadata
                .creation_timestamp
                .cmp(&b.object.metadata.creation_timestamp)
                .then_with(|| a.object.metadata.name.cmp(&b.object.metadata.name))
        });
        let excess = list.len().saturating_sub(keep);
        for r in &list[..excess] {
            plan.guards
                .push((r.object.key(), r.object.metadata.resource_version));
            plan.writes.push(PlanWrite::Delete {
                key: r.object.key(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s)
            .map(|t| t.with_timezone(&Utc))
            .expect("time")
    }

    #[test]
    fn slots_are_wall_clock_minutes_in_the_zone() {
        let daily_2am = CronSchedule::parse("0 2 * * *").expect("cron");
        // 02:00 in Paris in winter is 01:00 UTC.
        let (latest, count) = slots_between(
            &daily_2am,
            chrono_tz::Europe::Paris,
            at("2026-01-10T00:00:00Z"),
            at("2026-01-12T12:00:00Z"),
        );
        assert_eq!(latest, Some(at("2026-01-12T01:00:00Z")));
        assert_eq!(count, 3);
        let (latest, count) = slots_between(
            &daily_2am,
            chrono_tz::UTC,
            at("2026-01-12T02:00:00Z"),
            at("2026-01-12T02:30:00Z"),
        );
        assert_eq!((latest, count), (None, 0), "the bound is exclusive below");
    }

    #[test]
    fn next_slot_is_the_first_wall_clock_match_after() {
        let daily_2am = CronSchedule::parse("0 2 * * *").expect("cron");
        // Winter: 02:00 Paris is 01:00 UTC; summer: 00:00 UTC.
        assert_eq!(
            next_slot(
                &daily_2am,
                chrono_tz::Europe::Paris,
                at("2026-12-03T14:25:00Z")
            ),
            Some(at("2026-12-04T01:00:00Z"))
        );
        assert_eq!(
            next_slot(
                &daily_2am,
                chrono_tz::Europe::Paris,
                at("2026-07-01T00:00:00Z")
            ),
            Some(at("2026-07-02T00:00:00Z")),
            "strictly after"
        );
        let leap_day = CronSchedule::parse("0 0 29 2 *").expect("cron");
        assert_eq!(
            next_slot(&leap_day, chrono_tz::UTC, at("2026-03-01T00:00:00Z")),
            Some(at("2028-02-29T00:00:00Z"))
        );
    }

    #[test]
    fn long_downtime_is_bounded() {
        let every_minute = CronSchedule::parse("* * * * *").expect("cron");
        let (_, count) = slots_between(
            &every_minute,
            chrono_tz::UTC,
            at("2025-01-01T00:00:00Z"),
            at("2026-01-01T00:00:00Z"),
        );
        assert_eq!(count as i64, LOOKBACK.num_minutes());
    }
}
