//! The ingest path every transport shares: checks, rules, the store write, metrics.
//!
//! Input: a [`ProfileSet`], the profiles one HTTP request or one agent batch carries, already
//! parsed; the tenant they belong to; for an agent batch, its [`AgentBatch`] (marker, and the
//! series refused as it was decoded). Output: a [`Stored`], once the store has acknowledged the
//! write, naming the series refused one by one; or the [`IngestError`] that refused everything.
//! Callers: the HTTP handlers in this module's parent and `quic/`. Owns nothing but the handles
//! it is given (the store, the rules, the limits and ingest's metrics) and the count of each
//! tenant's active series (in [`Limits`]).
//!
//! Each series is checked on its own against the limits (`limits.rs`: series per request, labels,
//! label length, the tenant's active series, its time): one bad series is refused with its reason and
//! counted in `smolder_aggregator_dropped_series_total{stage="ingest",reason}`, and the others
//! are stored. Only a request with nothing left to store is refused whole, with the first
//! series' reason; and an agent batch from the future is refused whole and retryable, since all
//! its series share the window and the agent's clock is at fault, not the series.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::SystemTime;

use smolder_common::Profile;
use smolder_common::wire::{BatchLimits, Refusal, RefusalReason};
use tracing::debug;

use super::limits::Limits;
use super::metrics::IngestMetrics;
use super::{IngestConfig, IngestError, blocking};
use crate::metrics::{Dropped, Errors};
use crate::rules::Rules;
use crate::store::{BatchMarker, ProfileSpans, Store, Written};
use crate::tenant::Tenant;

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
/// need to know about them. What passes the checks is stored in one write.
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
    /// The span trees of the profiles that carried span ids, by index in `profiles`.
    pub(crate) spans: ProfileSpans,
}

/// A series of a request that was not stored.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Refused {
    /// Its index among the request's series: for an agent batch, in the batch's `series`; for
    /// HTTP, in the order the body made them.
    pub(crate) index: usize,
    /// Why.
    pub(crate) refusal: Refusal,
}

/// What an agent's batch adds to its profiles: its identity, and the series refused as it was
/// decoded (each by its index in the batch; the [`ProfileSet`] holds the others, in order).
pub(crate) struct AgentBatch {
    /// (agent id, sequence), stored with the profiles so that the batch is kept once.
    pub(crate) marker: BatchMarker,
    /// Series that did not decode.
    pub(crate) refused: Vec<Refused>,
}

/// What one request stored.
#[derive(Debug, Default)]
pub(crate) struct Stored {
    /// Profiles stored.
    pub(crate) profiles: usize,
    /// Stacks with a value among them.
    pub(crate) samples: u64,
    /// The batch had been stored before (QUIC ingest only); nothing was written.
    pub(crate) duplicate: bool,
    /// The series refused, by index, each with why; the others are stored.
    pub(crate) refused: Vec<Refused>,
}

/// The ingest path: checks each series of a [`ProfileSet`] against the limits, evaluates the
/// rules on those that pass, writes them to the store, and once the write is acknowledged
/// counts them in the rules and the metrics.
pub(crate) struct Ingester {
    store: Arc<dyn Store>,
    rules: Arc<Rules>,
    config: IngestConfig,
    limits: Limits,
    metrics: IngestMetrics,
    errors: Errors,
    dropped: Dropped,
}

impl Ingester {
    /// An ingest path writing to `store`, counting in `rules`, under `config` and its series'
    /// `limits`; refused series are counted in `dropped`
    /// (`smolder_aggregator_dropped_series_total`).
    pub(crate) fn new(
        store: Arc<dyn Store>,
        rules: Arc<Rules>,
        config: IngestConfig,
        limits: Limits,
        metrics: IngestMetrics,
        errors: Errors,
        dropped: Dropped,
    ) -> Ingester {
        for reason in RefusalReason::ALL {
            dropped.add("ingest", reason.as_str(), false, 0);
        }
        Ingester {
            store,
            rules,
            limits,
            config,
            metrics,
            errors,
            dropped,
        }
    }

    /// Ingest's configuration: the caps that the HTTP handlers read bodies under.
    pub(crate) fn config(&self) -> &IngestConfig {
        &self.config
    }

    /// The limits a batch must keep, as the QUIC welcome announces them.
    pub(crate) fn batch_limits(&self) -> BatchLimits {
        self.limits.batch()
    }

    /// Stores the series of `set` that pass the checks for `tenant` in one store write, then
    /// records the rules' increments and the ingest metrics. With `batch` (an agent's) the store
    /// keeps it at most once: a batch stored before is answered as [`Stored::duplicate`] and
    /// counted nowhere again.
    ///
    /// # Errors
    ///
    /// [`IngestError::Refused`] when no series is left to store (each refused for its limit,
    /// its time or, in an agent batch, its encoding); [`IngestError::ClockSkew`] when an agent
    /// batch's window ends more than [`MAX_CLOCK_SKEW`] past the aggregator's clock (nothing is
    /// stored then); [`IngestError::Store`] when the write fails; [`IngestError::Panicked`] when
    /// rule evaluation panicked.
    pub(crate) async fn ingest(
        &self,
        tenant: &Tenant,
        set: ProfileSet,
        batch: Option<AgentBatch>,
    ) -> Result<Stored, IngestError> {
        let ProfileSet {
            transport,
            format,
            sent_bytes,
            profiles,
            spans,
        } = set;
        let now = SystemTime::now();
        let (marker, mut refused) = match batch {
            Some(AgentBatch { marker, refused }) => (Some(marker), refused),
            None => (None, Vec::new()),
        };
        let decoded: Vec<usize> = refused.iter().map(|r| r.index).collect();
        let checked = self.limits.check(tenant, profiles, &mut refused, now);
        let spans = kept_spans(spans, &decoded, &refused[decoded.len()..]);
        refused.sort_by_key(|r| r.index);
        let count_refused = |refused: &[Refused]| {
            for r in refused {
                self.dropped
                    .add("ingest", r.refusal.reason.as_str(), false, 1);
            }
        };
        if marker.is_some()
            && let Some(skewed) = refused
                .iter()
                .find(|r| r.refusal.reason == RefusalReason::ClockSkew)
        {
            // One window, one clock: the batch waits at the agent until its time comes.
            self.metrics
                .clock_skew_rejects
                .with_label_values(&[transport.label()])
                .inc();
            return Err(IngestError::ClockSkew {
                reason: skewed.refusal.message.clone(),
            });
        }
        if checked.is_empty() && !refused.is_empty() {
            if refused
                .iter()
                .any(|r| r.refusal.reason == RefusalReason::ClockSkew)
            {
                self.metrics
                    .clock_skew_rejects
                    .with_label_values(&[transport.label()])
                    .inc();
            }
            count_refused(&refused);
            return Err(IngestError::Refused { refused });
        }
        let mut types = BTreeSet::new();
        let mut samples = Vec::with_capacity(checked.len());
        let mut stored = Stored::default();
        let profiles: Vec<Profile> = checked
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
        stored.refused = refused;
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
            .write(tenant, profiles, spans, marker)
            .await
            .map_err(|source| IngestError::Store { source })?;
        if written == Written::Duplicate {
            stored.duplicate = true;
            return Ok(stored);
        }
        count_refused(&stored.refused);
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
                refused = stored.refused.len(),
                "ingested"
            ),
            Err(error) => {
                self.errors.inc("ingest", error.error_type());
                debug!(route, status = error.status().as_u16(), %error, "ingest rejected");
            }
        }
    }
}

/// The span trees of the profiles that passed the limits, indexed by their position among
/// those (a refused profile's spans go with it). `spans` is indexed by position among the
/// profiles that reached the limits; `checked` are the limits' refusals, each under its index
/// among the request's series, which skips the `decoded` refusals made before.
fn kept_spans(spans: ProfileSpans, decoded: &[usize], checked: &[Refused]) -> ProfileSpans {
    if spans.is_empty() || checked.is_empty() {
        return spans;
    }
    let mut decoded = decoded.to_vec();
    decoded.sort_unstable();
    let position = |index: usize| index - decoded.partition_point(|&d| d < index);
    let mut gone: Vec<usize> = checked.iter().map(|r| position(r.index)).collect();
    gone.sort_unstable();
    spans
        .into_iter()
        .filter(|(at, _)| gone.binary_search(at).is_err())
        .map(|(at, trees)| (at - gone.partition_point(|&g| g < at), trees))
        .collect()
}
#[cfg(test)]
mod tests {
    //! The ingest path driven directly, against a real block store in a temporary directory:
    //! no listener, no HTTP, no QUIC.

    use std::collections::{BTreeMap, HashMap};
    use std::time::{Duration, UNIX_EPOCH};

    use smolder_common::rules::RuleSpec;
    use smolder_common::{ProfileMeta, Selector, Series, SpanId, SpanTrees, Tree};

    use super::*;
    use crate::metrics::Metrics;
    use crate::rules::RulesMetrics;
    use crate::store::{BlockStore, StoreConfig, StoreMetrics, TimeRange, unix};

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
            let limits = Limits::new(&config, &HashMap::new(), StoreConfig::default().retention);
            let ingester = Ingester::new(
                shared,
                Arc::clone(&rules),
                config,
                limits,
                IngestMetrics::new(metrics.registry()),
                metrics.errors.clone(),
                metrics.dropped_series.clone(),
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
            spans: Vec::new(),
        }
    }

    fn batch(sequence: u64) -> AgentBatch {
        AgentBatch {
            marker: BatchMarker {
                agent_id: "agent-1".to_owned(),
                sequence,
                window_end: unix(SystemTime::now()),
            },
            refused: Vec::new(),
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
                    Some(batch(7)),
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
            matches!(&outcome, Err(error @ IngestError::Refused { .. }) if error.to_string().contains("ingest.max-labels-per-series")),
            "{outcome:?}"
        );
        assert_eq!(
            outcome.as_ref().unwrap_err().status(),
            axum::http::StatusCode::UNPROCESSABLE_ENTITY
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
            matches!(&outcome, Err(error @ IngestError::Refused { .. }) if error.status() == axum::http::StatusCode::BAD_REQUEST),
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

    /// A set of one profile per entry of `series`, each ending now.
    fn several(transport: Transport, series: &[&str]) -> ProfileSet {
        let mut all = set(transport, "pprof", series[0], &[("main", 1)]);
        for (i, name) in series.iter().enumerate().skip(1) {
            let one = set(transport, "pprof", name, &[("main", i as u64 + 1)]);
            all.profiles.extend(one.profiles);
        }
        all
    }

    #[tokio::test]
    async fn bad_series_are_refused_one_by_one_and_the_others_stored() {
        let fixture = Fixture::new(IngestConfig {
            max_labels_per_series: 1,
            max_series_per_request: 3,
            ..IngestConfig::default()
        });
        let tenant = Tenant::anonymous();
        let stored = fixture
            .ingester
            .ingest(
                &tenant,
                several(
                    Transport::Http,
                    &[
                        "app.cpu",
                        "app.cpu{a=1,b=2}",
                        "app.cpu{c=3}",
                        "app.cpu{d=4}",
                    ],
                ),
                None,
            )
            .await
            .unwrap();
        assert_eq!(stored.profiles, 2);
        let refused: Vec<(usize, RefusalReason)> = stored
            .refused
            .iter()
            .map(|r| (r.index, r.refusal.reason))
            .collect();
        assert_eq!(
            refused,
            [
                (1, RefusalReason::TooManyLabels),
                (3, RefusalReason::TooManySeries)
            ]
        );
        assert_eq!(fixture.stored(), "main 4\n");
        for (reason, count) in [
            ("too_many_labels", 1.0),
            ("too_many_series", 1.0),
            ("invalid", 0.0),
        ] {
            assert_eq!(
                fixture.metric(&format!(
                    "smolder_aggregator_dropped_series_total{{intentional=\"false\",reason=\"{reason}\",stage=\"ingest\"}}"
                )),
                Some(count),
                "{reason}"
            );
        }
    }

    #[tokio::test]
    async fn a_tenant_at_its_series_limit_gets_no_new_series() {
        let fixture = Fixture::new(IngestConfig {
            max_active_series_per_tenant: 2,
            ..IngestConfig::default()
        });
        let tenant = Tenant::anonymous();
        let stored = fixture
            .ingester
            .ingest(
                &tenant,
                several(
                    Transport::Http,
                    &["app.cpu{n=1}", "app.cpu{n=2}", "app.cpu{n=3}"],
                ),
                None,
            )
            .await
            .unwrap();
        assert_eq!(stored.refused.len(), 1);
        assert_eq!(stored.refused[0].index, 2);
        assert_eq!(
            stored.refused[0].refusal.reason,
            RefusalReason::TenantSeriesLimit
        );
        // Its active series are still stored; a request of new ones only is a 429.
        let again = fixture
            .ingester
            .ingest(&tenant, several(Transport::Http, &["app.cpu{n=1}"]), None)
            .await
            .unwrap();
        assert!(again.refused.is_empty());
        let refused = fixture
            .ingester
            .ingest(&tenant, several(Transport::Http, &["app.cpu{n=4}"]), None)
            .await
            .unwrap_err();
        assert_eq!(refused.status(), axum::http::StatusCode::TOO_MANY_REQUESTS);
        assert!(
            refused
                .to_string()
                .contains("ingest.max-active-series-per-tenant"),
            "{refused}"
        );
        // Another tenant has its own.
        let other = Tenant::new("team-b").unwrap();
        fixture
            .ingester
            .ingest(&other, several(Transport::Http, &["app.cpu{n=4}"]), None)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn an_agent_batch_from_the_future_is_refused_whole_for_now() {
        let fixture = Fixture::new(IngestConfig::default());
        let mut future = several(Transport::Quic, &["app.cpu{a=1}", "app.cpu{b=2}"]);
        for (profile, _) in &mut future.profiles {
            profile.until += Duration::from_secs(3_600);
            profile.from += Duration::from_secs(3_600);
        }
        let outcome = fixture
            .ingester
            .ingest(&Tenant::anonymous(), future, Some(batch(1)))
            .await;
        assert!(
            matches!(outcome, Err(IngestError::ClockSkew { .. })),
            "{outcome:?}"
        );
        assert_eq!(
            fixture
                .metric("smolder_aggregator_ingest_clock_skew_rejects_total{transport=\"quic\"}"),
            Some(1.0)
        );
        assert_eq!(fixture.stored(), "");
        // Once its time comes, the same batch is stored.
        let now = several(Transport::Quic, &["app.cpu{a=1}", "app.cpu{b=2}"]);
        let stored = fixture
            .ingester
            .ingest(&Tenant::anonymous(), now, Some(batch(1)))
            .await
            .unwrap();
        assert_eq!((stored.profiles, stored.duplicate), (2, false));
    }

    #[tokio::test]
    async fn an_agent_batch_keeps_the_indices_of_its_undecodable_series() {
        let fixture = Fixture::new(IngestConfig {
            max_label_bytes: 4,
            ..IngestConfig::default()
        });
        let mut agent_batch = batch(3);
        agent_batch.refused.push(Refused {
            index: 0,
            refusal: Refusal {
                reason: RefusalReason::Invalid,
                message: "series 0: invalid tree".to_owned(),
            },
        });
        let stored = fixture
            .ingester
            .ingest(
                &Tenant::anonymous(),
                several(Transport::Quic, &["app.cpu{long=value}", "app.cpu{k=v}"]),
                Some(agent_batch),
            )
            .await
            .unwrap();
        let refused: Vec<(usize, RefusalReason)> = stored
            .refused
            .iter()
            .map(|r| (r.index, r.refusal.reason))
            .collect();
        assert_eq!(
            refused,
            [
                (0, RefusalReason::Invalid),
                (1, RefusalReason::LabelTooLong)
            ],
            "the profiles are the batch's series 1 and 2"
        );
        assert_eq!(stored.profiles, 1);
    }

    /// Span trees follow their profiles through refusals: a refused profile's go, the others'
    /// are re-indexed among the profiles stored.
    #[test]
    fn span_trees_follow_their_profiles_past_refusals() {
        let trees = |n: u8| {
            let mut trees = SpanTrees::new();
            trees
                .tree_mut(SpanId::from_bytes([n; 8]).unwrap())
                .insert_names(["main"], 1);
            trees
        };
        let refusal = |index| Refused {
            index,
            refusal: Refusal {
                reason: RefusalReason::LabelTooLong,
                message: String::new(),
            },
        };
        // Profiles 0..4 reached the limits, which refused 1 and 3.
        let spans = vec![(0, trees(1)), (1, trees(2)), (2, trees(3)), (3, trees(4))];
        let kept = kept_spans(spans, &[], &[refusal(1), refusal(3)]);
        assert_eq!(kept, vec![(0, trees(1)), (1, trees(3))]);
        // An agent batch whose series 0 did not decode: the limits' indices skip it.
        let spans = vec![(0, trees(1)), (1, trees(2))];
        let kept = kept_spans(spans, &[0], &[refusal(1)]);
        assert_eq!(kept, vec![(0, trees(2))]);
    }
}
