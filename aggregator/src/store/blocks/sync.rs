//! The sync loop of object-storage mode: what other aggregators put in the bucket, brought into
//! this one's view every `store.object-store.poll-interval`.
//!
//! Input: the bucket's listings (segments, blocks, heartbeats); output: an [`Update`] the writer
//! thread applies in one step (`Command::Sync`): new blocks (downloaded into the cache and
//! opened), blocks gone, other writers' segments (read and decoded), and the writers this
//! aggregator adopts. Runs on the blocking pool, one poll at a time, from the maintenance task
//! [`super::BlockStore::start_maintenance`] starts; also once at open.
//!
//! - **Heartbeat**: every third of `orphan-after` (at most every [`HEARTBEAT`]) it rewrites `aggregators/<writer>`, whose Last-Modified
//!   (the store's clock) tells the others it lives.
//! - **Segments**: keys sort by upload time, so a poll lists from a key [`SKEW`] before its
//!   previous poll's time (one short listing); a full listing at open and every
//!   [`FULL_LISTING`] catches what a writer with a clock further off uploaded, and tells which
//!   segments are gone.
//! - **Blocks**: the whole listing, compared with the published set; a block missing from two
//!   listings in a row leaves (one listing can miss both a merge's inputs, deleted, and its
//!   output, written after the listing passed its name).
//!   Which blocks are opened follows `lineage.rs`: every merge (its sources say what it
//!   replaces), and the cut blocks no shown merge holds.
//! - **Orphans**: a writer whose heartbeat is older than `orphan-after` (or who has none, and
//!   whose newest segment is that old), compared with our own heartbeat's Last-Modified; the
//!   live writer with the smallest id adopts them.
//! - **App deletions** (`deletions.rs`): one listing of `shared/deletions/` per poll.
//! - **Compaction role** (`role.rs`): the lease renewed, or the election read from the
//!   heartbeats; and which listed blocks are hidden since when, for a compactor to delete
//!   once `compaction-grace` has passed.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tracing::{error, info, warn};

use super::Shared;
use super::bucket::{Bucket, Compactor};
use super::deletions;
use super::files::{BlockFile, BlockName, OpenError, bucket_error};
use super::lineage::is_merge;
use super::role::{COMPACTOR_FLAG, Role};
use super::segment::{self, SegmentKey};
use super::wal::Record;
use crate::store::StoreError;
use crate::tenant::Tenant;

/// How often the heartbeat object is rewritten at most: every third of `orphan-after`, capped
/// at this.
const HEARTBEAT: Duration = Duration::from_secs(10);

/// How far before its previous poll's time a poll starts listing segments: writers' clocks may
/// differ by this much (and a listing may lag) without a segment being seen late.
const SKEW: Duration = Duration::from_secs(10);

/// How often segments are listed whole.
const FULL_LISTING: Duration = Duration::from_secs(60);

/// Where heartbeats are, under the bucket's prefix.
pub(crate) const HEARTBEATS: &str = "aggregators/";

/// What one poll found, for the writer to apply.
#[derive(Default)]
pub(crate) struct Update {
    /// Blocks not published here yet, opened.
    pub(crate) blocks: Vec<Arc<BlockFile>>,
    /// Ids of published blocks no longer in the bucket.
    pub(crate) gone: BTreeSet<String>,
    /// Other writers' segments not read before, decoded.
    pub(crate) segments: Vec<(SegmentKey, Vec<(u64, Record)>)>,
    /// This writer's doubtful segments found in the bucket (`segment.rs`, `Doubtful`), decoded.
    pub(crate) landed: Vec<(SegmentKey, Vec<(u64, Record)>)>,
    /// Every segment key a full listing showed (`None`: this poll listed only recent ones).
    pub(crate) listed: Option<BTreeSet<String>>,
    /// Writers whose segments this aggregator adopts now.
    pub(crate) adopt: BTreeSet<String>,
    /// Every block the listing showed.
    pub(crate) listed_blocks: Vec<BlockName>,
    /// Every app deletion in the bucket (`None`: not listed by this poll).
    pub(crate) deletions: Option<Vec<deletions::Listed>>,
}

/// The sync loop's memory between polls.
pub(crate) struct Sync {
    bucket: Arc<Bucket>,
    writer: String,
    orphan_after: Duration,
    /// Segment keys read (or refused as damaged), so that a poll reads each once.
    seen: BTreeSet<String>,
    /// Unix milliseconds of the previous poll's start.
    last_poll: Option<u64>,
    last_full: Option<Instant>,
    last_heartbeat: Option<Instant>,
    /// Published blocks missing from the last listing, by id.
    missing: HashMap<String, u32>,
    /// Whether the last heartbeats listing showed another live writer.
    others: bool,
    /// When segments were last listed.
    last_segments: Option<Instant>,
    /// Whether this aggregator may compact (`store.object-store.compactor`): it says so beside
    /// its heartbeat, for the election.
    compactor: bool,
    role: Role,
    /// Whether this aggregator compacts, as of the last poll.
    compacting: bool,
    /// The store's clock less ours, in ms, from our heartbeat's Last-Modified.
    clock_offset: i64,
    /// Local Unix ms when the heartbeat was last written.
    heartbeat_written: Option<u64>,
    /// The blocks of the last listing with their Last-Modified (the store's clock, Unix ms).
    modified: HashMap<String, u64>,
    /// Listed blocks that reads do not show because shown blocks hold their data (merges'
    /// inputs, merges that lost), since when: a compactor deletes them after the grace.
    hidden: HashMap<String, (BlockName, Instant)>,
    /// The listing of app deletions (`deletions.rs`).
    deletions: deletions::Listing,
}

impl Sync {
    /// The loop's state for writer `writer` on `bucket`, compacting as `compactor` says.
    pub(crate) fn new(
        bucket: Arc<Bucket>,
        writer: String,
        orphan_after: Duration,
        compactor: Compactor,
    ) -> Sync {
        Sync {
            role: Role::new(Arc::clone(&bucket), writer.clone(), compactor, orphan_after),
            bucket,
            writer,
            orphan_after,
            compactor: compactor.may(),
            compacting: false,
            clock_offset: 0,
            heartbeat_written: None,
            modified: HashMap::new(),
            hidden: HashMap::new(),
            deletions: deletions::Listing::default(),
            seen: BTreeSet::new(),
            last_poll: None,
            last_full: None,
            last_heartbeat: None,
            missing: HashMap::new(),
            others: false,
            last_segments: None,
        }
    }

    /// One poll; see the [module documentation](self).
    ///
    /// # Errors
    ///
    /// When a listing or the heartbeat fails; a segment or block that cannot be read is
    /// logged and counted, and the poll goes on.
    pub(crate) fn poll(&mut self, shared: &Shared) -> Result<Update, StoreError> {
        let started = unix_millis(SystemTime::now());
        self.heartbeat()?;
        let mut update = Update::default();
        let (heartbeats, compactors) = self.heartbeats()?;
        // Deletions before segments: records they remove never reach the remote head.
        update.deletions = Some(self.deletions.list(&self.bucket).map_err(bucket_error)?);
        self.read_segments(shared, &mut update)?;
        self.read_blocks(shared, &mut update)?;
        update.adopt = self.orphans(shared, &heartbeats, &update);
        let elected = self.elected(&heartbeats, &compactors);
        self.compacting = match self.role.check(elected, self.store_now()) {
            Ok(compacting) => compacting,
            Err(err) => {
                warn!(error = %err, "taking or renewing the compaction lease failed");
                false
            }
        };
        shared.metrics.compacting.set(i64::from(self.compacting));
        self.last_poll = Some(started);
        Ok(update)
    }

    /// Whether this aggregator compacts, as of the last poll (`role.rs`).
    pub(crate) fn compacting(&self) -> bool {
        self.compacting
    }

    /// Now by the store's clock (Unix ms), as our heartbeat's Last-Modified tells it.
    pub(crate) fn store_now(&self) -> u64 {
        let now = unix_millis(SystemTime::now());
        now.saturating_add_signed(self.clock_offset)
    }

    /// How long ago block `id` was written by the store's clock, when the last listing showed
    /// it.
    pub(crate) fn block_age(&self, id: &str) -> Option<Duration> {
        let modified = *self.modified.get(id)?;
        Some(Duration::from_millis(
            self.store_now().saturating_sub(modified),
        ))
    }

    /// Whether the election chose this aggregator: it may compact, and it is the live one
    /// with the smallest id of those that may.
    fn elected(&self, heartbeats: &BTreeMap<String, u64>, compactors: &BTreeSet<String>) -> bool {
        let Some(&own) = heartbeats.get(&self.writer) else {
            return false;
        };
        let limit = self.orphan_after.as_millis() as u64;
        self.compactor
            && heartbeats
                .iter()
                .filter(|(writer, millis)| {
                    compactors.contains(*writer) && own.saturating_sub(**millis) <= limit
                })
                .map(|(writer, _)| writer)
                .min()
                == Some(&self.writer)
    }

    /// Notes which listed blocks reads do not show because shown blocks hold their data, as of
    /// the state after this poll was applied: the known blocks held hidden, and the listed cut
    /// blocks a shown block holds (never opened).
    pub(crate) fn note_hidden(&mut self, shared: &Shared, listed: &[BlockName]) {
        let state = shared.state();
        let covered: HashSet<(&Tenant, &str)> = state
            .blocks
            .all()
            .flat_map(|b| {
                b.leaves
                    .iter()
                    .map(move |leaf| (&b.name.tenant, leaf.as_str()))
            })
            .collect();
        let shown: HashSet<&str> = state.blocks.all().map(|b| b.name.id.as_str()).collect();
        let held: HashSet<&str> = state
            .blocks
            .held
            .values()
            .flatten()
            .map(|b| b.name.id.as_str())
            .collect();
        let now = Instant::now();
        let mut hidden = HashMap::new();
        for name in listed {
            let id = name.id.as_str();
            let is_hidden = !shown.contains(id)
                && (held.contains(id) || (!is_merge(id) && covered.contains(&(&name.tenant, id))));
            if is_hidden {
                let since = self.hidden.get(id).map_or(now, |(_, since)| *since);
                hidden.insert(id.to_owned(), (name.clone(), since));
            }
        }
        self.hidden = hidden;
        shared.metrics.blocks_hidden.set(self.hidden.len() as i64);
    }

    /// The listed blocks hidden for at least `grace` without a break, which a compactor may
    /// delete: every aggregator has seen what hides them for that long.
    pub(crate) fn retirable(&self, grace: Duration) -> Vec<BlockName> {
        self.hidden
            .values()
            .filter(|(_, since)| since.elapsed() >= grace)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Other writers' segments uploaded since the last listing, when that listing is older than
    /// `age` and another writer lives: what the writer asks for before it checks a group's
    /// agent batches against the bucket, so that the check misses only what was uploaded within
    /// one upload interval.
    ///
    /// # Errors
    ///
    /// When the listing fails.
    pub(crate) fn recent_segments(
        &mut self,
        shared: &Shared,
        age: Duration,
    ) -> Result<Option<Update>, StoreError> {
        if !self.others || self.last_segments.is_some_and(|at| at.elapsed() < age) {
            return Ok(None);
        }
        let started = unix_millis(SystemTime::now());
        let mut update = Update::default();
        self.read_segments(shared, &mut update)?;
        self.last_poll = Some(started);
        Ok(Some(update))
    }

    /// Rewrites the heartbeat object when it is due.
    fn heartbeat(&mut self) -> Result<(), StoreError> {
        if self
            .last_heartbeat
            .is_some_and(|at| at.elapsed() < HEARTBEAT.min(self.orphan_after / 3))
        {
            return Ok(());
        }
        let written = unix_millis(SystemTime::now());
        let body = serde_json::json!({
            "writer": self.writer,
            "version": env!("CARGO_PKG_VERSION"),
            "written": written,
            "compactor": self.compactor,
        });
        self.bucket
            .put(
                &format!("{HEARTBEATS}{}", self.writer),
                bytes::Bytes::from(body.to_string()),
            )
            .map_err(bucket_error)?;
        if self.compactor {
            self.bucket
                .put(
                    &format!("{HEARTBEATS}{}{COMPACTOR_FLAG}", self.writer),
                    bytes::Bytes::new(),
                )
                .map_err(bucket_error)?;
        }
        self.last_heartbeat = Some(Instant::now());
        self.heartbeat_written = Some(written);
        Ok(())
    }

    /// Every heartbeat's writer and Last-Modified (Unix milliseconds, the store's clock), and
    /// the writers that may compact.
    fn heartbeats(&mut self) -> Result<(BTreeMap<String, u64>, BTreeSet<String>), StoreError> {
        let mut out = BTreeMap::new();
        let mut compactors = BTreeSet::new();
        for object in self.bucket.list(HEARTBEATS).map_err(bucket_error)? {
            let Some(writer) = self
                .bucket
                .key(&object.location)
                .and_then(|key| key.strip_prefix(HEARTBEATS))
            else {
                continue;
            };
            if writer.starts_with('.') {
                continue;
            }
            if let Some(writer) = writer.strip_suffix(COMPACTOR_FLAG) {
                compactors.insert(writer.to_owned());
                continue;
            }
            let millis = u64::try_from(object.last_modified.timestamp_millis()).unwrap_or(0);
            if writer == self.writer
                && let Some(written) = self.heartbeat_written.take()
            {
                self.clock_offset = millis as i64 - written as i64;
            }
            out.insert(writer.to_owned(), millis);
        }
        Ok((out, compactors))
    }

    /// Lists segments (whole, or those since the previous poll) and reads the new ones of other
    /// writers, and this writer's segments in doubt; one that cannot be read is read again at
    /// the next poll.
    fn read_segments(&mut self, shared: &Shared, update: &mut Update) -> Result<(), StoreError> {
        let listed_at = Instant::now();
        self.last_segments = Some(listed_at);
        let doubtful = |key: &str| {
            shared.bucket.as_ref().is_some_and(|mode| {
                mode.doubtful
                    .lock()
                    .expect("doubtful segments lock")
                    .contains(key)
            })
        };
        let full = self.last_full.is_none_or(|at| at.elapsed() >= FULL_LISTING);
        let objects = match self.last_poll {
            Some(last) if !full => {
                let from = last.saturating_sub(SKEW.as_millis() as u64);
                self.bucket
                    .list_after(segment::PREFIX, &SegmentKey::listing_start(from))
            }
            _ => self.bucket.list(segment::PREFIX),
        }
        .map_err(bucket_error)?;
        let mut listed = BTreeSet::new();
        for object in objects {
            let Some(key) = self.bucket.key(&object.location).map(str::to_owned) else {
                continue;
            };
            listed.insert(key.clone());
            if self.seen.contains(&key) {
                continue;
            }
            let Some(parsed) = SegmentKey::parse(&key) else {
                warn!(object = %key, "not a segment; left alone");
                self.seen.insert(key);
                continue;
            };
            // Own segments are never marked seen: one listed before its failed upload was
            // noted in doubt must still be read at a later listing.
            let own = parsed.writer == self.writer;
            if own && !doubtful(&key) {
                continue;
            }
            match self.bucket.get(&key) {
                Ok(bytes) => match segment::decode(&bytes) {
                    Ok(records) if own => {
                        update.landed.push((parsed, records));
                        self.seen.insert(key);
                    }
                    Ok(records) => {
                        update.segments.push((parsed, records));
                        self.seen.insert(key);
                    }
                    Err(reason) => {
                        error!(segment = %key, %reason, "segment damaged; its records are not read (its writer's cut still holds them if it lives)");
                        shared.metrics.bad_segments.inc();
                        if own && let Some(mode) = &shared.bucket {
                            // Its writes were refused: nothing of it is owed to anyone.
                            let mut doubtful =
                                mode.doubtful.lock().expect("doubtful segments lock");
                            doubtful.remove(&key);
                            shared.metrics.segments_doubtful.set(doubtful.len() as i64);
                        }
                        self.seen.insert(key);
                    }
                },
                // Deleted since the listing: a block holds its records now.
                Err(err) if err.not_found() => {
                    self.seen.insert(key);
                }
                // Not marked seen: read again at the next listing. Returning the error would
                // drop the segments this listing already read and marked seen.
                Err(err) => {
                    warn!(segment = %key, error = %err, "reading a segment failed; read again at the next poll");
                    shared.metrics.sync_failures.inc();
                }
            }
        }
        if full {
            if let Some(mode) = &shared.bucket {
                let mut doubtful = mode.doubtful.lock().expect("doubtful segments lock");
                let absent = doubtful.forget_absent(&listed, listed_at);
                if absent > 0 {
                    info!(
                        segments = absent,
                        "segments whose upload failed never reached the bucket"
                    );
                }
                shared.metrics.segments_doubtful.set(doubtful.len() as i64);
            }
            self.seen.retain(|key| listed.contains(key));
            self.last_full = Some(Instant::now());
            update.listed = Some(listed);
        }
        Ok(())
    }

    /// Lists the blocks and opens those not known here yet that reads may need (every merge,
    /// then the cut blocks no shown block holds, as `lineage.rs` resolves them with the merges
    /// found); names the known ones gone from two listings in a row.
    fn read_blocks(&mut self, shared: &Shared, update: &mut Update) -> Result<(), StoreError> {
        let listing = shared.files.list_with_times()?;
        self.modified = listing
            .iter()
            .map(|(name, _, modified)| (name.id.clone(), *modified))
            .collect();
        let known: BTreeMap<String, Arc<BlockFile>> = shared
            .state()
            .blocks
            .candidates()
            .map(|b| (b.name.id.clone(), Arc::clone(b)))
            .collect();
        let listed: BTreeSet<&str> = listing
            .iter()
            .map(|(name, _, _)| name.id.as_str())
            .collect();
        let wanted = |name: &BlockName| {
            !known.contains_key(&name.id)
                && !shared.files.written_here(&name.id)
                && !shared.is_bad_block(&name.id)
        };
        // Merges first: their sources say which cut blocks they hold.
        for (name, len, _) in &listing {
            if is_merge(&name.id) && wanted(name) {
                self.open(shared, name, *len, update);
            }
        }
        let covered = shared.covered_leaves(known.values().chain(&update.blocks));
        for (name, len, _) in &listing {
            if !is_merge(&name.id)
                && wanted(name)
                && !covered.contains(&(name.tenant.clone(), name.id.clone()))
            {
                self.open(shared, name, *len, update);
            }
        }
        for id in known.keys() {
            if listed.contains(id.as_str()) {
                self.missing.remove(id);
                continue;
            }
            let count = self.missing.entry(id.clone()).or_insert(0);
            *count += 1;
            if *count >= 2 {
                update.gone.insert(id.clone());
            }
        }
        self.missing.retain(|id, _| known.contains_key(id));
        for id in &update.gone {
            self.missing.remove(id);
        }
        update.listed_blocks = listing.into_iter().map(|(name, _, _)| name).collect();
        Ok(())
    }

    /// Opens listed block `name` of `len` bytes into `update`; one that cannot be read is
    /// logged and remembered, one whose download failed is tried again at the next poll.
    fn open(&self, shared: &Shared, name: &BlockName, len: u64, update: &mut Update) {
        match shared.files.open_block(name, len) {
            Ok(block) => update.blocks.push(Arc::new(block)),
            Err(OpenError::Block(err)) => {
                error!(block = %name, error = %err, "block cannot be read (damaged, truncated, or of a newer format); it is not served");
                shared.remember_bad_block(&name.id);
            }
            // Gone since the listing, or the download failed: the next poll tries again.
            Err(OpenError::Store(err)) => {
                warn!(block = %name, error = %err, "opening a block of the bucket failed; trying again at the next poll");
            }
        }
    }

    /// The writers to adopt now: orphans (see the [module documentation](self)), when this
    /// aggregator is the live writer with the smallest id.
    fn orphans(
        &mut self,
        shared: &Shared,
        heartbeats: &BTreeMap<String, u64>,
        update: &Update,
    ) -> BTreeSet<String> {
        let Some(&own) = heartbeats.get(&self.writer) else {
            return BTreeSet::new();
        };
        let limit = self.orphan_after.as_millis() as u64;
        let live = |millis: u64| own.saturating_sub(millis) <= limit;
        self.others = heartbeats
            .iter()
            .any(|(writer, millis)| *writer != self.writer && live(*millis));
        let adopter = heartbeats
            .iter()
            .filter(|(_, millis)| live(**millis))
            .map(|(writer, _)| writer)
            .min();
        if adopter != Some(&self.writer) {
            return BTreeSet::new();
        }
        let mut writers: BTreeMap<String, u64> = shared.state().remote.writers();
        for (key, _) in &update.segments {
            let newest = writers.entry(key.writer.clone()).or_insert(0);
            *newest = (*newest).max(key.millis);
        }
        let adopt: BTreeSet<String> = writers
            .into_iter()
            .filter(|(writer, newest)| match heartbeats.get(writer) {
                Some(&beat) => !live(beat),
                // No heartbeat (deleted by an adopter, or never written): by its segments' age,
                // by their writer's clock, which SKEW allows for.
                None => own.saturating_sub(*newest) > limit + SKEW.as_millis() as u64,
            })
            .map(|(writer, _)| writer)
            .filter(|writer| *writer != self.writer)
            .collect();
        if !adopt.is_empty() {
            info!(writers = ?adopt, "adopting the segments of writers whose heartbeat stopped");
        }
        adopt
    }

    /// Deletes the heartbeat of adopted writer `writer` (and its compactor flag): its
    /// segments are ours now.
    pub(crate) fn forget_writer(&self, writer: &str) {
        for key in [
            format!("{HEARTBEATS}{writer}"),
            format!("{HEARTBEATS}{writer}{COMPACTOR_FLAG}"),
        ] {
            if let Err(err) = self.bucket.delete(&key) {
                warn!(writer, error = %err, "deleting an adopted writer's heartbeat failed");
            }
        }
    }
}

/// Unix milliseconds of `time`.
pub(crate) fn unix_millis(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
