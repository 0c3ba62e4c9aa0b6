//! Schedule: start TrainingJobs from a template on a cron schedule.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::common::CheckResult;
use super::training::TrainingJobSpec;
use crate::cron::CronSchedule;
use crate::validate::{ValidationError, validate_annotations, validate_labels};

/// What to do when a run is due while the previous one is still going.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TemplateMetadata {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JobTemplate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMetadata>,
    pub spec: TrainingJobSpec,
}

/// History kept when `successfulJobsHistoryLimit` / `failedJobsHistoryLimit` are left out.
pub const DEFAULT_SUCCESSFUL_HISTORY: u32 = 3;
pub const DEFAULT_FAILED_HISTORY: u32 = 1;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScheduleSpec {
    /// Five-field cron (`0 2 * * *`) or a macro (`@daily`).
    pub schedule: String,
    /// IANA time zone the schedule is read in (`Europe/Paris`); the controller's when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
    #[serde(default)]
    pub concurrency_policy: ConcurrencyPolicy,
    /// A run that could not start within this many seconds of its time is skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starting_deadline_seconds: Option<u64>,
    #[serde(default)]
    pub suspend: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub successful_jobs_history_limit: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_jobs_history_limit: Option<u32>,
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

/// The shape of an IANA zone name (`UTC`, `Europe/Paris`, `America/Argentina/Buenos_Aires`,
/// `Etc/GMT+5`). Whether the zone exists is for the controller's zone database to say.
pub fn validate_time_zone(tz: &str) -> Result<(), String> {
    let part_ok = |p: &str| {
        p.starts_with(|c: char| c.is_ascii_alphabetic())
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '+'))
    };
    let parts: Vec<&str> = tz.split('/').collect();
    if !tz.is_empty() && tz.len() <= 64 && parts.len() <= 3 && parts.iter().all(|p| part_ok(p)) {
        Ok(())
    } else {
        Err(format!(
            "{tz:?} is not a time zone name; expected an IANA name like UTC, Europe/Paris or America/New_York"
        ))
    }
}
