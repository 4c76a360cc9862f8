//! The pprof scraper's metrics (`smolder_agent_scrape_*`), per job: updated per scrape, per
//! target set change and per discovery document. Failed scrapes and refused discovery documents
//! are also counted in `smolder_agent_errors_total{stage="scrape"}`, without the job.

use prometheus::{HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};
use smolder_daemon::metrics::{counter_vec, histogram_vec, register};

use crate::tier::{StageCounters, TierCounters};

/// The `error_type`s of `smolder_agent_errors_total{stage="scrape"}`: a failed scrape's reason
/// (as in `smolder_agent_scrape_failures_total`), or `discovery` for a refused document.
const ERROR_TYPES: [&str; 10] = [
    "timeout",
    "connect",
    "redirects",
    "request",
    "status",
    "too_large",
    "credentials",
    "decode",
    "panic",
    "discovery",
];

/// The pprof scraper's metrics (`scrape-configs`), per job. Labels are bounded: `job` and
/// `profile` come from the config, `reason` and `mechanism` from fixed lists.
#[derive(Clone)]
pub struct ScrapeMetrics {
    /// `smolder_agent_scrape_duration_seconds{job,profile}`: request to profiles submitted.
    pub duration: HistogramVec,
    /// `smolder_agent_scrape_scrapes_total{job,profile}`: scrapes attempted.
    pub scrapes: IntCounterVec,
    /// `smolder_agent_scrape_failures_total{job,profile,reason}`: failed scrapes, by `timeout`,
    /// `connect`, `redirects`, `request`, `status`, `too_large`, `credentials`, `decode`.
    pub failures: IntCounterVec,
    /// `smolder_agent_scrape_body_bytes_total{job,profile}`: response bytes, as sent.
    pub body_bytes: IntCounterVec,
    /// `smolder_agent_scrape_samples_total{job,profile}`: pprof samples in scraped profiles.
    pub samples: IntCounterVec,
    /// `smolder_agent_scrape_profiles_submitted_total{job,profile}`: series profiles handed
    /// to the window, after deltas.
    pub profiles_submitted: IntCounterVec,
    /// `smolder_agent_scrape_counter_resets_total{job,profile}`: cumulative series whose total
    /// went down (the target restarted), primed again.
    pub counter_resets: IntCounterVec,
    /// `smolder_agent_scrape_targets{job,health}`: targets by health (`up`, `down`,
    /// `unknown`).
    pub targets: IntGaugeVec,
    /// `smolder_agent_scrape_targets_dropped{job}`: discovered label sets not scraped.
    pub targets_dropped: IntGaugeVec,
    /// `smolder_agent_scrape_discovery_refreshes_total{job,mechanism}`: documents read.
    pub discovery_refreshes: IntCounterVec,
    /// `smolder_agent_scrape_discovery_failures_total{job,mechanism}`: documents refused.
    pub discovery_failures: IntCounterVec,
    /// `smolder_agent_errors_total{stage="scrape",error_type}`.
    pub tier: StageCounters,
}

impl ScrapeMetrics {
    /// Creates the scraper's metrics in `registry`.
    pub(crate) fn new(registry: &Registry, tier: &TierCounters) -> Self {
        let counters =
            |name: &str, help: &str, labels: &[&str]| counter_vec(registry, name, help, labels);
        let gauges = |name: &str, help: &str, labels: &[&str]| {
            register(
                registry,
                IntGaugeVec::new(Opts::new(name, help), labels).expect("a valid gauge"),
            )
        };
        let duration = histogram_vec(
            registry,
            "smolder_agent_scrape_duration_seconds",
            "Time from a scrape's request to its profiles being submitted.",
            vec![0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0],
            &["job", "profile"],
        );
        ScrapeMetrics {
            duration,
            scrapes: counters(
                "smolder_agent_scrape_scrapes_total",
                "Scrapes attempted.",
                &["job", "profile"],
            ),
            failures: counters(
                "smolder_agent_scrape_failures_total",
                "Scrapes that failed, by reason.",
                &["job", "profile", "reason"],
            ),
            body_bytes: counters(
                "smolder_agent_scrape_body_bytes_total",
                "Response body bytes read from targets, as sent.",
                &["job", "profile"],
            ),
            samples: counters(
                "smolder_agent_scrape_samples_total",
                "pprof samples in the profiles scraped.",
                &["job", "profile"],
            ),
            profiles_submitted: counters(
                "smolder_agent_scrape_profiles_submitted_total",
                "Series profiles submitted to the window loop, after deltas.",
                &["job", "profile"],
            ),
            counter_resets: counters(
                "smolder_agent_scrape_counter_resets_total",
                "Cumulative series whose total went down (the target restarted).",
                &["job", "profile"],
            ),
            targets: gauges(
                "smolder_agent_scrape_targets",
                "Targets being scraped, by health of their last scrape.",
                &["job", "health"],
            ),
            targets_dropped: gauges(
                "smolder_agent_scrape_targets_dropped",
                "Discovered targets not scraped (relabelled away or invalid).",
                &["job"],
            ),
            discovery_refreshes: counters(
                "smolder_agent_scrape_discovery_refreshes_total",
                "Discovery documents read.",
                &["job", "mechanism"],
            ),
            discovery_failures: counters(
                "smolder_agent_scrape_discovery_failures_total",
                "Discovery documents refused; the previous targets were kept.",
                &["job", "mechanism"],
            ),
            tier: tier.stage("scrape", &ERROR_TYPES, &[]),
        }
    }

    /// Counts a discovery document read by `mechanism` (`file`, `http`).
    pub fn discovery_refresh(&self, job: &str, mechanism: &str) {
        self.discovery_refreshes
            .with_label_values(&[job, mechanism])
            .inc();
    }

    /// Counts a discovery document refused.
    pub fn discovery_failure(&self, job: &str, mechanism: &str) {
        self.discovery_failures
            .with_label_values(&[job, mechanism])
            .inc();
        self.tier.error("discovery");
    }

    /// Counts a failed scrape of `job`'s `profile`, for `reason`.
    pub fn failure(&self, job: &str, profile: &str, reason: &str) {
        self.failures
            .with_label_values(&[job, profile, reason])
            .inc();
        self.tier.error(reason);
    }
}
