//! The store: where profiles live, behind one interface, [`Store`].
//!
//! Input: [`Profile`]s from ingest (with the trees of the spans their samples ran in), app
//! deletions from admin, recording rules from rules; each write answered once durable. Output:
//! series, merged trees (of whole series, or of given spans), timelines, label listings, apps
//! and stored rules for query and rules. Callers: `ingest`, `query`, `rules` and `admin`, which
//! hold an `Arc<dyn Store>` and nothing else of this module's internals; `app`, which opens the
//! backend, starts its maintenance and closes it.
//!
//! # The interface
//!
//! [`Store`] is a trait object, shaped by what the stages ask, not by how a backend stores it.
//! Its backend is the block store ([`BlockStore`], `blocks/`): a head for recent writes and
//! immutable blocks (`smolder-block`) in a local directory or in an S3 bucket that several
//! aggregators share.
//!
//! - Every call names a [`Tenant`]; the store keeps each tenant's data apart (its own head
//!   ranges and blocks).
//! - **Writes** ([`Store::write`], [`Store::delete_app`], [`Store::put_rule`],
//!   [`Store::delete_rule`]) return an [`Ack`]: a `'static` future that queues the write when
//!   first polled and resolves once it is durable (fsynced locally; in the bucket, for a store
//!   whose truth is object storage, where recording rules are shared by every aggregator on
//!   it and [`Store::rule_changes`] says when another changed them). Writes are applied in
//!   order by one writer, except recording rules on object storage, which go to the bucket
//!   directly (there the bucket orders them, for every aggregator on it); an agent batch's
//!   write carries its [`BatchMarker`], (agent id, sequence), and is stored at most once.
//! - **Reads** are synchronous and run on the caller's thread: the stages call them on tokio's
//!   blocking pool, where a merge of a million nodes belongs anyway. They take a [`Selector`],
//!   not a list of series from an earlier call: a block store answers a selector from each
//!   block's own postings, and a handle minted by one read would tie the next to that read's
//!   view of the index.
//! - Nothing of sled or of the blocks shows: no keys, no `sled::Error` (its failures are
//!   [`StoreError::Engine`] with the cause as a source), no block type.
//!
//! Async functions are not dyn-compatible; boxed futures are, and the reads being synchronous
//! keeps them free of that cost.
//!
//! # What lives here
//!
//! - `plan.rs` — the pure planning: buckets, head ranges and cuts, compaction, downsampling,
//!   retention, timelines.
//! - `blocks/` — the block store, [`BlockStore`]: head, blocks, writer, compaction, migration
//!   of a v0.1 data directory, and its object-storage mode.
//! - `check.rs` — `smolder-aggregator check`: every block verified.
//! - `disk.rs` — the data directory: its lock and its filesystem's free space.
//! - `limits.rs` — a read's limits (cancellation, series per read), set by the caller around
//!   the read and checked by the read loops.
//! - `metrics.rs` — `smolder_aggregator_store_*`.

mod blocks;
mod check;
mod disk;
mod limits;
mod metrics;
mod plan;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use smolder_common::{Profile, ProfileMeta, Selector, Series, SpanId, SpanTrees, Tree};

use crate::tenant::Tenant;

pub(crate) use self::blocks::BlockStore;
pub use self::blocks::{Compactor, LocalConfig, ObjectStoreConfig, S3Config};
pub use self::check::CheckReport;
pub(crate) use self::check::check;
pub(crate) use self::limits::{ReadLimits, with_limits};
pub(crate) use self::metrics::StoreMetrics;
pub(crate) use self::plan::BUCKET;

/// Where profiles are kept and for how long.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct StoreConfig {
    /// Profiles older than this are deleted. Default `30d`.
    #[serde(with = "smolder_common::timestamp::serde_duration")]
    pub retention: Duration,
    /// How often retention runs. Default `1m`.
    #[serde(with = "smolder_common::timestamp::serde_duration")]
    pub retention_interval: Duration,
    /// When the store (blocks and head) grows past this many bytes on disk, the oldest blocks
    /// are deleted as well, whole, until it fits. 0, the default, sets no limit.
    pub max_disk_bytes: u64,
    /// Memory for decoded block data kept between queries (each series' shape and tree table
    /// per block), in bytes. Default 256 MiB.
    pub cache_bytes: u64,
    /// Memory the head may hold (writes not yet in blocks, estimated), in bytes. A head range
    /// is cut into a block once it closes (about 17 min); past this, the largest open ranges
    /// are cut early, their writes so far making blocks of their own, so that the head, and
    /// what a restart replays, stay bounded under any load. Default 512 MiB.
    pub head_max_bytes: u64,
    /// How often compaction runs: closed ranges' blocks merged (about 17 min → 2.8 h → 28 h)
    /// and old data downsampled. Default `1m`.
    #[serde(with = "smolder_common::timestamp::serde_duration")]
    pub compaction_interval: Duration,
    /// Data older than this keeps only 100 s resolution (and its rollups). Default `0s`: never.
    #[serde(with = "smolder_common::timestamp::serde_duration")]
    pub downsample_to_100s_after: Duration,
    /// Data older than this keeps only 1000 s resolution. Default `0s`: never.
    #[serde(with = "smolder_common::timestamp::serde_duration")]
    pub downsample_to_1000s_after: Duration,
    /// The most span trees one series keeps per 10 s bucket (span profiles, from samples
    /// labelled `span_id`); spans past it are dropped from the span index, the largest kept,
    /// their samples still in the series' profile, and counted in
    /// `smolder_aggregator_dropped_spans_total`. 0 keeps no span profiles. Default 1000: every
    /// sample of a process using one CPU at 100 Hz in a span of its own.
    pub max_spans_per_bucket: usize,
    /// Where blocks are kept: `type: local` (a directory, by default `<data-dir>/blocks`), or
    /// `type: s3` (a bucket several aggregators may share; ARCHITECTURE.md, "Object storage and
    /// several aggregators").
    pub object_store: ObjectStoreConfig,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            retention: Duration::from_secs(30 * 86_400),
            retention_interval: Duration::from_secs(60),
            max_disk_bytes: 0,
            cache_bytes: 256 << 20,
            head_max_bytes: 512 << 20,
            compaction_interval: Duration::from_secs(60),
            downsample_to_100s_after: Duration::ZERO,
            downsample_to_1000s_after: Duration::ZERO,
            max_spans_per_bucket: 1000,
            object_store: ObjectStoreConfig::default(),
        }
    }
}

impl StoreConfig {
    /// The smallest `head-max-bytes`: below it every cut pass would cut the open ranges, making
    /// blocks of a few writes each.
    const MIN_HEAD_BYTES: u64 = 16 << 20;

    /// Checks the values the store cannot work with.
    ///
    /// # Errors
    ///
    /// `store.head-max-bytes` below 16 MiB, named.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.head_max_bytes >= Self::MIN_HEAD_BYTES,
            "store.head-max-bytes is {}; it must be at least {} (16 MiB): below it every cut pass would cut the open head ranges into blocks of a few writes",
            self.head_max_bytes,
            Self::MIN_HEAD_BYTES
        );
        Ok(())
    }
}

/// Why the store could not do what was asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum StoreError {
    /// Another process holds the data directory's lock.
    #[error(
        "data directory {path} is in use by another aggregator (lock file {path}/LOCK is held)"
    )]
    Locked {
        /// The data directory.
        path: PathBuf,
    },
    /// The data directory or its lock file could not be created or opened.
    #[error("cannot use data directory {path}")]
    Io {
        /// The path that failed.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The storage engine failed (I/O error, or its own files are damaged).
    #[error("storage engine failed")]
    Engine {
        /// What the engine said.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Writes were applied but could not be made durable; none of them is acknowledged.
    #[error("flushing to disk failed: {reason}")]
    Flush {
        /// What the engine said.
        reason: String,
    },
    /// A record's checksum or layout does not match; the key says which.
    #[error("corrupt record at key {key}: {reason}")]
    Corrupt {
        /// The key, printable.
        key: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The object store (the block directory, `store.object-store`) failed.
    #[error("object store: {what}")]
    Object {
        /// What the store was doing, with the object's name.
        what: String,
        /// What the object store said.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Object-storage mode: the write's segment could not be put in the bucket (unreachable,
    /// refusing, timing out); nothing of it was acknowledged, and the same write may succeed
    /// once the bucket answers again.
    #[error("the object store is unavailable; the write was not stored, retry later: {reason}")]
    Unavailable {
        /// What the bucket said.
        reason: String,
    },
    /// The head holds more than twice `store.head-max-bytes`: writes arrive faster than cuts
    /// move them into blocks. Nothing of the write was stored; the same write may succeed once
    /// the cuts catch up (retryable, as [`StoreError::Unavailable`]).
    #[error(
        "the store is busy: its head holds {head_bytes} bytes, over {limit} (twice store.head-max-bytes), while cuts catch up; the write was not stored, retry later"
    )]
    Busy {
        /// What the head holds.
        head_bytes: u64,
        /// What it may hold before writes are refused.
        limit: u64,
    },
    /// The store has been closed; nothing more is accepted.
    #[error("the store is closed")]
    Closed,
    /// A cut's block whose range the head no longer holds sealed: the writer restarted and
    /// rebuilt the head meanwhile.
    #[error("block {block} was cut from a head the writer has since rebuilt")]
    Stale { block: String },
}

/// A write's answer: resolves once the write is durable, or with why it is not. Queues the write
/// when first polled.
///
/// # Cancel safety
///
/// Dropping it before its first poll withdraws the write; after, the write still happens,
/// unacknowledged.
pub(crate) type Ack<T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'static>>;

/// The span trees of a write's profiles that have any: each with its profile's index in the
/// write. Span ids are never series labels; these trees are kept beside the profiles.
pub(crate) type ProfileSpans = Vec<(usize, SpanTrees)>;

/// The store's interface towards ingest, query, rules and admin. See the module docs for its
/// shape; [`BlockStore`] implements it.
pub(crate) trait Store: Send + Sync {
    /// Adds `profiles` to `tenant`'s data, all or nothing, with the span trees of those in
    /// `spans` (each a part of its profile's tree). With a `marker` (an agent's batch), the
    /// write is skipped when that marker is stored already, and otherwise stored with the
    /// profiles in the same atomic write, so that a batch sent again (after a lost ack, a
    /// `kill -9`, a restart) is never counted twice; a duplicate's answer waits for the
    /// durability of its first copy.
    ///
    /// # Errors
    ///
    /// [`StoreError::Closed`] after the store closed; [`StoreError::Engine`] or
    /// [`StoreError::Flush`] when the write or its flush failed, [`StoreError::Unavailable`]
    /// when (object-storage mode) its segment could not be uploaded, in which cases nothing of
    /// it was acknowledged.
    fn write(
        &self,
        tenant: &Tenant,
        profiles: Vec<Profile>,
        spans: ProfileSpans,
        marker: Option<BatchMarker>,
    ) -> Ack<Written>;

    /// Deletes app `app` as of now: its data stamped before the deletion's horizon (now rounded
    /// up to 10 s), stored anywhere or arriving later, on every aggregator of the store; answers
    /// how many series lost data here (0: nothing was stored, no such app).
    ///
    /// # Errors
    ///
    /// As [`Store::write`].
    fn delete_app(&self, tenant: &Tenant, app: &str) -> Ack<u64>;

    /// Stores recording rule `name` as `rule` (opaque bytes: the rules stage owns their
    /// meaning), replacing any rule of that name.
    ///
    /// # Errors
    ///
    /// As [`Store::write`].
    fn put_rule(&self, tenant: &Tenant, name: &str, rule: Vec<u8>) -> Ack<()>;

    /// Deletes recording rule `name`; answers whether it existed.
    ///
    /// # Errors
    ///
    /// As [`Store::write`].
    fn delete_rule(&self, tenant: &Tenant, name: &str) -> Ack<bool>;

    /// Series whose app name and labels match `selector` and that have data in `range`.
    ///
    /// # Errors
    ///
    /// When the engine fails or a record is corrupt.
    fn series(
        &self,
        tenant: &Tenant,
        selector: &Selector,
        range: TimeRange,
    ) -> Result<Vec<SeriesInfo>, StoreError>;

    /// The trees of the series `selector` matches, merged over `range` widened to whole
    /// buckets of `resolution` seconds (at least 10 s), `sum` and `average` series apart, with
    /// the series merged.
    ///
    /// # Errors
    ///
    /// When the engine fails or a bucket is corrupt (the error names its key).
    fn merge(
        &self,
        tenant: &Tenant,
        selector: &Selector,
        range: TimeRange,
        resolution: u64,
    ) -> Result<Merged, StoreError>;

    /// The samples of spans `spans` (sorted) in the series `selector` matches, merged over
    /// `range` widened to whole 10 s buckets, as [`Store::merge`] answers; `series` lists
    /// the series that had any of them.
    ///
    /// # Errors
    ///
    /// When the engine fails.
    fn merge_spans(
        &self,
        tenant: &Tenant,
        selector: &Selector,
        range: TimeRange,
        spans: &[SpanId],
    ) -> Result<Merged, StoreError>;

    /// The totals of the series `selector` matches over `range`, summed per `step` seconds
    /// (rounded up to whole 10 s buckets), one timeline per value of label `group_by`. Reads
    /// bucket totals, never trees.
    ///
    /// # Errors
    ///
    /// When the engine fails or a total is corrupt.
    fn timelines(
        &self,
        tenant: &Tenant,
        selector: &Selector,
        range: TimeRange,
        step: u64,
        group_by: Option<&str>,
    ) -> Result<Timelines, StoreError>;

    /// Label names of series with data in `range`, of app `app` when given, sorted; `__name__`
    /// is not listed.
    ///
    /// # Errors
    ///
    /// When the engine fails or a record is corrupt.
    fn label_names(
        &self,
        tenant: &Tenant,
        app: Option<&str>,
        range: TimeRange,
    ) -> Result<Vec<String>, StoreError>;

    /// Values of label `name` among series with data in `range` that `selector` matches (all
    /// series without one), sorted; `__name__` lists app names.
    ///
    /// # Errors
    ///
    /// When the engine fails or a record is corrupt.
    fn label_values(
        &self,
        tenant: &Tenant,
        name: &str,
        selector: Option<&Selector>,
        range: TimeRange,
    ) -> Result<Vec<String>, StoreError>;

    /// Every app name with the metadata of its most recently written series, sorted by name.
    ///
    /// # Errors
    ///
    /// When the engine fails or a record is corrupt.
    fn apps(&self, tenant: &Tenant) -> Result<Vec<AppInfo>, StoreError>;

    /// Every stored recording rule of `tenant` as (name, rule), in name order.
    ///
    /// # Errors
    ///
    /// When the engine fails or a record is corrupt.
    fn rules(&self, tenant: &Tenant) -> Result<Vec<(String, Vec<u8>)>, StoreError>;

    /// Every tenant with a stored recording rule, in id order.
    ///
    /// # Errors
    ///
    /// When the engine fails or a record is corrupt.
    fn rule_tenants(&self) -> Result<Vec<Tenant>, StoreError>;

    /// Where other aggregators may change the stored rules (object-storage mode), a receiver
    /// whose value changes whenever [`Store::rules`] answers differently for a change not made
    /// through this store; `None` where only this store changes them.
    fn rule_changes(&self) -> Option<tokio::sync::watch::Receiver<u64>>;
}

/// Identifies one agent batch, so that the store keeps each at most once (QUIC ingest).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BatchMarker {
    /// The sending agent's id.
    pub(crate) agent_id: String,
    /// The batch's sequence number.
    pub(crate) sequence: u64,
    /// Unix seconds of the end of the batch's window; retention deletes the marker with the
    /// window's data.
    pub(crate) window_end: u64,
}

/// What [`Store::write`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Written {
    /// The profiles are stored (with the batch's marker, if any).
    Stored,
    /// The marker was already there: the batch had been stored, nothing was written.
    Duplicate,
}

/// A series as stored: its identity, what its values mean, and when it has data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SeriesInfo {
    /// App name and labels.
    pub(crate) series: Series,
    /// Units, sample rate, spy name and aggregation of its latest write.
    pub(crate) meta: ProfileMeta,
    /// Unix seconds of the oldest bucket it has data in.
    pub(crate) first_seen: u64,
    /// Unix seconds of the newest bucket it has data in.
    pub(crate) last_seen: u64,
}

/// A range of time, `[from, until)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TimeRange {
    /// The start, included.
    pub(crate) from: SystemTime,
    /// The end, excluded.
    pub(crate) until: SystemTime,
}

impl TimeRange {
    /// Unix seconds of both ends widened to whole buckets of `resolution` seconds (at least
    /// 10 s): the start rounded down, the end rounded up, so that every bucket the range touches
    /// is read.
    pub(crate) fn aligned(&self, resolution: u64) -> (u64, u64) {
        plan::align(unix(self.from), unix(self.until), resolution)
    }
}

/// Trees merged over a range, and how many writes they sum.
#[derive(Debug, Default)]
pub(crate) struct MergedTrees {
    /// The sum of every bucket read.
    pub(crate) tree: Tree,
    /// How many writes those buckets sum; a range of `average` series is `tree / writes`.
    pub(crate) writes: u64,
}

/// What [`Store::merge`] answers: the matching series' trees, `sum` and `average` series kept
/// apart, since only the caller knows how it combines them.
#[derive(Debug, Default)]
pub(crate) struct Merged {
    /// The series of aggregation `sum`.
    pub(crate) sum: MergedTrees,
    /// The series of aggregation `average`.
    pub(crate) average: MergedTrees,
    /// The series merged, as [`Store::series`] lists them.
    pub(crate) series: Vec<SeriesInfo>,
}

/// What [`Store::timelines`] answers: totals per step, per value of the grouping label.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Timelines {
    /// Unix seconds of the first point.
    pub(crate) start: u64,
    /// Seconds per point.
    pub(crate) step: u64,
    /// How many points every timeline has.
    pub(crate) points: usize,
    /// The sum of totals in each step, per value of the grouping label; `None` holds the series
    /// without it (every series, without a grouping label). Only groups with series are there.
    pub(crate) groups: BTreeMap<Option<String>, Vec<u64>>,
}

/// An application: the series that share an app name, and the metadata of the latest write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AppInfo {
    /// The app name, such as `checkout.cpu`.
    pub(crate) name: String,
    /// What its values mean.
    pub(crate) meta: ProfileMeta,
}

/// Unix seconds of `time`; times before 1970 count as 0.
pub(crate) fn unix(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
