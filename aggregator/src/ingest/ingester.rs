//! The ingest path every transport shares: checks, rules, the store write, metrics.
//!
//! Input: a [`ProfileSet`], the profiles one HTTP request or one agent batch carries, already
//! parsed; the tenant they belong to; for an agent batch, its [`BatchMarker`]. Output: a
//! [`Stored`], once the store has acknowledged the write, or the [`IngestError`] that refused
//! it. Callers: the HTTP handlers in this module's parent and `quic/`. Owns nothing but the
//! handles it is given: the store, the rules, the limits and ingest's metrics.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use smolder_common::Profile;
use tracing::debug;

use super::metrics::IngestMetrics;
use super::{IngestConfig, IngestError, blocking};
use crate::metrics::Errors;
use crate::rules::Rules;
use crate::store::{BatchMarker, Store, Written};
use crate::tenant::Tenant;

/// How far past the aggregator's clock a profile may end: agents' clocks drift, but a profile
/// from the future would sit in a bucket no query reaches and that retention never deletes.
pub(crate) const MAX_CLOCK_SKEW: Duration = Duration::from_secs(600);

/// How profiles reached the aggregator: the `transport` label of
/// `smolder_aggregator_ingest_profiles_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transport {
    /// An HTTP request: `/ingest`, Connect push.
    Http,
    /// An agent's batch over QUIC.
    Quic,
}

impl Transport {
    /// The label value.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Transport::Http => "http",
            Transport::Quic => "quic",
        }
    }
}

/// The profiles one ingest request (or one agent batch) carries, parsed, with what the metrics
/// need to know about them. Stored all or nothing.
pub(crate) struct ProfileSet {
    /// How they came.
    pub(crate) transport: Transport,
    /// The `format` label of `smolder_aggregator_ingest_profiles_total`: what the body was
    /// (`folded`, `lines`, `pprof`, `jfr`, `push`, `wire`).
    pub(crate) format: &'static str,
    /// The body's size as sent.
    pub(crate) sent_bytes: usize,
    /// Each profile with the `type` label of the distributor metrics.
    pub(crate) profiles: Vec<(Profile, &'static str)>,
}

/// What one request stored, for its debug event.
#[derive(Debug, Default)]
pub(crate) struct Stored {
    /// Profiles stored.
    pub(crate) profiles: usize,
    /// Stacks with a value among them.
    pub(crate) samples: u64,
    /// The batch had been stored before (QUIC ingest only); nothing was written.
    pub(crate) duplicate: bool,
}

/// The ingest path: checks a [`ProfileSet`] against the limits, evaluates the rules on it,
/// writes it to the store, and once the write is acknowledged counts it in the rules and the
/// metrics.
pub(crate) struct Ingester {
    store: Arc<dyn Store>,
    rules: Arc<Rules>,
    config: IngestConfig,
    /// Profiles that ended longer ago than this are refused: the store's retention
    /// (`store.retention`), which would delete them at once.
    retention: Duration,
    metrics: IngestMetrics,
    errors: Errors,
}

impl Ingester {
    /// An ingest path writing to `store`, counting in `rules`, under the limits of `config`
    /// and the store's `retention`.
    pub(crate) fn new(
        store: Arc<dyn Store>,
        rules: Arc<Rules>,
        config: IngestConfig,
        retention: Duration,
        metrics: IngestMetrics,
        errors: Errors,
    ) -> Ingester {
        Ingester {
            store,
            rules,
            config,
            retention,
            metrics,
            errors,
        }
    }

    /// Ingest's configuration: the caps that the HTTP handlers read bodies under.
    pub(crate) fn config(&self) -> &IngestConfig {
        &self.config
    }

    /// Stores `set` for `tenant` in one store write, then records the rules' increments and
    /// the ingest metrics. With `marker` (an agent's batch) the store keeps it at most once: a
    /// batch stored before is answered as [`Stored::duplicate`] and counted nowhere again.
    ///
    /// # Errors
    ///
    /// [`IngestError::SeriesLimit`] over a limit on series or labels,
    /// [`IngestError::TimeOutOfRange`] when any profile is stamped too far in the future or
    /// older than the retention (nothing is stored then); [`IngestError::Store`] when the write
    /// fails; [`IngestError::Panicked`] when rule evaluation panicked.
    pub(crate) async fn ingest(
        &self,
        tenant: &Tenant,
        set: ProfileSet,
        marker: Option<BatchMarker>,
    ) -> Result<Stored, IngestError> {
        let ProfileSet {
            transport,
            format,
            sent_bytes,
            profiles,
        } = set;
        let now = SystemTime::now();
        check_series(&profiles, &self.config)?;
        for (profile, _) in &profiles {
            check_time(profile, now, self.retention)?;
        }
        let mut types = BTreeSet::new();
        let mut samples = Vec::with_capacity(profiles.len());
        let mut stored = Stored::default();
        let profiles: Vec<Profile> = profiles
            .into_iter()
            .map(|(profile, kind)| {
                let stacks = profile.tree.stack_count() as u64;
                samples.push((kind, stacks));
                types.insert(kind);
                stored.samples += stacks;
                profile
            })
            .collect();
        stored.profiles = profiles.len();
        if marker.is_none() && profiles.is_empty() {
            return Ok(stored);
        }
        // Rules are evaluated before the write, which takes the profiles, and counted only once
        // it is acknowledged: a refused write counts nowhere, a duplicate batch counts once.
        let rules = self.rules.current(tenant);
        let (profiles, increments) = if rules.is_empty() || profiles.is_empty() {
            (profiles, Default::default())
        } else {
            let engine = Arc::clone(&self.rules);
            blocking(move || {
                let increments = engine.evaluate(&rules, &profiles);
                Ok((profiles, increments))
            })
            .await?
        };
        let written = self
            .store
            .write(tenant, profiles, marker)
            .await
            .map_err(|source| IngestError::Store { source })?;
        if written == Written::Duplicate {
            stored.duplicate = true;
            return Ok(stored);
        }
        self.rules.apply(tenant, increments);
        self.metrics
            .profiles
            .with_label_values(&[transport.label(), format])
            .inc_by(stored.profiles as u64);
        // A body with several sample types counts its size under each, as Pyroscope counts a
        // pushed profile under its one `__name__`.
        for kind in types {
            self.metrics
                .received_compressed_bytes
                .with_label_values(&[kind])
                .observe(sent_bytes as f64);
        }
        for (kind, stacks) in samples {
            self.metrics
                .received_samples
                .with_label_values(&[kind])
                .observe(stacks as f64);
        }
        Ok(stored)
    }

    /// Counts and logs a request's outcome: `route` names it in the debug event.
    pub(crate) fn record(&self, route: &'static str, outcome: &Result<Stored, IngestError>) {
        match outcome {
            Ok(stored) => debug!(
                route,
                profiles = stored.profiles,
                stacks = stored.samples,
                "ingested"
            ),
            Err(error) => {
                self.errors.inc("ingest", error.error_type());
                debug!(route, status = error.status().as_u16(), %error, "ingest rejected");
            }
        }
    }
}

/// Rejects a request over the limits on series and labels: each label becomes an index key in
/// the store, so these bound what one request can add to it.
fn check_series(
    profiles: &[(Profile, &'static str)],
    config: &IngestConfig,
) -> Result<(), IngestError> {
    if profiles.len() > config.max_series_per_request {
        return Err(IngestError::SeriesLimit {
            reason: format!(
                "the request makes {} series, more than ingest.max-series-per-request ({})",
                profiles.len(),
                config.max_series_per_request
            ),
        });
    }
    for (profile, _) in profiles {
        let labels = profile.series.labels();
        if labels.len() > config.max_labels_per_series {
            return Err(IngestError::SeriesLimit {
                reason: format!(
                    "series {} has {} labels, more than ingest.max-labels-per-series ({})",
                    profile.series.app(),
                    labels.len(),
                    config.max_labels_per_series
                ),
            });
        }
        if let Some((name, _)) = labels
            .iter()
            .find(|(name, value)| name.len().max(value.len()) > config.max_label_bytes)
        {
            return Err(IngestError::SeriesLimit {
                reason: format!(
                    "label {:?} of series {} is longer than ingest.max-label-bytes ({})",
                    name.chars().take(64).collect::<String>(),
                    profile.series.app(),
                    config.max_label_bytes
                ),
            });
        }
    }
    Ok(())
}

/// Rejects a profile stamped beyond [`MAX_CLOCK_SKEW`] or older than `retention`.
fn check_time(profile: &Profile, now: SystemTime, retention: Duration) -> Result<(), IngestError> {
    let unix = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    };
    if profile.until > now + MAX_CLOCK_SKEW {
        return Err(IngestError::TimeOutOfRange {
            reason: format!(
                "until {} is more than {} s after the aggregator's clock ({})",
                unix(profile.until),
                MAX_CLOCK_SKEW.as_secs(),
                unix(now)
            ),
        });
    }
    if profile.until + retention < now {
        return Err(IngestError::TimeOutOfRange {
            reason: format!(
                "until {} is older than the retention (store.retention, {} s); it would be deleted at once",
                unix(profile.until),
                retention.as_secs()
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The ingest path driven directly, against a real block store in a temporary directory:
    //! no listener, no HTTP, no QUIC.

    use std::collections::BTreeMap;
    use std::time::UNIX_EPOCH;

    use smolder_common::rules::RuleSpec;
    use smolder_common::{ProfileMeta, Selector, Series, Tree};

    use super::*;
    use crate::metrics::Metrics;
    use crate::rules::RulesMetrics;
    use crate::store::{BlockStore, StoreConfig, StoreMetrics, TimeRange};

    /// An ingest path over a fresh store, with one provisioned rule counting `app.cpu`.
    struct Fixture {
        _dir: tempfile::TempDir,
        store: BlockStore,
        rules: Arc<Rules>,
        metrics: Metrics,
        ingester: Ingester,
    }

    impl Fixture {
        fn new(config: IngestConfig) -> Fixture {
            let dir = tempfile::tempdir().unwrap();
            let metrics = Metrics::new();
            let store = BlockStore::open(
                dir.path(),
                StoreConfig::default(),
                StoreMetrics::new(metrics.registry(), &metrics.health),
            )
            .unwrap();
            let shared: Arc<dyn Store> = Arc::new(store.clone());
            let spec = RuleSpec {
                expr: "app.cpu".to_owned(),
                ..RuleSpec::default()
            };
            let rules = Arc::new(
                Rules::load(
                    &BTreeMap::from([("app_seconds_total".to_owned(), spec)]),
                    Arc::clone(&shared),
                    false,
                    RulesMetrics::new(metrics.registry(), metrics.dropped_increments.clone()),
                )
                .unwrap(),
            );
            let ingester = Ingester::new(
                shared,
                Arc::clone(&rules),
                config,
                StoreConfig::default().retention,
                IngestMetrics::new(metrics.registry()),
                metrics.errors.clone(),
            );
            Fixture {
                _dir: dir,
                store,
                rules,
                metrics,
                ingester,
            }
        }

        /// The `app.cpu` tree stored over the last day, folded.
        fn stored(&self) -> String {
            let now = SystemTime::now();
            let range = TimeRange {
                from: now - Duration::from_secs(86_400),
                until: now + Duration::from_secs(60),
            };
            let merged = self
                .store
                .merge(
                    &Tenant::anonymous(),
                    &Selector::parse("app.cpu").unwrap(),
                    range,
                    crate::store::BUCKET,
                )
                .unwrap();
            smolder_common::to_folded(&merged.sum.tree)
        }

        /// The value of the first line of `/metrics` starting with `prefix`, or `None`.
        fn metric(&self, prefix: &str) -> Option<f64> {
            let text = self.metrics.render().unwrap();
            text.lines()
                .find(|line| line.starts_with(prefix))
                .and_then(|line| line.rsplit_once(' '))
                .map(|(_, value)| value.parse().unwrap())
        }
    }

    /// A set of one `series` profile ending now, with `stacks`.
    fn set(
        transport: Transport,
        format: &'static str,
        series: &str,
        stacks: &[(&str, u64)],
    ) -> ProfileSet {
        let mut tree = Tree::new();
        for (stack, value) in stacks {
            tree.insert_names(stack.split(';'), *value);
        }
        let until = SystemTime::now();
        ProfileSet {
            transport,
            format,
            sent_bytes: 100,
            profiles: vec![(
                Profile {
                    series: Series::parse(series).unwrap(),
                    meta: ProfileMeta::default(),
                    from: until - Duration::from_secs(10),
                    until,
                    tree,
                },
                "cpu",
            )],
        }
    }

    fn marker(sequence: u64) -> BatchMarker {
        BatchMarker {
            agent_id: "agent-1".to_owned(),
            sequence,
            window_end: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_secs(),
        }
    }

    #[tokio::test]
    async fn a_set_is_checked_counted_by_the_rules_stored_and_measured() {
        let fixture = Fixture::new(IngestConfig::default());
        let tenant = Tenant::anonymous();
        let stored = fixture
            .ingester
            .ingest(
                &tenant,
                set(
                    Transport::Http,
                    "folded",
                    "app.cpu",
                    &[("main;work", 30), ("main;idle", 2)],
                ),
                None,
            )
            .await
            .unwrap();
        assert_eq!(
            (stored.profiles, stored.samples, stored.duplicate),
            (1, 2, false)
        );
        assert_eq!(fixture.stored(), "main;idle 2\nmain;work 30\n");
        // 32 samples at 100 Hz.
        assert!(
            fixture
                .rules
                .render(&Tenant::anonymous())
                .contains("\napp_seconds_total 0.32\n"),
            "{}",
            fixture.rules.render(&Tenant::anonymous())
        );
        assert_eq!(
            fixture.metric(
                "smolder_aggregator_ingest_profiles_total{format=\"folded\",transport=\"http\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            fixture.metric("pyroscope_distributor_received_samples_sum{type=\"cpu\"}"),
            Some(2.0)
        );
        assert_eq!(
            fixture.metric("smolder_aggregator_store_profiles_written_total"),
            Some(1.0)
        );
    }

    #[tokio::test]
    async fn a_batch_sent_twice_is_stored_and_counted_once() {
        let fixture = Fixture::new(IngestConfig::default());
        let tenant = Tenant::anonymous();
        for duplicate in [false, true] {
            let stored = fixture
                .ingester
                .ingest(
                    &tenant,
                    set(Transport::Quic, "wire", "app.cpu", &[("main", 50)]),
                    Some(marker(7)),
                )
                .await
                .unwrap();
            assert_eq!(stored.duplicate, duplicate);
        }
        assert_eq!(fixture.stored(), "main 50\n");
        assert!(
            fixture
                .rules
                .render(&Tenant::anonymous())
                .contains("\napp_seconds_total 0.5\n")
        );
        assert_eq!(
            fixture.metric(
                "smolder_aggregator_ingest_profiles_total{format=\"wire\",transport=\"quic\"}"
            ),
            Some(1.0)
        );
    }

    #[tokio::test]
    async fn a_refused_set_stores_nothing_and_counts_its_error() {
        let fixture = Fixture::new(IngestConfig {
            max_labels_per_series: 1,
            ..IngestConfig::default()
        });
        let tenant = Tenant::anonymous();
        let outcome = fixture
            .ingester
            .ingest(
                &tenant,
                set(
                    Transport::Http,
                    "folded",
                    "app.cpu{a=1,b=2}",
                    &[("main", 5)],
                ),
                None,
            )
            .await;
        assert!(
            matches!(outcome, Err(IngestError::SeriesLimit { ref reason }) if reason.contains("ingest.max-labels-per-series")),
            "{outcome:?}"
        );
        fixture.ingester.record("ingest", &outcome);
        assert_eq!(
            fixture.metric(
                "smolder_aggregator_errors_total{error_type=\"series_limit\",stage=\"ingest\"}"
            ),
            Some(1.0)
        );

        let mut old = set(Transport::Http, "folded", "app.cpu", &[("main", 5)]);
        old.profiles[0].0.until = UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        old.profiles[0].0.from = old.profiles[0].0.until - Duration::from_secs(10);
        let outcome = fixture.ingester.ingest(&tenant, old, None).await;
        assert!(
            matches!(outcome, Err(IngestError::TimeOutOfRange { .. })),
            "{outcome:?}"
        );

        assert_eq!(fixture.stored(), "");
        assert!(
            fixture
                .rules
                .render(&Tenant::anonymous())
                .contains("\napp_seconds_total 0\n")
        );
        assert_eq!(
            fixture.metric("smolder_aggregator_ingest_profiles_total"),
            None
        );
    }

    #[tokio::test]
    async fn a_store_failure_is_an_error_and_counts_nowhere() {
        let fixture = Fixture::new(IngestConfig::default());
        fixture.store.close().await.unwrap();
        let outcome = fixture
            .ingester
            .ingest(
                &Tenant::anonymous(),
                set(Transport::Http, "folded", "app.cpu", &[("main", 5)]),
                None,
            )
            .await;
        assert!(
            matches!(outcome, Err(IngestError::Store { .. })),
            "{outcome:?}"
        );
        assert!(
            fixture
                .rules
                .render(&Tenant::anonymous())
                .contains("\napp_seconds_total 0\n")
        );
        assert_eq!(
            fixture.metric("smolder_aggregator_ingest_profiles_total"),
            None
        );
    }
}
