//! What `GET /targets` shows: every job's targets with their health, the label sets that were
//! dropped and why, and each discovery source's last refresh.
//!
//! The pools write it when their target sets change, each scrape loop writes its own target's
//! health after every scrape, and the HTTP handler reads a snapshot. The locks are held only to
//! copy or replace a few fields, never across an `.await`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::target::{Dropped, Target};
use crate::relabel::LabelSet;

/// A target's health, as of its last scrape.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    /// Not scraped yet.
    #[default]
    Unknown,
    /// The last scrape succeeded.
    Up,
    /// The last scrape failed.
    Down,
}

impl Health {
    /// `unknown`, `up` or `down`, the `health` label of `smolder_agent_scrape_targets`.
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Unknown => "unknown",
            Health::Up => "up",
            Health::Down => "down",
        }
    }
}

/// The outcome of a target's last scrape.
#[derive(Clone, Debug, Default)]
pub struct LastScrape {
    /// Up, down or unknown.
    pub health: Health,
    /// When the last scrape started.
    pub at: Option<SystemTime>,
    /// How long it took.
    pub duration: Option<Duration>,
    /// Its error, in words; empty when it succeeded.
    pub error: String,
}

/// One scrape loop's view of its target's health; the loop writes, `/targets` reads.
pub type SharedScrape = Arc<Mutex<LastScrape>>;

/// One discovery source's last refresh.
#[derive(Clone, Debug, Default)]
pub struct SourceStatus {
    /// `static`, `file:<patterns>` or `http:<url>`.
    pub source: String,
    /// When it last reported.
    pub at: Option<SystemTime>,
    /// The groups it holds.
    pub groups: usize,
    /// Why documents were refused, if any were.
    pub errors: Vec<String>,
}

/// A job's status.
#[derive(Clone, Debug, Default)]
struct JobStatus {
    active: Vec<(Target, SharedScrape)>,
    dropped: Vec<Dropped>,
    sources: Vec<SourceStatus>,
}

/// Every job's status; cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Status {
    jobs: Arc<Mutex<BTreeMap<String, JobStatus>>>,
}

impl Status {
    fn with_job<R>(&self, job: &str, f: impl FnOnce(&mut JobStatus) -> R) -> R {
        // Taken to swap a job's lists; a panic elsewhere cannot leave them half-written.
        let mut jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        f(jobs.entry(job.to_owned()).or_default())
    }

    /// Records a job's current targets and dropped label sets.
    pub fn set_targets(
        &self,
        job: &str,
        active: Vec<(Target, SharedScrape)>,
        dropped: Vec<Dropped>,
    ) {
        self.with_job(job, |status| {
            status.active = active;
            status.dropped = dropped;
        });
    }

    /// Records a job's discovery sources.
    pub fn set_sources(&self, job: &str, sources: Vec<SourceStatus>) {
        self.with_job(job, |status| status.sources = sources);
    }

    /// A snapshot for `/targets`.
    pub fn snapshot(&self) -> TargetsDocument {
        let jobs = self
            .jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut doc = TargetsDocument::default();
        for (job, status) in jobs {
            for (target, shared) in &status.active {
                let last = shared
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
                doc.active_targets.push(ActiveTarget {
                    job: job.clone(),
                    profile: target.profile.clone(),
                    app: target.app.clone(),
                    scrape_url: target.url.to_string(),
                    labels: target
                        .labels
                        .iter()
                        .map(|(n, v)| (n.to_owned(), v.to_owned()))
                        .collect(),
                    discovered_labels: target.discovered.clone(),
                    scrape_interval: super::go_duration::format(target.interval),
                    scrape_timeout: super::go_duration::format(target.timeout),
                    health: last.health,
                    last_scrape: last.at.map(rfc3339),
                    last_scrape_duration: last.duration.map(|d| d.as_secs_f64()),
                    last_error: last.error,
                });
            }
            for dropped in &status.dropped {
                doc.dropped_targets.push(DroppedTarget {
                    job: job.clone(),
                    discovered_labels: dropped.discovered.clone(),
                    reason: dropped.reason.clone(),
                });
            }
            for source in &status.sources {
                doc.discovery.push(Discovery {
                    job: job.clone(),
                    source: source.source.clone(),
                    last_refresh: source.at.map(rfc3339),
                    groups: source.groups,
                    errors: source.errors.clone(),
                });
            }
        }
        doc
    }
}

fn rfc3339(t: SystemTime) -> String {
    time::OffsetDateTime::from(t)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// The body of `GET /targets`.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TargetsDocument {
    /// Targets being scraped, one per (target, profile).
    pub active_targets: Vec<ActiveTarget>,
    /// Discovered label sets that are not scraped.
    pub dropped_targets: Vec<DroppedTarget>,
    /// Each discovery source's last refresh.
    pub discovery: Vec<Discovery>,
}

/// One scraped (target, profile).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ActiveTarget {
    /// The job.
    pub job: String,
    /// The profile name.
    pub profile: String,
    /// The application name.
    pub app: String,
    /// The URL scraped.
    pub scrape_url: String,
    /// The series labels.
    pub labels: BTreeMap<String, String>,
    /// The labels before relabelling.
    pub discovered_labels: LabelSet,
    /// The interval.
    pub scrape_interval: String,
    /// The timeout.
    pub scrape_timeout: String,
    /// `up`, `down` or `unknown`.
    pub health: Health,
    /// When the last scrape started (RFC 3339).
    pub last_scrape: Option<String>,
    /// How long it took, in seconds.
    pub last_scrape_duration: Option<f64>,
    /// Its error; empty when it succeeded.
    pub last_error: String,
}

/// A discovered label set that is not scraped.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DroppedTarget {
    /// The job.
    pub job: String,
    /// The labels as discovered.
    pub discovered_labels: LabelSet,
    /// Why it is not scraped.
    pub reason: String,
}

/// A discovery source's last refresh.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Discovery {
    /// The job.
    pub job: String,
    /// `static`, `file:<patterns>` or `http:<url>`.
    pub source: String,
    /// When it last reported (RFC 3339).
    pub last_refresh: Option<String>,
    /// The target groups it holds.
    pub groups: usize,
    /// Documents refused at the last refresh, each with why; their previous groups are kept.
    pub errors: Vec<String>,
}
