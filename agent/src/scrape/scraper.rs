//! One target's scrape loop: wait for the target's tick, fetch, convert, submit, record.
//!
//! Input: a [`Target`]. Output: [`Profile`](smolder_common::Profile)s submitted to the
//! window loop, and the target's [`LastScrape`]. Owned by the job's pool, which aborts it when
//! the target goes away; it owns the target's [`Deltas`].
//!
//! A scrape that fails leaves the delta state as it was: the next successful scrape subtracts
//! the last good one and its profiles span the whole gap. A duration profile, which returns just
//! after the next tick, still takes that tick; a scrape that outlasts the interval by more than
//! half of it (the timeout may be longer, as in Pyroscope) skips the ticks it missed
//! ([`schedule::following_tick`]).

use std::time::{Duration, Instant, SystemTime};

use smolder_common::pprof::Limits;
use tracing::{debug, warn};

use super::ScrapeMetrics;
use super::convert::{self, ConvertError, Scraped, Span};
use super::delta::Deltas;
use super::discovery::error_chain;
use super::fetch::{FetchError, Fetcher};
use super::schedule;
use super::status::{Health, LastScrape, SharedScrape};
use super::target::Target;
use crate::window::Submitter;

/// What Go's `net/http/pprof` and most pprof servers answer with.
const ACCEPT: &str = "application/octet-stream, application/x-protobuf, */*;q=0.1";

/// Why one scrape failed.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// The request or the body failed.
    #[error(transparent)]
    Fetch(#[from] FetchError),
    /// The body is not a usable profile.
    #[error(transparent)]
    Convert(#[from] ConvertError),
    /// Converting panicked (a bug); the target's delta state was reset.
    #[error("converting the profile panicked")]
    Panicked,
}

impl ScrapeError {
    fn reason(&self) -> &'static str {
        match self {
            ScrapeError::Fetch(err) => err.reason(),
            ScrapeError::Convert(_) => "decode",
            ScrapeError::Panicked => "panic",
        }
    }
}

/// Everything one loop needs.
pub struct ScrapeLoop {
    /// The target.
    pub target: Target,
    /// The job's HTTP client.
    pub fetcher: Fetcher,
    /// Where profiles go.
    pub submitter: Submitter,
    /// The job's metrics.
    pub metrics: ScrapeMetrics,
    /// Where the loop records each scrape's outcome.
    pub shared: SharedScrape,
    /// Decoding limits (`decompressed-size-limit`).
    pub limits: Limits,
}

/// Keeps `smolder_agent_scrape_targets{job,health}` counting this target under its current
/// health, and stops counting it when the loop ends or is aborted.
struct HealthGauge {
    metrics: ScrapeMetrics,
    job: String,
    health: Health,
}

impl HealthGauge {
    fn new(metrics: ScrapeMetrics, job: String) -> Self {
        metrics
            .targets
            .with_label_values(&[&job, Health::Unknown.as_str()])
            .inc();
        HealthGauge {
            metrics,
            job,
            health: Health::Unknown,
        }
    }

    fn set(&mut self, health: Health) {
        if health != self.health {
            let gauge = |h: Health| {
                self.metrics
                    .targets
                    .with_label_values(&[&self.job, h.as_str()])
            };
            gauge(self.health).dec();
            gauge(health).inc();
            self.health = health;
        }
    }
}

impl Drop for HealthGauge {
    fn drop(&mut self) {
        self.metrics
            .targets
            .with_label_values(&[&self.job, self.health.as_str()])
            .dec();
    }
}

impl ScrapeLoop {
    /// Scrapes the target at its ticks until aborted or the agent stops.
    pub async fn run(self) {
        let target = &self.target;
        let labels = [target.job.as_str(), target.profile.as_str()];
        let phase = schedule::phase(&target.key(), target.interval);
        let mut gauge = HealthGauge::new(self.metrics.clone(), target.job.clone());
        let mut deltas = Deltas::new();
        let mut last_ok: Option<SystemTime> = None;
        let mut previous: Option<SystemTime> = None;
        loop {
            let tick =
                schedule::following_tick(previous, SystemTime::now(), target.interval, phase);
            previous = Some(tick);
            let wait = tick.duration_since(SystemTime::now()).unwrap_or_default();
            tokio::time::sleep(wait).await;
            let started = Instant::now();
            self.metrics.scrapes.with_label_values(&labels).inc();
            let delta_from = last_ok.unwrap_or_else(|| tick - target.interval);
            let span = match target.seconds {
                Some(seconds) => Span {
                    from: tick,
                    until: tick + Duration::from_secs(seconds),
                    delta_from: tick,
                },
                None => Span {
                    from: tick - target.interval,
                    until: tick,
                    delta_from,
                },
            };
            let (result, state) = self.scrape_once(span, deltas).await;
            deltas = state;
            let elapsed = started.elapsed();
            let mut last = LastScrape {
                health: Health::Up,
                at: Some(tick),
                duration: Some(elapsed),
                error: String::new(),
            };
            match result {
                Ok(scraped) => {
                    last_ok = Some(tick);
                    self.metrics
                        .samples
                        .with_label_values(&labels)
                        .inc_by(scraped.samples as u64);
                    self.metrics
                        .counter_resets
                        .with_label_values(&labels)
                        .inc_by(scraped.resets);
                    // Never waits on the windows: a profile they have no room for is dropped and
                    // counted there.
                    let mut count = 0;
                    for profile in scraped.profiles {
                        match self.submitter.try_submit(profile) {
                            Ok(queued) => count += usize::from(queued),
                            Err(_) => return,
                        }
                    }
                    self.metrics
                        .profiles_submitted
                        .with_label_values(&labels)
                        .inc_by(count as u64);
                    debug!(target: "smolder_agent::scrape", url = %target.url,
                        profiles = count, samples = scraped.samples, "scraped");
                }
                Err(err) => {
                    let message = error_chain(&err);
                    self.metrics.failure(labels[0], labels[1], err.reason());
                    warn!(target: "smolder_agent::scrape", job = %target.job,
                        profile = %target.profile, url = %target.url, error = %message,
                        "scrape failed");
                    last.health = Health::Down;
                    last.error = message;
                }
            }
            self.metrics
                .duration
                .with_label_values(&labels)
                .observe(started.elapsed().as_secs_f64());
            gauge.set(last.health);
            *self
                .shared
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = last;
        }
    }

    /// Fetches and converts once; hands the delta state back whatever happens.
    async fn scrape_once(
        &self,
        span: Span,
        mut deltas: Deltas,
    ) -> (Result<Scraped, ScrapeError>, Deltas) {
        let target = &self.target;
        let body = match self.fetcher.get(&target.url, ACCEPT, target.timeout).await {
            Ok(body) => body,
            Err(err) => return (Err(err.into()), deltas),
        };
        self.metrics
            .body_bytes
            .with_label_values(&[&target.job, &target.profile])
            .inc_by(body.bytes.len() as u64);
        let converting = target.clone();
        let limits = self.limits;
        // Decoding a large profile takes milliseconds of CPU: keep it off the async workers.
        let joined = tokio::task::spawn_blocking(move || {
            let result = convert::convert(
                &body.bytes,
                body.gzip,
                &body.content_type,
                &converting,
                span,
                &mut deltas,
                &limits,
            );
            (result, deltas)
        })
        .await;
        match joined {
            Ok((result, deltas)) => (result.map_err(ScrapeError::from), deltas),
            Err(_) => (Err(ScrapeError::Panicked), Deltas::new()),
        }
    }
}
