//! App deletions (`DELETE /api/apps`): one rule that every reader applies alike, in both modes.
//!
//! A deletion is (tenant, app, horizon): the horizon is the deletion's time rounded up to the
//! next 10 s bucket ([`horizon`]), and the deletion removes every sample of that app of that
//! tenant whose bucket starts before it, wherever and whenever that data is stored or arrives
//! (a spool's backlog with older timestamps arriving later is removed too); data stamped from
//! the horizon on shows. Of several deletions of one app the latest horizon wins.
//!
//! - **Heads** (own, remote, segments read back): a record's profiles of the app before the
//!   horizon are dropped when the deletion is learnt and whenever such records arrive later
//!   ([`Deletions::filter`], [`Head::delete`](super::head::Head::delete)).
//! - **Blocks**: a cut or a merge leaves the app's buckets before the horizon out and lists the
//!   deletion in the block (its optional deletions section, `smolder_block::Deletion`). A read
//!   hides an app in a block wholesale when the block starts before the horizon and does not
//!   list a deletion of that app at least as late ([`hides`]); otherwise the block is read as it
//!   is, its builder having dropped what had to go. A block's listing also teaches the store
//!   the deletion. So every aggregator shows the same, in whatever order it learnt things.
//! - **Where deletions live**: local mode, the head's database (`wal.rs`, prefix `D`); object
//!   storage, the bucket: `shared/deletions/<tenant>/<app>/<horizon>`, one object per deletion
//!   (a second deletion of an app adds an object rather than overwriting one, so that two
//!   aggregators deleting at once never lose the later horizon without compare-and-swap), its
//!   name all a reader needs (one LIST per poll of `sync.rs`, no GET), its body saying when and
//!   which writer. Tenant ids and app names are escaped as in every key under `shared/`
//!   (`keys.rs`).
//! - **Making one**: local mode, on the writer thread (the database's fsync, like a write's);
//!   object storage, [`store`] writes the object on the blocking pool within `upload-timeout`,
//!   and only then does the writer learn and apply it, so that no write waits behind a slow
//!   bucket.
//! - **Forgetting**: once the horizon is past the retention and no block starts before it,
//!   nothing the deletion could remove is left ([`Deletions::expired`]): every aggregator forgets
//!   it (the writer's retention pass), and a compactor's retention task deletes its object, and
//!   those superseded by a later horizon ([`prune`], on the blocking pool).
//!
//! Input: deletions made here, listed in the bucket or in blocks; output: the [`Deletions`] in
//! the store's state that the writer, cuts, compaction and reads apply. Pure but for
//! [`Listing::list`], [`put`], [`store`] and [`prune`], which the sync loop, the store's
//! deletion and a compactor's retention task call, never the writer thread.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use smolder_block::Deletion;
use smolder_common::Series;
use tracing::{info, warn};

use super::bucket::{Bucket, RequestError};
use super::files::{BlockFile, BlockSet};
use super::keys::{escape, unescape};
use super::uploads::BucketMode;
use super::wal::Record;
use super::{Shared, State};
use crate::store::{BUCKET, StoreError};
use crate::tenant::Tenant;

/// Where deletions are, under the bucket's prefix.
pub(crate) const PREFIX: &str = "shared/deletions/";

/// The horizon of a deletion made at `millis` (Unix ms): rounded up to the next 10 s bucket,
/// so that the bucket the deletion falls in goes whole.
pub(crate) fn horizon(millis: u64) -> u64 {
    millis.div_ceil(BUCKET * 1_000) * BUCKET
}

/// Whether a read hides an app wholesale in a block starting at `start` that lists a deletion
/// of that app with horizon `listed` (if any), given the latest known horizon `horizon`: the
/// block was built before that deletion was known, and may hold any of the app's older data.
pub(crate) fn hides(start: u64, listed: Option<u64>, horizon: u64) -> bool {
    start < horizon && listed.is_none_or(|listed| listed < horizon)
}

/// The deletions a store knows: per (tenant, app), the latest horizon.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Deletions {
    horizons: BTreeMap<(Tenant, String), u64>,
}

impl Deletions {
    /// The horizon of the deletion of `app` of `tenant`, if any.
    pub(crate) fn horizon(&self, tenant: &Tenant, app: &str) -> Option<u64> {
        self.horizons
            .get(&(tenant.clone(), app.to_owned()))
            .copied()
    }

    /// Learns a deletion; whether it is new or later than the one known.
    pub(crate) fn learn(&mut self, tenant: &Tenant, app: &str, horizon: u64) -> bool {
        if self.horizon(tenant, app).unwrap_or(0) >= horizon {
            return false;
        }
        self.horizons
            .insert((tenant.clone(), app.to_owned()), horizon);
        true
    }

    /// Learns the deletions `block` lists; returns those that were new or later.
    pub(crate) fn learn_block(&mut self, block: &BlockFile) -> Vec<(Tenant, String, u64)> {
        let tenant = &block.name.tenant;
        block
            .deletions
            .iter()
            .filter(|d| self.learn(tenant, &d.app, d.horizon))
            .map(|d| (tenant.clone(), d.app.clone(), d.horizon))
            .collect()
    }

    /// How many deletions are known.
    pub(crate) fn len(&self) -> usize {
        self.horizons.len()
    }

    /// Every deletion: tenant, app, horizon.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&Tenant, &str, u64)> {
        self.horizons
            .iter()
            .map(|((tenant, app), horizon)| (tenant, app.as_str(), *horizon))
    }

    /// The deletions of `tenant` a block starting at `start` is built with: those whose horizon
    /// is past its start (the others remove nothing there).
    pub(crate) fn for_block(&self, tenant: &Tenant, start: u64) -> Vec<Deletion> {
        self.iter()
            .filter(|(t, _, horizon)| *t == tenant && *horizon > start)
            .map(|(_, app, horizon)| Deletion {
                app: app.to_owned(),
                horizon,
            })
            .collect()
    }

    /// Whether a deletion removes bucket `bucket` of `app` of `tenant`.
    pub(crate) fn removes(&self, tenant: &Tenant, app: &str, bucket: u64) -> bool {
        self.horizon(tenant, app).is_some_and(|h| bucket < h)
    }

    /// Drops `record`'s profiles that a deletion removes; returns how many.
    pub(crate) fn filter(&self, record: &mut Record) -> usize {
        if self.horizons.is_empty() {
            return 0;
        }
        let before = record.profiles.len();
        let tenant = record.tenant.clone();
        record
            .profiles
            .retain(|p| !self.removes(&tenant, p.profile.series.app(), p.bucket));
        before - record.profiles.len()
    }

    /// Whether deletions remove all of a record: `apps` are its apps with their newest bucket.
    pub(crate) fn removes_all(&self, tenant: &Tenant, apps: &[(String, u64)]) -> bool {
        apps.iter()
            .all(|(app, newest)| self.removes(tenant, app, *newest))
    }

    /// The apps of `block` that reads hide ([`hides`]); only apps it has series of.
    pub(crate) fn hidden_in(&self, block: &BlockFile) -> BTreeSet<String> {
        let tenant = &block.name.tenant;
        self.iter()
            .filter(|(t, app, horizon)| {
                *t == tenant
                    && hides(block.name.start, block.listed(app), *horizon)
                    && !block
                        .index
                        .postings(smolder_common::series::NAME_LABEL, app)
                        .is_empty()
            })
            .map(|(_, app, _)| app.to_owned())
            .collect()
    }

    /// Sets which apps each block of `set` hides.
    pub(crate) fn mark(&self, set: &mut BlockSet) {
        let hidden = set
            .candidates()
            .map(|block| (block.name.id.clone(), self.hidden_in(block)))
            .filter(|(_, apps)| !apps.is_empty())
            .collect();
        set.hidden = hidden;
    }

    /// Whether nothing a deletion of `tenant` with `horizon` removes can be left: the horizon
    /// is at or before `cutoff` (retention's) and no block of `set` starts before it.
    pub(crate) fn expired(set: &BlockSet, tenant: &Tenant, horizon: u64, cutoff: u64) -> bool {
        horizon <= cutoff
            && !set
                .candidates()
                .any(|b| b.name.tenant == *tenant && b.name.start < horizon)
    }

    /// Forgets the deletions [`Deletions::expired`] says remove nothing any more; returns them.
    pub(crate) fn forget_expired(
        &mut self,
        set: &BlockSet,
        cutoff: u64,
    ) -> Vec<(Tenant, String, u64)> {
        let expired: Vec<(Tenant, String, u64)> = self
            .iter()
            .filter(|(tenant, _, horizon)| Deletions::expired(set, tenant, *horizon, cutoff))
            .map(|(tenant, app, horizon)| (tenant.clone(), app.to_owned(), horizon))
            .collect();
        for (tenant, app, _) in &expired {
            self.horizons.remove(&(tenant.clone(), app.clone()));
        }
        expired
    }
}

/// Applies deletions just learnt (new, or later than known; `learnt` names them) to the heads
/// in `state`, own and remote: their profiles the deletions remove are dropped, and a
/// compaction planned before is not published (the generation changes). The caller marks the
/// blocks again ([`Deletions::mark`]). Returns the series that lost data.
pub(crate) fn apply(state: &mut State, learnt: &[(Tenant, String, u64)]) -> BTreeSet<Series> {
    let mut touched = BTreeSet::new();
    for (tenant, app, _) in learnt {
        let Some(horizon) = state.deletions.horizon(tenant, app) else {
            continue;
        };
        touched.extend(state.head.delete(tenant, app, horizon));
        touched.extend(state.remote.delete(tenant, app, horizon));
        info!(tenant = %tenant.as_str(), app, horizon, "app deletion applied");
    }
    if !learnt.is_empty() {
        state.generation += 1;
    }
    touched
}

/// The bucket key of the deletion of `app` of `tenant` with `horizon`.
pub(crate) fn key(tenant: &Tenant, app: &str, horizon: u64) -> String {
    format!(
        "{PREFIX}{}/{}/{horizon}",
        escape(tenant.as_str()),
        escape(app)
    )
}

/// The (tenant, app, horizon) a bucket key names; `None` for a key that is not a deletion's.
pub(crate) fn parse_key(key: &str) -> Option<(Tenant, String, u64)> {
    let mut parts = key.strip_prefix(PREFIX)?.split('/');
    let tenant = Tenant::new(&unescape(parts.next()?)?).ok()?;
    let app = unescape(parts.next()?)?;
    let horizon = parts.next()?.parse().ok()?;
    if parts.next().is_some() {
        return None;
    }
    Some((tenant, app, horizon))
}

/// One deletion listed in the bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Listed {
    pub(crate) key: String,
    pub(crate) tenant: Tenant,
    pub(crate) app: String,
    pub(crate) horizon: u64,
}

/// The sync loop's listing of the bucket's deletions (`sync.rs`).
#[derive(Default)]
pub(crate) struct Listing {
    /// Keys under [`PREFIX`] that name no deletion, logged once each.
    ignored: BTreeSet<String>,
}

impl Listing {
    /// Every deletion in the bucket: one LIST. Keys that name none are logged once and left
    /// alone.
    ///
    /// # Errors
    ///
    /// When the listing fails.
    pub(crate) fn list(&mut self, bucket: &Bucket) -> Result<Vec<Listed>, RequestError> {
        let mut out = Vec::new();
        for object in bucket.list(PREFIX)? {
            let Some(key) = bucket.key(&object.location) else {
                continue;
            };
            match parse_key(key) {
                Some((tenant, app, horizon)) => out.push(Listed {
                    key: key.to_owned(),
                    tenant,
                    app,
                    horizon,
                }),
                None => {
                    if self.ignored.insert(key.to_owned()) {
                        warn!(object = %key, "not an app deletion; left alone");
                    }
                }
            }
        }
        Ok(out)
    }
}

/// Stores the deletion of `app` of `tenant` with `horizon` in the bucket, made at `millis` by
/// `writer`: durable once this returns. Within `deadline` when one is given, retries included
/// (past it the object may be written all the same, and is then learnt at a poll), else with
/// object_store's retries (up to three request timeouts).
///
/// # Errors
///
/// When the bucket refuses the write or does not answer in time.
pub(crate) fn put(
    bucket: &Bucket,
    tenant: &Tenant,
    app: &str,
    horizon: u64,
    millis: u64,
    writer: &str,
    deadline: Option<Duration>,
) -> Result<(), RequestError> {
    let body = serde_json::json!({
        "tenant": tenant.as_str(),
        "app": app,
        "horizon": horizon,
        "deleted": millis,
        "writer": writer,
    });
    let key = key(tenant, app, horizon);
    let body = bytes::Bytes::from(body.to_string());
    match deadline {
        Some(deadline) => bucket.put_within(&key, body, deadline),
        None => bucket.put(&key, body),
    }
}

/// What deleting `app` of `tenant` at `millis` (Unix ms) takes, as `state` stands: its horizon,
/// never earlier than one known (a clock set back: the latest horizon wins), and the series
/// with data before it ([`deletable`]; none: nothing to delete, and nothing is stored).
pub(crate) fn plan(
    state: &State,
    tenant: &Tenant,
    app: &str,
    millis: u64,
) -> (u64, BTreeSet<Series>) {
    let known = state.deletions.horizon(tenant, app).unwrap_or(0);
    let horizon = horizon(millis).max(known);
    (horizon, deletable(state, tenant, app, horizon))
}

/// The series of `app` of `tenant` that a deletion with `horizon` takes data from in `state`:
/// in the heads, and in the shown blocks that start before it and whose series of the app are
/// not hidden already.
pub(crate) fn deletable(
    state: &State,
    tenant: &Tenant,
    app: &str,
    horizon: u64,
) -> BTreeSet<Series> {
    let mut series = state.head.deletable(tenant, app, horizon);
    series.extend(state.remote.head.deletable(tenant, app, horizon));
    let blocks = &state.blocks;
    for block in blocks.overlapping(tenant, 0, horizon) {
        if blocks.hides(&block.name.id, app) {
            continue;
        }
        let positions = block
            .index
            .postings(smolder_common::series::NAME_LABEL, app);
        series.extend(
            positions
                .iter()
                .map(|&p| &block.index.series()[p as usize])
                .filter(|entry| entry.first_bucket < horizon)
                .map(|entry| entry.series.clone()),
        );
    }
    series
}

/// Object-storage mode: deletes `app` of `tenant` as of `now` in the bucket ([`plan`], then
/// [`put`] within `upload-timeout`), on the calling thread, which must not be the writer's
/// (every write would wait behind a slow bucket); the caller then has the writer learn it.
/// Returns the horizon and how many series lose data here; `None` when none does (nothing is
/// stored).
///
/// # Errors
///
/// [`StoreError::Unavailable`] when the bucket does not take the object within
/// `upload-timeout`.
pub(crate) fn store(
    shared: &Shared,
    mode: &BucketMode,
    tenant: &Tenant,
    app: &str,
    now: SystemTime,
) -> Result<Option<(u64, u64)>, StoreError> {
    let millis = super::sync::unix_millis(now);
    let (horizon, series) = plan(&shared.state(), tenant, app, millis);
    if series.is_empty() {
        return Ok(None);
    }
    let deadline = Some(mode.upload_timeout);
    put(
        &mode.bucket,
        tenant,
        app,
        horizon,
        millis,
        &mode.writer,
        deadline,
    )
    .map_err(|err| StoreError::Unavailable {
        reason: format!("{err}: {}", err.source),
    })?;
    Ok(Some((horizon, series.len() as u64)))
}

/// A compactor's clean-up of the bucket's deletions: deletes the objects of those that remove
/// nothing any more ([`Deletions::expired`] as of `cutoff`) and of those a later horizon of the
/// same app supersedes. Returns how many went; a failure is logged and tried again next time.
///
/// # Errors
///
/// When the listing fails.
pub(crate) fn prune(bucket: &Bucket, set: &BlockSet, cutoff: u64) -> Result<u64, RequestError> {
    let listed = Listing::default().list(bucket)?;
    let mut latest: BTreeMap<(&Tenant, &str), u64> = BTreeMap::new();
    for l in &listed {
        let known = latest.entry((&l.tenant, l.app.as_str())).or_insert(0);
        *known = (*known).max(l.horizon);
    }
    let mut pruned = 0;
    for l in &listed {
        let superseded = latest[&(&l.tenant, l.app.as_str())] > l.horizon;
        if !superseded && !Deletions::expired(set, &l.tenant, l.horizon, cutoff) {
            continue;
        }
        match bucket.delete(&l.key) {
            Ok(()) => {
                pruned += 1;
                info!(tenant = %l.tenant.as_str(), app = %l.app, horizon = l.horizon, superseded, "app deletion forgotten in the bucket");
            }
            Err(err) => {
                warn!(object = %l.key, error = %err, "deleting an app deletion that removes nothing any more failed; trying again later");
            }
        }
    }
    Ok(pruned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant() -> Tenant {
        Tenant::new("team-a").unwrap()
    }

    #[test]
    fn the_horizon_is_the_deletion_time_rounded_up_to_a_bucket() {
        assert_eq!(horizon(1_700_000_000_000), 1_700_000_000);
        assert_eq!(horizon(1_700_000_000_001), 1_700_000_010);
        assert_eq!(horizon(1_700_000_009_999), 1_700_000_010);
    }

    #[test]
    fn a_deletion_drops_the_buckets_before_its_horizon_the_latest_winning() {
        let mut deletions = Deletions::default();
        assert!(deletions.learn(&tenant(), "app.cpu", 1_000));
        assert!(
            !deletions.learn(&tenant(), "app.cpu", 900),
            "an earlier one"
        );
        assert!(deletions.learn(&tenant(), "app.cpu", 1_100));
        assert!(!deletions.learn(&tenant(), "app.cpu", 1_100));
        assert!(
            !deletions.learn(&tenant(), "other.cpu", 0),
            "removes nothing"
        );
        assert_eq!(deletions.len(), 1);
        assert!(deletions.removes(&tenant(), "app.cpu", 1_090));
        assert!(!deletions.removes(&tenant(), "app.cpu", 1_100));
        assert!(!deletions.removes(&tenant(), "other.cpu", 0));
        let other = Tenant::new("team-b").unwrap();
        assert!(!deletions.removes(&other, "app.cpu", 0), "tenants apart");
        assert!(deletions.removes_all(&tenant(), &[("app.cpu".into(), 1_090)]));
        assert!(!deletions.removes_all(
            &tenant(),
            &[("app.cpu".into(), 1_090), ("other.cpu".into(), 0)]
        ));
        assert!(deletions.removes_all(&tenant(), &[]), "nothing left");
        assert_eq!(deletions.for_block(&tenant(), 1_000).len(), 1);
        assert!(deletions.for_block(&tenant(), 1_100).is_empty());
        assert!(deletions.for_block(&other, 0).is_empty());
    }

    #[test]
    fn a_read_hides_an_app_wholesale_only_in_blocks_built_before_its_deletion() {
        // A block starting at or after the horizon holds only data that stays.
        assert!(!hides(1_000, None, 1_000));
        // Before it and built without the deletion: hidden whole.
        assert!(hides(0, None, 1_000));
        // Built with it, or with a later one: read as it is.
        assert!(!hides(0, Some(1_000), 1_000));
        assert!(!hides(0, Some(2_000), 1_000));
        // Built with an earlier deletion only: hidden whole.
        assert!(hides(0, Some(900), 1_000));
    }

    #[test]
    fn app_names_round_trip_through_keys() {
        let starred = Tenant::new("team.a*(1)").unwrap();
        for tenant in [tenant(), starred.clone()] {
            for app in [
                "checkout.cpu",
                "a_b-c.d",
                ".",
                "..",
                "a+b",
                "a=b",
                "a/b",
                "ü",
                "%2E",
            ] {
                let key = key(&tenant, app, 1_230);
                for segment in key.split('/').skip(2).take(2) {
                    assert!(
                        segment
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"_-.=".contains(&b)),
                        "{key}"
                    );
                    assert!(!segment.bytes().all(|b| b == b'.'), "{key}");
                }
                assert_eq!(
                    parse_key(&key),
                    Some((tenant.clone(), app.to_owned(), 1_230))
                );
            }
        }
        assert_eq!(
            key(&tenant(), "checkout.cpu", 10),
            "shared/deletions/team-a/checkout.cpu/10"
        );
        // object_store would have written `*` as `%2A`, which no tenant id holds.
        assert_eq!(
            key(&starred, "..", 10),
            "shared/deletions/team.a=2A=281=29/=2E=2E/10"
        );
        for bad in [
            "shared/deletions/team-a/app.cpu",
            "shared/deletions/team-a/app.cpu/x",
            "shared/deletions/team-a/app.cpu/10/more",
            "shared/deletions/no tenant/app.cpu/10",
            "shared/deletions/team%2Aa/app.cpu/10",
            "shared/deletions/team-a/=zz/10",
            "shared/deletions/team-a/app=2Ecpu/10",
            "shared/deletions/team-a//10",
            "shared/rules/team-a/app.cpu/10",
        ] {
            assert_eq!(parse_key(bad), None, "{bad}");
        }
    }
}
