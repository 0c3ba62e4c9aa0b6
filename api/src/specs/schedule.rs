//! Schedule: start TrainingJobs from a template on a cron schedule.

use std::collections::BTreeMap;

use crate::timestamp::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::CheckResult;
use super::training::TrainingJobSpec;
use crate::cron::CronSchedule;
use crate::validate::{ValidationError, validate_annotations, validate_labels};

/// What to do when a run is due while the previous one is still going.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ConcurrencyPolicy {
    /// Start the new run alongside.
    #[default]
    Allow,
    /// Skip the new run.
    Forbid,
    /// Stop the old run and start the new one.
    Replace,
}

/// Labels and annotations copied onto every TrainingJob the Schedule creates.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct TemplateMetadata {
    /// Labels for each TrainingJob created.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations for each TrainingJob created.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct JobTemplate {
    /// Labels and annotations for the jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMetadata>,
    /// The spec of each TrainingJob created.
    pub spec: TrainingJobSpec,
}

/// History kept when `successfulJobsHistoryLimit` / `failedJobsHistoryLimit` are left out.
pub const DEFAULT_SUCCESSFUL_HISTORY: u32 = 3;
pub const DEFAULT_FAILED_HISTORY: u32 = 1;

/// Creates TrainingJobs from a template on a cron schedule.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = crate::explain::declaration_order::<Self>)]
pub struct ScheduleSpec {
    /// Cron: minute hour day-of-month month day-of-week ("0 2 * * *"), or @hourly, @daily, @weekly,
    /// @monthly, @yearly.
    pub schedule: String,
    /// IANA time zone the schedule is read in, e.g. Europe/Paris (the controller's when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
    /// When a run is due and the last is still going: Allow, Forbid (skip) or Replace.
    #[serde(default)]
    pub concurrency_policy: ConcurrencyPolicy,
    /// Skip a run that could not start within this many seconds of its time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starting_deadline_seconds: Option<u64>,
    /// Create no new runs while true.
    #[serde(default)]
    pub suspend: bool,
    /// Finished jobs to keep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = DEFAULT_SUCCESSFUL_HISTORY))]
    pub successful_jobs_history_limit: Option<u32>,
    /// Failed jobs to keep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = DEFAULT_FAILED_HISTORY))]
    pub failed_jobs_history_limit: Option<u32>,
    /// The TrainingJob to create at each run.
    pub job_template: JobTemplate,
}

impl ScheduleSpec {
    /// The parsed cron expression (always valid in a stored object).
    pub fn cron(&self) -> Result<CronSchedule, String> {
        CronSchedule::parse(&self.schedule)
    }

    pub fn successful_history_limit(&self) -> u32 {
        self.successful_jobs_history_limit
            .unwrap_or(DEFAULT_SUCCESSFUL_HISTORY)
    }

    pub fn failed_history_limit(&self) -> u32 {
        self.failed_jobs_history_limit
            .unwrap_or(DEFAULT_FAILED_HISTORY)
    }

    pub(crate) fn check(&self) -> CheckResult {
        self.cron()
            .map_err(|m| ValidationError::new("schedule", m))?;
        if let Some(tz) = &self.time_zone {
            validate_time_zone(tz).map_err(|m| ValidationError::new("timeZone", m))?;
        }
        if let Some(meta) = &self.job_template.metadata {
            validate_labels("jobTemplate.metadata.labels", &meta.labels)?;
            validate_annotations("jobTemplate.metadata.annotations", &meta.annotations)?;
        }
        self.job_template
            .spec
            .check()
            .map_err(|e| e.under("jobTemplate.spec"))
    }
}

/// What the schedule controller records: committed through Raft together with the job it
/// creates, so that a new leader never runs a slot twice.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleStatus {
    /// The last slot handled (run, skipped or missed), RFC 3339.
    #[serde(
        default,
        with = "crate::timestamp::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub last_schedule_time: Option<Timestamp>,
    #[serde(
        default,
        with = "crate::timestamp::optional",
        skip_serializing_if = "Option::is_none"
    )]
    pub last_successful_time: Option<Timestamp>,
    /// The TrainingJobs it started that have not finished.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub active: Vec<String>,
}

impl ScheduleStatus {
    pub fn from_value(v: &serde_json::Value) -> ScheduleStatus {
        Self::deserialize(v).unwrap_or_default()
    }

    pub fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// The label every TrainingJob a Schedule creates carries: the Schedule's name.
pub const LABEL_SCHEDULE: &str = "tb/schedule";

/// The annotation naming the uid of the Schedule that created a job (a Schedule deleted and
/// created again under the same name does not adopt its predecessor's jobs).
pub const ANNOTATION_SCHEDULE_UID: &str = "tb/schedule-uid";
/// The annotation with the slot a job was created for (RFC 3339), or `manual`.
pub const ANNOTATION_SCHEDULED_TIME: &str = "tb/scheduled-time";

/// The TrainingJob a Schedule starts: its template, labelled with the Schedule's name and
/// annotated with its uid and the slot, in the Schedule's namespace.
pub fn job_from_template(
    schedule: &crate::Object,
    spec: &ScheduleSpec,
    name: &str,
    scheduled_time: &str,
) -> crate::Object {
    let meta = spec.job_template.metadata.clone().unwrap_or_default();
    let mut labels = meta.labels;
    labels.insert(LABEL_SCHEDULE.into(), schedule.metadata.name.clone());
    let mut annotations = meta.annotations;
    annotations.insert(
        ANNOTATION_SCHEDULE_UID.into(),
        schedule.metadata.uid.clone(),
    );
    annotations.insert(ANNOTATION_SCHEDULED_TIME.into(), scheduled_time.into());
    crate::Object {
        api_version: crate::API_VERSION.into(),
        kind: crate::Kind::TrainingJob.as_str().into(),
        metadata: crate::ObjectMeta {
            name: name.into(),
            namespace: schedule.metadata.namespace.clone(),
            labels,
            annotations,
            ..Default::default()
        },
        spec: serde_json::to_value(&spec.job_template.spec).unwrap_or_default(),
        status: serde_json::Value::Null,
    }
}

/// An IANA zone name that the zone database knows (`UTC`, `Europe/Paris`,
/// `America/Argentina/Buenos_Aires`, `Etc/GMT+5`), spelled exactly as the database spells it:
/// the scheduler reads the zone from the same database, so a Schedule that passes here always
/// has a zone to run in.
pub fn validate_time_zone(tz: &str) -> Result<(), String> {
    if tz.parse::<chrono_tz::Tz>().is_ok() {
        return Ok(());
    }
    let hint = chrono_tz::TZ_VARIANTS
        .iter()
        .find(|z| z.name().eq_ignore_ascii_case(tz))
        .map(|z| format!(" (did you mean {}?)", z.name()))
        .unwrap_or_default();
    Err(format!(
        "{} is not a time zone in the IANA database{hint}; expected a name like UTC, Europe/Paris \
         or America/New_York",
        crate::bounds::Quoted(tz)
    ))
}
