//! Rules: Prometheus counters from every profile the aggregator stores.
//!
//! Input: each ingest request's [`Profile`]s, evaluated by [`Rules::evaluate`] before they are
//! written and counted by [`Rules::apply`] once the store has acknowledged them, whatever the
//! body format (folded, lines, pprof, JFR, Connect push; agents' batches go through the same
//! `Ingester`). Output: the counters on `GET /exported-metrics`, and, when
//! `rules.remote-write-url` is set, the same series pushed to a Prometheus remote-write
//! receiver by [`remote_write::run`]. Callers: `ingest`'s `Ingester`, the router in `http`
//! (through [`routes`]), and `app`, which loads the rules and starts the remote-write loop.
//!
//! Rules come from two places: the config file's `metrics-export-rules` map (Pyroscope's format,
//! *provisioned*: listed by the API, never changed by it) and the recording-rules API
//! (`/api/recording-rules`, [`api`]), whose rules are kept in the store (through its writer,
//! like every write; in object-storage mode in the bucket, shared by every aggregator on it)
//! and loaded at start. A rule applies to data ingested after it is created; changing a rule
//! restarts its counter. In object-storage mode [`Rules::follow`] brings in force what other
//! aggregators changed, as the store's poll of the bucket finds it.
//!
//! Owns: the current [`RuleSet`] and its [`Counters`], in memory (counters start at zero with
//! the process, like any Prometheus counter), the remote-write task and the follower. Depends
//! on `store` (the stored rules) and `metrics`, `api_error` and `tenant`; nothing of ingest or
//! query.

mod api;
mod metrics;
pub(crate) mod remote_write;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use smolder_common::Profile;
use smolder_common::rules::{Counters, Increments, Rule, RuleError, RuleSet, RuleSpec};
use smolder_daemon::Heartbeat;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::store::{Store, StoreError};
use crate::tenant::Tenant;

pub(crate) use self::api::routes;
pub(crate) use self::metrics::RulesMetrics;

/// The label naming a series' tenant on `/exported-metrics` and in remote write, under
/// multitenancy.
const TENANT_LABEL: &str = "tenant";

/// Where the counters of the rules go besides `/exported-metrics`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct RulesConfig {
    /// A Prometheus remote-write endpoint (`http://host:9090/api/v1/write`) that every rule's
    /// counters are pushed to; empty, the default, pushes nothing. Plain HTTP only.
    pub remote_write_url: String,
    /// How often the counters are pushed. Default `15s`, Prometheus' scrape interval.
    #[serde(with = "smolder_common::timestamp::serde_duration")]
    pub remote_write_interval: Duration,
    /// How long one push may take before it is abandoned. Default `10s`.
    #[serde(with = "smolder_common::timestamp::serde_duration")]
    pub remote_write_timeout: Duration,
    /// Labels added to every pushed series, such as `{aggregator: eu-1}`, to tell aggregators
    /// apart in a shared Prometheus. Default none.
    pub remote_write_labels: BTreeMap<String, String>,
}

impl Default for RulesConfig {
    fn default() -> Self {
        RulesConfig {
            remote_write_url: String::new(),
            remote_write_interval: Duration::from_secs(15),
            remote_write_timeout: Duration::from_secs(10),
            remote_write_labels: BTreeMap::new(),
        }
    }
}

/// Why the rules could not be loaded or changed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RulesError {
    /// A rule is invalid; the message names it and the problem.
    #[error(transparent)]
    Invalid(#[from] RuleError),
    /// No rule has that name (`PUT`, `DELETE`).
    #[error("rule {name:?} does not exist")]
    NotFound {
        /// The name asked for.
        name: String,
    },
    /// A rule of that name exists already (`POST`).
    #[error("rule {name:?} already exists")]
    Exists {
        /// The name.
        name: String,
    },
    /// The rule comes from the config file's `metrics-export-rules` and the API cannot change
    /// it.
    #[error(
        "rule {name:?} is provisioned from the config file (metrics-export-rules) and cannot be changed through the API"
    )]
    Provisioned {
        /// The name.
        name: String,
    },
    /// A stored rule does not parse (the store is damaged or was written by a newer version).
    #[error("stored rule {name:?} is unreadable: {reason}")]
    Stored {
        /// The rule's name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The store failed.
    #[error("the store failed")]
    Store(#[from] StoreError),
    /// `rules.remote-write-url` is unusable.
    #[error("invalid rules.remote-write-url {url:?}: {reason}")]
    RemoteWriteUrl {
        /// The URL as configured.
        url: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A `rules.remote-write-labels` name is not a Prometheus label name.
    #[error("invalid rules.remote-write-labels name {name:?}: expected [a-zA-Z_][a-zA-Z0-9_]*")]
    RemoteWriteLabel {
        /// The label name.
        name: String,
    },
}

/// Checks the rules and remote-write settings of a config file, as `check-config` and startup
/// do.
///
/// # Errors
///
/// The first invalid rule (named, with its problem) or remote-write setting.
pub(crate) fn check_config(
    rules: &BTreeMap<String, RuleSpec>,
    config: &RulesConfig,
) -> Result<(), RulesError> {
    RuleSet::from_specs(rules)?;
    remote_write::check(config)
}

/// Every tenant's rule set in force and the counters it feeds.
///
/// The config file's rules are every tenant's, each tenant counting its own data; a rule made
/// through the API is its tenant's alone. A tenant's entry is made at start when it has stored
/// rules, else at its first ingest or rules request, so that a tenant without stored rules
/// never costs a store read.
pub(crate) struct Rules {
    /// Names of the rules from the config file.
    provisioned: RuleSet,
    /// Each tenant's rules; taken briefly to find or add a tenant, never across an await.
    tenants: RwLock<BTreeMap<Tenant, Arc<TenantRules>>>,
    store: Arc<dyn Store>,
    /// Whether exported series carry a `tenant` label (`tenant.multitenancy-enabled`).
    label_tenants: bool,
    metrics: RulesMetrics,
}

/// One tenant's rules and counters.
struct TenantRules {
    /// Read by every ingest request, replaced whole by the API.
    current: RwLock<Arc<RuleSet>>,
    /// Taken briefly per ingest request to add its increments, and by readers to copy values.
    counters: Mutex<Counters>,
    /// Serializes API changes, so that the store and `current` change in the same order.
    changes: tokio::sync::Mutex<()>,
}

impl TenantRules {
    fn new(set: RuleSet) -> TenantRules {
        TenantRules {
            counters: Mutex::new(Counters::new(&set)),
            current: RwLock::new(Arc::new(set)),
            changes: tokio::sync::Mutex::new(()),
        }
    }

    fn current(&self) -> Arc<RuleSet> {
        Arc::clone(
            &self
                .current
                .read()
                .expect("rules lock: taken only to clone or swap"),
        )
    }

    fn counters(&self) -> std::sync::MutexGuard<'_, Counters> {
        self.counters
            .lock()
            .expect("counters lock: taken to add or copy, never across an await")
    }
}

/// One counter value, copied out of the counters' lock.
pub(crate) struct CounterValue {
    /// The metric name.
    pub(crate) name: String,
    /// Its labels that have a value: `tenant` first with multitenancy, then its `group_by`
    /// labels.
    pub(crate) labels: Vec<(String, String)>,
    /// The value.
    pub(crate) value: f64,
}

/// A rule as the API shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct RuleView {
    name: String,
    expr: String,
    node: String,
    function: String,
    group_by: Vec<String>,
    provisioned: bool,
}

impl Rules {
    /// Loads the provisioned rules of the config file and every tenant's stored ones of the
    /// API. With `label_tenants`, exported series carry a `tenant` label.
    ///
    /// # Errors
    ///
    /// [`RulesError::Invalid`] naming the first invalid provisioned rule, or a stored rule that
    /// clashes with a provisioned one; [`RulesError::Stored`] or [`RulesError::Store`] when the
    /// stored rules cannot be read.
    pub(crate) fn load(
        provisioned: &BTreeMap<String, RuleSpec>,
        store: Arc<dyn Store>,
        label_tenants: bool,
        metrics: RulesMetrics,
    ) -> Result<Rules, RulesError> {
        let provisioned = RuleSet::from_specs(provisioned)?;
        let mut tenants = BTreeMap::new();
        let (mut loaded, mut series) = (0, 0);
        // The anonymous tenant is there from the start, so that without multitenancy the
        // rules and their zeroed counters show before the first profile arrives.
        let mut with_rules = store.rule_tenants()?;
        if !with_rules.contains(&Tenant::anonymous()) {
            with_rules.push(Tenant::anonymous());
        }
        for tenant in with_rules {
            let set = Self::load_tenant(&provisioned, store.as_ref(), &tenant, None)?;
            let rules = TenantRules::new(set);
            loaded += rules.current().len();
            series += rules.counters().series();
            tenants.insert(tenant, Arc::new(rules));
        }
        info!(
            tenants = tenants.len(),
            rules = loaded,
            provisioned = provisioned.len(),
            "rules loaded"
        );
        metrics.rules.set(loaded as i64);
        metrics.series.set(series as i64);
        Ok(Rules {
            provisioned,
            tenants: RwLock::new(tenants),
            store,
            label_tenants,
            metrics,
        })
    }

    /// The provisioned rules and `tenant`'s stored ones, as one set; a stored rule that
    /// `current` holds as it is stored keeps its `Rule` (and so its counters).
    fn load_tenant(
        provisioned: &RuleSet,
        store: &dyn Store,
        tenant: &Tenant,
        current: Option<&RuleSet>,
    ) -> Result<RuleSet, RulesError> {
        let mut rules: Vec<Arc<Rule>> = provisioned.rules().to_vec();
        for (name, json) in store.rules(tenant)? {
            let spec: RuleSpec =
                serde_json::from_slice(&json).map_err(|err| RulesError::Stored {
                    name: name.clone(),
                    reason: err.to_string(),
                })?;
            if provisioned.get(&name).is_some() {
                // The config file took the name after the rule was made through the API; the
                // file wins, as it is what the operator wrote last.
                warn!(rule = %name, %tenant, "stored rule shadowed by a provisioned rule of the same name");
                continue;
            }
            if let Some(kept) = current
                .and_then(|set| set.get(&name))
                .filter(|rule| *rule.spec() == spec)
            {
                rules.push(Arc::clone(kept));
                continue;
            }
            let rule = Rule::new(name.clone(), spec).map_err(|err| RulesError::Stored {
                name,
                reason: err.to_string(),
            })?;
            rules.push(Arc::new(rule));
        }
        Ok(RuleSet::new(rules)?)
    }

    /// Object-storage mode: brings every tenant's stored rules in force whenever `changes`
    /// says another aggregator changed them, for as long as the server runs, beating `beat`
    /// while it waits. A rule that did not change keeps its counters.
    pub(crate) async fn follow(
        self: Arc<Self>,
        mut changes: watch::Receiver<u64>,
        beat: Heartbeat,
    ) {
        while beat.beating(changes.changed()).await.is_ok() {
            self.reload().await;
            beat.beat();
        }
    }

    /// Makes every tenant's rules in force those the store has.
    async fn reload(&self) {
        let mut tenants: Vec<Tenant> = self
            .tenants
            .read()
            .expect("tenants lock: taken only to find or add a tenant")
            .keys()
            .cloned()
            .collect();
        match self.store.rule_tenants() {
            Ok(stored) => tenants.extend(stored),
            Err(err) => {
                warn!(error = %err, "reading the stored rules failed; they stay as they were");
                return;
            }
        }
        tenants.sort();
        tenants.dedup();
        for tenant in tenants {
            let rules = self.tenant(&tenant);
            let _change = rules.changes.lock().await;
            let current = rules.current();
            let set = match Self::load_tenant(
                &self.provisioned,
                self.store.as_ref(),
                &tenant,
                Some(&current),
            ) {
                Ok(set) => set,
                Err(err) => {
                    warn!(%tenant, error = %err, "the stored rules of a tenant cannot be brought in force; its rules stay as they were");
                    continue;
                }
            };
            let same = set.rules().len() == current.rules().len()
                && set
                    .rules()
                    .iter()
                    .zip(current.rules())
                    .all(|(a, b)| Arc::ptr_eq(a, b));
            if !same {
                info!(%tenant, rules = set.len(), "rules changed through another aggregator are in force");
                self.install(&rules, set);
                self.metrics.reloads.inc();
            }
        }
    }

    /// `tenant`'s rules, made from the provisioned ones at its first use.
    fn tenant(&self, tenant: &Tenant) -> Arc<TenantRules> {
        if let Some(rules) = self
            .tenants
            .read()
            .expect("tenants lock: taken only to find or add a tenant")
            .get(tenant)
        {
            return Arc::clone(rules);
        }
        let mut tenants = self
            .tenants
            .write()
            .expect("tenants lock: taken only to find or add a tenant");
        let rules = tenants.entry(tenant.clone()).or_insert_with(|| {
            let rules = TenantRules::new(self.provisioned.clone());
            self.metrics.rules.add(self.provisioned.len() as i64);
            self.metrics.series.add(rules.counters().series() as i64);
            Arc::new(rules)
        });
        Arc::clone(rules)
    }

    /// The rule set in force for `tenant`.
    pub(crate) fn current(&self, tenant: &Tenant) -> Arc<RuleSet> {
        self.tenant(tenant).current()
    }

    /// What `profiles` add to the counters, under `rules` (from [`Rules::current`]); nothing is
    /// counted until [`Rules::apply`]. Runs on the caller's thread: large trees belong on the
    /// blocking pool.
    pub(crate) fn evaluate(&self, rules: &RuleSet, profiles: &[Profile]) -> Increments {
        let started = Instant::now();
        let mut increments = Increments::default();
        for profile in profiles {
            rules.evaluate_into(profile, &mut increments);
        }
        self.metrics
            .evaluation_duration
            .observe(started.elapsed().as_secs_f64());
        self.metrics
            .profiles_evaluated
            .inc_by(profiles.len() as u64);
        increments
    }

    /// Adds increments of `tenant`'s profiles that the store has acknowledged.
    pub(crate) fn apply(&self, tenant: &Tenant, increments: Increments) {
        if increments.is_empty() {
            return;
        }
        let rules = self.tenant(tenant);
        let mut counters = rules.counters();
        let before = counters.series();
        let applied = counters.apply(increments);
        let after = counters.series();
        drop(counters);
        self.metrics.series.add(after as i64 - before as i64);
        // A stale increment belongs to a rule that changed: its counter restarted by design.
        for (reason, intentional, count) in [
            ("stale", true, applied.stale),
            ("series_limit", false, applied.over_limit),
        ] {
            if count > 0 {
                self.metrics
                    .dropped
                    .add("rules", reason, intentional, count as u64);
            }
        }
        if applied.over_limit > 0 {
            warn!(
                dropped = applied.over_limit,
                %tenant,
                limit = smolder_common::rules::MAX_SERIES_PER_RULE,
                "a rule's group_by has more label combinations than the limit; new ones are not counted"
            );
        }
    }

    /// `tenant`'s counters in Prometheus' text format, each series labelled with the tenant
    /// under multitenancy.
    pub(crate) fn render(&self, tenant: &Tenant) -> String {
        let rules = self.tenant(tenant);
        let counters = rules.counters();
        if self.label_tenants {
            counters.render_with(&[(TENANT_LABEL, tenant.as_str())])
        } else {
            counters.render()
        }
    }

    /// Every tenant's counter values, copied, for a remote write; under multitenancy each
    /// labelled with its tenant (a `group_by` label of that name becomes `exported_tenant`).
    pub(crate) fn snapshot(&self) -> Vec<CounterValue> {
        let tenants: Vec<(Tenant, Arc<TenantRules>)> = self
            .tenants
            .read()
            .expect("tenants lock: taken only to find or add a tenant")
            .iter()
            .map(|(tenant, rules)| (tenant.clone(), Arc::clone(rules)))
            .collect();
        let mut out = Vec::new();
        for (tenant, rules) in tenants {
            let counters = rules.counters();
            out.extend(counters.samples().map(|s| {
                let own = s.labels.iter().map(|(n, v)| {
                    let name = if self.label_tenants && *n == TENANT_LABEL {
                        format!("exported_{n}")
                    } else {
                        (*n).to_owned()
                    };
                    (name, (*v).to_owned())
                });
                let labels = self
                    .label_tenants
                    .then(|| (TENANT_LABEL.to_owned(), tenant.as_str().to_owned()))
                    .into_iter()
                    .chain(own)
                    .collect();
                CounterValue {
                    name: s.name.to_owned(),
                    labels,
                    value: s.value,
                }
            }));
        }
        out
    }

    /// `tenant`'s rules as the API shows them, in name order.
    pub(crate) fn list(&self, tenant: &Tenant) -> Vec<RuleView> {
        self.current(tenant)
            .rules()
            .iter()
            .map(|rule| self.view(rule))
            .collect()
    }

    fn view(&self, rule: &Rule) -> RuleView {
        let spec = rule.spec();
        RuleView {
            name: rule.name().to_owned(),
            expr: spec.expr.clone(),
            node: spec.node.clone(),
            function: spec.function.clone(),
            group_by: spec.group_by.clone(),
            provisioned: self.provisioned.get(rule.name()).is_some(),
        }
    }

    /// Creates `tenant`'s rule `name` (`POST`), or replaces it (`PUT`, `replace`), durably, and
    /// returns it.
    ///
    /// # Errors
    ///
    /// [`RulesError::Invalid`] for an invalid rule, [`RulesError::Exists`] or
    /// [`RulesError::NotFound`] when the name is taken or missing, [`RulesError::Provisioned`]
    /// for a rule of the config file, [`RulesError::Store`] when it cannot be stored.
    pub(crate) async fn put(
        &self,
        tenant: &Tenant,
        name: String,
        spec: RuleSpec,
        replace: bool,
    ) -> Result<RuleView, RulesError> {
        let rule = Arc::new(Rule::new(name.clone(), spec)?);
        let rules = self.tenant(tenant);
        let _change = rules.changes.lock().await;
        let current = rules.current();
        if self.provisioned.get(&name).is_some() {
            return Err(RulesError::Provisioned { name });
        }
        match (current.get(&name).is_some(), replace) {
            (true, false) => return Err(RulesError::Exists { name }),
            (false, true) => return Err(RulesError::NotFound { name }),
            _ => {}
        }
        let set = RuleSet::new(
            current
                .rules()
                .iter()
                .filter(|r| r.name() != name)
                .cloned()
                .chain([Arc::clone(&rule)]),
        )?;
        let json = serde_json::to_vec(rule.spec()).expect("a rule spec serializes");
        self.store.put_rule(tenant, &name, json).await?;
        self.install(&rules, set);
        info!(%rule, %tenant, replace, "rule saved");
        Ok(self.view(&rule))
    }

    /// Deletes `tenant`'s rule `name` durably.
    ///
    /// # Errors
    ///
    /// [`RulesError::NotFound`], [`RulesError::Provisioned`], or [`RulesError::Store`].
    pub(crate) async fn delete(&self, tenant: &Tenant, name: &str) -> Result<(), RulesError> {
        let rules = self.tenant(tenant);
        let _change = rules.changes.lock().await;
        let current = rules.current();
        if self.provisioned.get(name).is_some() {
            return Err(RulesError::Provisioned {
                name: name.to_owned(),
            });
        }
        if current.get(name).is_none() {
            // In a bucket, a rule made through another aggregator since the last poll is not
            // in force here yet, but the store has it: deleted there, it never comes.
            if self.store.delete_rule(tenant, name).await? {
                info!(rule = name, %tenant, "rule deleted (made elsewhere, not yet in force here)");
                return Ok(());
            }
            return Err(RulesError::NotFound {
                name: name.to_owned(),
            });
        }
        let set = RuleSet::new(current.rules().iter().filter(|r| r.name() != name).cloned())?;
        self.store.delete_rule(tenant, name).await?;
        self.install(&rules, set);
        info!(rule = name, %tenant, "rule deleted");
        Ok(())
    }

    /// Makes `set` the rule set in force for one tenant and brings its counters in line.
    fn install(&self, rules: &TenantRules, set: RuleSet) {
        let mut counters = rules.counters();
        let (series, count) = (counters.series(), rules.current().len());
        counters.sync(&set);
        self.metrics
            .series
            .add(counters.series() as i64 - series as i64);
        self.metrics.rules.add(set.len() as i64 - count as i64);
        *rules
            .current
            .write()
            .expect("rules lock: taken only to clone or swap") = Arc::new(set);
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use smolder_common::{ProfileMeta, Series, Tree};

    use super::*;
    use crate::metrics::Metrics;
    use crate::store::{BlockStore, StoreConfig, StoreMetrics};

    #[tokio::test]
    async fn each_tenant_counts_its_own_profiles_under_its_own_label() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Metrics::new();
        let store: Arc<dyn Store> = Arc::new(
            BlockStore::open(
                dir.path(),
                StoreConfig::default(),
                StoreMetrics::new(metrics.registry(), &metrics.health),
            )
            .unwrap(),
        );
        let spec = RuleSpec {
            expr: "app.cpu".to_owned(),
            group_by: vec!["tenant".to_owned()],
            ..RuleSpec::default()
        };
        let rules = Rules::load(
            &BTreeMap::from([("app_total".to_owned(), spec)]),
            store,
            true,
            RulesMetrics::new(metrics.registry(), metrics.dropped_increments.clone()),
        )
        .unwrap();
        let (a, b) = (Tenant::new("a").unwrap(), Tenant::new("b").unwrap());
        for (tenant, samples) in [(&a, 1), (&b, 2), (&a, 4)] {
            let mut tree = Tree::new();
            tree.insert_names(["main"], samples);
            let profile = Profile {
                series: Series::parse("app.cpu{tenant=forged}").unwrap(),
                meta: ProfileMeta::default(),
                from: SystemTime::now() - Duration::from_secs(10),
                until: SystemTime::now(),
                tree,
            };
            let increments = rules.evaluate(&rules.current(tenant), &[profile]);
            rules.apply(tenant, increments);
        }
        assert!(
            rules
                .render(&a)
                .contains("\napp_total{tenant=\"a\",exported_tenant=\"forged\"} 0.05\n"),
            "{}",
            rules.render(&a)
        );
        let mut pushed: Vec<(Vec<(String, String)>, f64)> = rules
            .snapshot()
            .into_iter()
            .map(|c| (c.labels, c.value))
            .collect();
        pushed.sort_by(|x, y| x.0.cmp(&y.0));
        let labels = |t: &str| {
            vec![
                ("tenant".to_owned(), t.to_owned()),
                ("exported_tenant".to_owned(), "forged".to_owned()),
            ]
        };
        assert_eq!(pushed, [(labels("a"), 0.05), (labels("b"), 0.02)]);
    }

    #[tokio::test]
    async fn increments_of_a_rule_changed_meanwhile_are_dropped_as_intended() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Metrics::new();
        let store: Arc<dyn Store> = Arc::new(
            BlockStore::open(
                dir.path(),
                StoreConfig::default(),
                StoreMetrics::new(metrics.registry(), &metrics.health),
            )
            .unwrap(),
        );
        let rules = Rules::load(
            &BTreeMap::new(),
            store,
            false,
            RulesMetrics::new(metrics.registry(), metrics.dropped_increments.clone()),
        )
        .unwrap();
        let spec = |expr: &str| RuleSpec {
            expr: expr.to_owned(),
            ..RuleSpec::default()
        };
        let anonymous = Tenant::anonymous();
        rules
            .put(&anonymous, "app_total".to_owned(), spec("app.cpu"), false)
            .await
            .unwrap();
        let mut tree = Tree::new();
        tree.insert_names(["main"], 3);
        let profile = Profile {
            series: Series::parse("app.cpu").unwrap(),
            meta: ProfileMeta::default(),
            from: SystemTime::now() - Duration::from_secs(10),
            until: SystemTime::now(),
            tree,
        };
        let increments = rules.evaluate(&rules.current(&anonymous), &[profile]);
        // The rule changes between evaluation and the store's acknowledgement.
        rules
            .put(
                &anonymous,
                "app_total".to_owned(),
                spec("app.cpu{env=\"prod\"}"),
                true,
            )
            .await
            .unwrap();
        rules.apply(&anonymous, increments);
        let text = metrics.render().unwrap();
        assert!(
            text.contains(
                "smolder_aggregator_dropped_increments_total{intentional=\"true\",reason=\"stale\",stage=\"rules\"} 1\n"
            ),
            "{text}"
        );
        assert!(
            rules.render(&anonymous).contains("\napp_total 0\n"),
            "{}",
            rules.render(&anonymous)
        );
    }
}
