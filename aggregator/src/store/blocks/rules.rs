//! Recording rules in the bucket (object-storage mode): the rules made through the API are the
//! same on every aggregator of a bucket, and outlive any aggregator's data directory.
//!
//! Input: the rules stage's changes ([`BucketRules::put`], [`BucketRules::delete`]) and the
//! bucket's listings; output: every tenant's rules for the rules stage, and a [`watch`] that
//! changes when a poll finds what another aggregator changed. Owns the bucket's rules as last
//! read, in memory, and the poll ([`run`], every `poll-interval`, the `store_shared` loop);
//! the local database's `R` prefix is not used in this mode.
//!
//! One object per rule, `shared/rules/<tenant>/<name>` (both escaped as every key under
//! `shared/` is, `keys.rs`), holding the rule as the rules stage encodes it, so that two
//! aggregators changing two rules at once lose neither. A change is answered once its object is
//! written or deleted. The same rule changed through two aggregators at once: the last write the
//! bucket took wins, and each aggregator's poll brings it in force there. A poll lists
//! `shared/rules/` and reads the objects whose version (ETag, size, Last-Modified) it has not
//! read; a rule changed here after a poll began is left as this aggregator changed it, since
//! that poll's listing may predate the change.
//!
//! At open, the rules an aggregator kept in its data directory before it used the bucket are
//! uploaded (a rule of a name the bucket has already is left out, logged) and removed from the
//! database.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use smolder_daemon::Heartbeat;
use tokio::sync::watch;
use tracing::{Instrument, error, info, warn};

use super::bucket::Bucket;
use super::files::bucket_error;
use super::keys::{escape, unescape};
use super::wal::Wal;
use crate::store::{Ack, StoreError, StoreMetrics};
use crate::tenant::Tenant;

/// Where the rules are, under the bucket's prefix.
pub(crate) const PREFIX: &str = "shared/rules/";

/// A rule: its tenant and name.
type RuleKey = (Tenant, String);

/// The bucket's recording rules as this aggregator knows them.
pub(crate) struct BucketRules {
    bucket: Arc<Bucket>,
    /// Taken briefly to read or apply; never across a request to the bucket.
    state: Mutex<State>,
    /// Bumped when a poll changes the rules.
    changed: watch::Sender<u64>,
}

#[derive(Default)]
struct State {
    rules: BTreeMap<RuleKey, Entry>,
    /// Changes made here so far.
    changes: u64,
    /// For each rule changed here, the value of `changes` after its latest change.
    changed_here: HashMap<RuleKey, u64>,
}

impl State {
    /// Rule `name` of `tenant` changed here: now `entry` (`None`: deleted); what it was.
    fn changed(&mut self, tenant: &Tenant, name: &str, entry: Option<Entry>) -> Option<Entry> {
        let key = (tenant.clone(), name.to_owned());
        self.changes += 1;
        self.changed_here.insert(key.clone(), self.changes);
        match entry {
            Some(entry) => self.rules.insert(key, entry),
            None => self.rules.remove(&key),
        }
    }
}

struct Entry {
    rule: Vec<u8>,
    /// The object's version as last listed; `None` for a rule written here since.
    version: Option<Version>,
}

/// What tells one version of an object from another in a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Version {
    e_tag: Option<String>,
    size: u64,
    modified: i64,
}

impl BucketRules {
    /// Reads the bucket's rules, after uploading those `wal` holds from before this data
    /// directory's aggregator used the bucket.
    ///
    /// # Errors
    ///
    /// When the bucket cannot be listed, read or written, or the database read.
    pub(crate) fn open(
        bucket: Arc<Bucket>,
        wal: &Wal,
        metrics: &StoreMetrics,
    ) -> Result<BucketRules, StoreError> {
        let rules = BucketRules {
            bucket,
            state: Mutex::new(State::default()),
            changed: watch::Sender::new(0),
        };
        let listing = rules.read()?;
        rules.apply(listing, metrics);
        let local = wal.all_rules()?;
        if !local.is_empty() {
            let (mut uploaded, mut kept) = (0, 0);
            for (tenant, name, rule) in &local {
                if rules
                    .state()
                    .rules
                    .contains_key(&(tenant.clone(), name.clone()))
                {
                    warn!(%tenant, rule = %name, "a recording rule of this data directory has a name the bucket's rules have already; the bucket's is kept");
                    kept += 1;
                } else {
                    rules.put(tenant, name, rule.clone())?;
                    uploaded += 1;
                }
            }
            wal.clear_rules()?;
            info!(
                uploaded,
                kept_the_buckets = kept,
                "moved the recording rules of this data directory to the bucket, where every aggregator on it reads them"
            );
        }
        Ok(rules)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .expect("bucket rules lock: taken to read or apply, never across a request")
    }

    /// Stores rule `name` of `tenant` in the bucket; in force here once this returns.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the bucket does not take it.
    pub(crate) fn put(&self, tenant: &Tenant, name: &str, rule: Vec<u8>) -> Result<(), StoreError> {
        self.bucket
            .put(&key(tenant, name), Bytes::from(rule.clone()))
            .map_err(unavailable)?;
        let entry = Entry {
            rule,
            version: None,
        };
        self.state().changed(tenant, name, Some(entry));
        Ok(())
    }

    /// Deletes rule `name` of `tenant` from the bucket; whether it existed (in the bucket, or
    /// known here).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the bucket does not take the deletion.
    pub(crate) fn delete(&self, tenant: &Tenant, name: &str) -> Result<bool, StoreError> {
        let key = key(tenant, name);
        // A rule made through another aggregator since the last poll is in the bucket, not
        // known here yet: it exists all the same.
        let stored = self.bucket.exists(&key).map_err(unavailable)?;
        self.bucket.delete(&key).map_err(unavailable)?;
        let known = self.state().changed(tenant, name, None).is_some();
        Ok(stored || known)
    }

    /// Every rule of `tenant` as (name, rule), in name order.
    pub(crate) fn rules(&self, tenant: &Tenant) -> Vec<(String, Vec<u8>)> {
        self.state()
            .rules
            .iter()
            .filter(|((t, _), _)| t == tenant)
            .map(|((_, name), entry)| (name.clone(), entry.rule.clone()))
            .collect()
    }

    /// Every tenant with a rule, in id order.
    pub(crate) fn tenants(&self) -> Vec<Tenant> {
        let tenants: BTreeSet<Tenant> = self.state().rules.keys().map(|(t, _)| t.clone()).collect();
        tenants.into_iter().collect()
    }

    /// A receiver that changes whenever a poll finds rules changed through another aggregator.
    pub(crate) fn watch(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// One poll; see the [module documentation](self). Whether it changed any rule.
    ///
    /// # Errors
    ///
    /// When the bucket cannot be listed or an object read.
    pub(crate) fn poll(&self, metrics: &StoreMetrics) -> Result<bool, StoreError> {
        let started = Instant::now();
        let listing = self.read()?;
        let changed = self.apply(listing, metrics);
        if changed > 0 {
            metrics.shared_rule_changes.inc_by(changed);
            info!(rules = changed, "recording rules changed in the bucket");
            self.changed.send_modify(|n| *n += 1);
        }
        metrics
            .shared_poll_duration
            .observe(started.elapsed().as_secs_f64());
        Ok(changed > 0)
    }

    /// Lists the bucket's rules and reads those whose version is not the one read last.
    fn read(&self) -> Result<Listing, StoreError> {
        let (since, known) = {
            let state = self.state();
            let known: HashMap<RuleKey, Version> = state
                .rules
                .iter()
                .filter_map(|(key, entry)| Some((key.clone(), entry.version.clone()?)))
                .collect();
            (state.changes, known)
        };
        let mut rules = BTreeMap::new();
        for object in self.bucket.list(PREFIX).map_err(bucket_error)? {
            let Some(name) = self.bucket.key(&object.location) else {
                continue;
            };
            let Some(rule) = parse_key(name) else {
                warn!(object = name, "not a recording rule's key; left alone");
                continue;
            };
            let version = Version {
                e_tag: object.e_tag.clone(),
                size: object.size,
                modified: object.last_modified.timestamp_millis(),
            };
            let read = if known.get(&rule) == Some(&version) {
                None
            } else {
                match self.bucket.get(name) {
                    Ok(bytes) => Some(bytes.to_vec()),
                    // Deleted since the listing.
                    Err(err) if err.not_found() => continue,
                    Err(err) => return Err(bucket_error(err)),
                }
            };
            rules.insert(rule, (version, read));
        }
        Ok(Listing { since, rules })
    }

    /// Makes `listing` the rules known here, but for those changed here since it began; how
    /// many rules it changed.
    fn apply(&self, listing: Listing, metrics: &StoreMetrics) -> u64 {
        let Listing { since, mut rules } = listing;
        let mut state = self.state();
        let mut changed = 0u64;
        let keys: BTreeSet<RuleKey> = state.rules.keys().chain(rules.keys()).cloned().collect();
        for key in keys {
            if state.changed_here.get(&key).is_some_and(|at| *at > since) {
                // Changed here after the listing began, which may not show it.
                continue;
            }
            match rules.remove(&key) {
                None => changed += u64::from(state.rules.remove(&key).is_some()),
                Some((version, None)) => {
                    if let Some(entry) = state.rules.get_mut(&key) {
                        entry.version = Some(version);
                    }
                }
                Some((version, Some(rule))) => {
                    let same = state.rules.get(&key).is_some_and(|e| e.rule == rule);
                    changed += u64::from(!same);
                    state.rules.insert(
                        key,
                        Entry {
                            rule,
                            version: Some(version),
                        },
                    );
                }
            }
        }
        state.changed_here.retain(|_, at| *at > since);
        metrics.shared_rules.set(state.rules.len() as i64);
        changed
    }
}

/// What one listing of the bucket's rules found.
struct Listing {
    /// The count of changes made here when it began.
    since: u64,
    /// Each listed rule's version, and its bytes when that version had not been read.
    rules: BTreeMap<RuleKey, (Version, Option<Vec<u8>>)>,
}

/// Starts the `store_shared` loop on the current tokio runtime: [`run`], beating the health
/// of `metrics`.
pub(crate) fn start(
    rules: &Arc<BucketRules>,
    interval: Duration,
    metrics: &StoreMetrics,
) -> tokio::task::JoinHandle<()> {
    let beat = metrics
        .health
        .register("store_shared", interval.max(super::MAINTENANCE_PERIOD));
    tokio::spawn(
        run(Arc::clone(rules), interval, beat, metrics.clone())
            .instrument(tracing::info_span!("store_shared")),
    )
}

/// A change of the rules as the store's answer: `change` run on the blocking pool (it waits for
/// the bucket).
pub(crate) fn blocking<T: Send + 'static>(
    change: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Ack<T> {
    Box::pin(async move {
        tokio::task::spawn_blocking(change)
            .await
            .map_err(|_| StoreError::Closed)?
    })
}

/// Polls `rules` every `interval` for as long as the server runs, beating `beat`; a failed
/// poll is counted, and marks the loop degraded until one succeeds.
async fn run(rules: Arc<BucketRules>, interval: Duration, beat: Heartbeat, metrics: StoreMetrics) {
    // The first poll is one interval away: `BucketRules::open` has just read the rules.
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        beat.beating(ticker.tick()).await;
        let (rules, poll_metrics) = (Arc::clone(&rules), metrics.clone());
        match tokio::task::spawn_blocking(move || rules.poll(&poll_metrics)).await {
            Ok(Ok(_)) => beat.beat(),
            Ok(Err(err)) => {
                metrics.shared_poll_failures.inc();
                warn!(error = %err, "polling the bucket's recording rules failed; retrying at the next interval");
                beat.degraded(format!("polling the bucket's recording rules: {err}"));
            }
            Err(err) => {
                error!(error = %err, "a poll of the bucket's recording rules panicked");
                metrics.shared_poll_failures.inc();
                beat.degraded(format!(
                    "a poll of the bucket's recording rules panicked: {err}"
                ));
            }
        }
    }
}

fn unavailable(err: super::bucket::RequestError) -> StoreError {
    StoreError::Unavailable {
        reason: err.to_string(),
    }
}

/// The object key of rule `name` of `tenant`.
fn key(tenant: &Tenant, name: &str) -> String {
    format!("{PREFIX}{}/{}", escape(tenant.as_str()), escape(name))
}

/// The tenant and name of a rule's object key; `None` for another key.
fn parse_key(key: &str) -> Option<RuleKey> {
    let (tenant, name) = key.strip_prefix(PREFIX)?.split_once('/')?;
    let tenant = Tenant::new(&unescape(tenant)?).ok()?;
    Some((tenant, unescape(name)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    #[test]
    fn keys_escape_and_parse_back() {
        let tenant = Tenant::new("team.a*(1)").unwrap();
        let key = key(&tenant, "app:cpu_seconds_total");
        assert_eq!(key, "shared/rules/team.a=2A=281=29/app=3Acpu_seconds_total");
        assert_eq!(
            parse_key(&key),
            Some((tenant, "app:cpu_seconds_total".to_owned()))
        );
        for bad in [
            "shared/rules/a",
            "shared/rules/a/b=4",
            "shared/rules/a/b=ZZ",
            "shared/rules/=FF/b",
            "shared/rules/a/b=2Ec",
            "shared/rules/a/b/c",
            "shared/rules/=2E=2E/b",
            "shared/other/a/b",
        ] {
            assert_eq!(parse_key(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_poll_brings_in_other_aggregators_changes_and_keeps_a_change_made_since() {
        let bucket = Arc::new(Bucket::in_memory());
        let dir = tempfile::tempdir().unwrap();
        let wal = Wal::open(dir.path()).unwrap();
        let tenant = Tenant::anonymous();
        wal.put_rule(&tenant, "local_total", b"local").unwrap();
        let metrics = Metrics::new();
        let metrics = StoreMetrics::new(metrics.registry(), &metrics.health);
        let here = BucketRules::open(Arc::clone(&bucket), &wal, &metrics).unwrap();
        assert!(wal.all_rules().unwrap().is_empty(), "moved to the bucket");
        let other = BucketRules::open(Arc::clone(&bucket), &wal, &metrics).unwrap();
        assert_eq!(
            other.rules(&tenant),
            [("local_total".into(), b"local".to_vec())]
        );

        let changes = here.watch();
        other.put(&tenant, "a_total", b"a".to_vec()).unwrap();
        other
            .put(&tenant, "local_total", b"changed".to_vec())
            .unwrap();
        assert!(here.poll(&metrics).unwrap());
        assert!(changes.has_changed().unwrap());
        assert_eq!(
            here.rules(&tenant),
            [
                ("a_total".into(), b"a".to_vec()),
                ("local_total".into(), b"changed".to_vec())
            ]
        );
        assert!(!here.poll(&metrics).unwrap(), "nothing new");
        assert!(other.delete(&tenant, "a_total").unwrap());
        assert!(here.poll(&metrics).unwrap());
        assert_eq!(here.rules(&tenant).len(), 1);
        assert_eq!(here.tenants(), std::slice::from_ref(&tenant));

        // Changes made here while a poll runs are not undone by that poll's older listing.
        let listing = here.read().unwrap();
        here.put(&tenant, "new_total", b"n".to_vec()).unwrap();
        here.delete(&tenant, "local_total").unwrap();
        assert_eq!(here.apply(listing, &metrics), 0);
        assert_eq!(here.rules(&tenant), [("new_total".into(), b"n".to_vec())]);
        assert!(other.poll(&metrics).unwrap());
        assert_eq!(other.rules(&tenant), here.rules(&tenant));
    }
}
