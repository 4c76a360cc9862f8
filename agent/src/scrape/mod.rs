//! Pull mode: scraping pprof from HTTP targets, configured as Pyroscope's `scrape-configs`.
//!
//! Input: the agent config's [`ScrapeConfig`]s. Output: [`Profile`](smolder_common::Profile)s
//! submitted to the window loop through a [`Submitter`], like every source; and a [`Status`]
//! that `GET /targets` renders. Caller: [`crate::app`], which [`start`]s the scraper and
//! [`stop`](Scraper::stop)s it before the window loop.
//!
//! A job's configuration: [`config`] (`ScrapeConfig`: targets, schedule, limits), its
//! [`profiles`] (built-in, overridden, custom), the [`http_client`] keys it shares with HTTP
//! discovery, and [`go_duration`] (durations as Go writes them).
//!
//! Per job, in data-path order:
//!
//! - [`discovery`]: static groups, files (reread on change) and HTTP endpoints (refreshed on an
//!   interval) yield target groups; a bad document is reported and the previous groups kept.
//! - [`target`]: labels are set, relabelled and validated; each enabled profile of each target
//!   becomes a [`Target`](target::Target).
//! - [`pool`]: one task per job keeps one scrape loop per target, starting and aborting loops
//!   as the target set changes.
//! - [`scraper`]: each loop waits for its target's tick ([`schedule`]), fetches with a timeout
//!   and a body cap ([`fetch`]), decodes and subtracts the previous scrape of cumulative types
//!   ([`convert`], [`delta`]), and submits.
//! - [`status`]: every target's health, last scrape and last error, for `/targets`.
//!
//! Tasks owned: one pool per job (span `scrape_job`), one per file or HTTP discovery source
//! (`scrape_discovery`), one per target and profile (`scrape_target`); each job's pool is the
//! health loop `scrape:<job>`. Logs use the tracing
//! target `smolder_agent::scrape`. Metrics: `smolder_agent_scrape_*` ([`ScrapeMetrics`]).

pub mod config;
pub mod convert;
pub mod delta;
pub mod discovery;
pub mod fetch;
pub mod go_duration;
pub mod http_client;
mod metrics;
pub mod pool;
pub mod profiles;
pub mod schedule;
pub mod scraper;
pub mod status;
pub mod target;

use std::collections::HashSet;
use std::time::Duration;

use smolder_daemon::Health;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use config::ScrapeConfig;
pub use metrics::ScrapeMetrics;
pub use status::Status;

use crate::relabel::RelabelError;
use crate::window::Submitter;

/// How often a job's loop beats while idle (its targets' loops report in `/targets`).
const PERIOD: Duration = Duration::from_secs(10);

/// Why `scrape-configs` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeConfigError {
    /// A key has an unusable value.
    #[error("scrape-configs job {job:?}: {key}: {reason}")]
    Invalid {
        /// The job.
        job: String,
        /// The key, as written in the config.
        key: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A profile under `profiles` is unusable.
    #[error("scrape-configs job {job:?}: profile {profile:?}: {reason}")]
    Profile {
        /// The job.
        job: String,
        /// The profile's name.
        profile: String,
        /// What is wrong.
        reason: String,
    },
    /// A `relabel-configs` rule is unusable.
    #[error("scrape-configs job {job:?}: relabel-configs")]
    Relabel {
        /// The job.
        job: String,
        /// The relabeller's error.
        source: RelabelError,
    },
    /// Two jobs have the same `job-name`.
    #[error("scrape-configs job {job:?}: job-name is used twice")]
    DuplicateJob {
        /// The job.
        job: String,
    },
    /// The job's HTTP client cannot be built (`tls-config`).
    #[error("scrape-configs job {job:?}: http client")]
    Client {
        /// The job.
        job: String,
        /// Why.
        source: fetch::ClientError,
    },
}

/// Checks every job; see [`ScrapeConfig::validate`].
///
/// # Errors
///
/// The first [`ScrapeConfigError`] found.
pub fn validate(configs: &[ScrapeConfig]) -> Result<(), ScrapeConfigError> {
    let mut names = HashSet::new();
    for config in configs {
        config.validate()?;
        if !names.insert(config.job_name.as_str()) {
            return Err(ScrapeConfigError::DuplicateJob {
                job: config.job_name.clone(),
            });
        }
    }
    Ok(())
}

/// Checks the TLS files every job and every HTTP discovery names: each is read and parsed as
/// it will be at start (`check-config`). A discovery whose files are unusable does not stop
/// the agent at start (it reports the error as the discovery's), but it is a config mistake.
///
/// # Errors
///
/// The first job whose `tls-config` files cannot be read or parsed, naming the job and file.
pub fn check_files(configs: &[ScrapeConfig]) -> Result<(), ScrapeConfigError> {
    for config in configs {
        let settings = std::iter::once(config.client_settings())
            .chain(config.http_sd_configs.iter().map(|sd| sd.client_settings()));
        for settings in settings {
            fetch::Fetcher::new(&settings).map_err(|source| ScrapeConfigError::Client {
                job: config.job_name.clone(),
                source,
            })?;
        }
    }
    Ok(())
}

/// The running scraper.
pub struct Scraper {
    status: Status,
    stop: watch::Sender<bool>,
    jobs: Vec<JoinHandle<()>>,
}

/// Starts one pool per job on the current runtime, each a loop of `health` named
/// `scrape:<job>`.
///
/// # Errors
///
/// A [`ScrapeConfigError`] when a job is invalid or its TLS files are unusable.
pub fn start(
    configs: &[ScrapeConfig],
    submitter: &Submitter,
    metrics: &ScrapeMetrics,
    health: &Health,
) -> Result<Scraper, ScrapeConfigError> {
    validate(configs)?;
    let status = Status::default();
    let mut jobs = Vec::new();
    for config in configs {
        let builder = target::Builder::new(config)?;
        let fetcher = fetch::Fetcher::new(&config.client_settings()).map_err(|source| {
            ScrapeConfigError::Client {
                job: config.job_name.clone(),
                source,
            }
        })?;
        jobs.push(pool::Job {
            config: config.clone(),
            builder,
            fetcher,
            submitter: submitter.clone(),
            metrics: metrics.clone(),
            status: status.clone(),
        });
    }
    let (stop, stopped) = watch::channel(false);
    let jobs = jobs
        .into_iter()
        .map(|job| {
            let span = tracing::info_span!("scrape_job", job = %job.config.job_name);
            let heartbeat = health.register(format!("scrape:{}", job.config.job_name), PERIOD);
            tokio::spawn(tracing::Instrument::instrument(
                pool::run(job, stopped.clone(), heartbeat),
                span,
            ))
        })
        .collect();
    Ok(Scraper { status, stop, jobs })
}

impl Scraper {
    /// What `/targets` shows.
    pub fn status(&self) -> Status {
        self.status.clone()
    }

    /// Stops every job, discovery task and scrape loop, and waits until they have dropped
    /// their submitters.
    ///
    /// # Cancel safety
    ///
    /// Not cancel-safe: cancelled, some loops may still be running.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for job in self.jobs {
            let _ = job.await;
        }
    }
}
