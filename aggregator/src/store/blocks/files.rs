//! Where blocks live, through the `object_store` crate, and the blocks as the store holds them
//! open: named, decoded down to their index, and read with ranged reads.
//!
//! Input: the `store.object-store` config; output: [`Files`] (list, write, delete blocks) and
//! [`BlockFile`]s (a block's footer, index, names and sources, decoded once, and its bytes read
//! on demand). Callers: the writer (cuts), compaction, retention, reads and `check`.
//!
//! A block is the object `<tenant>/<start>-<span>-<id>.block` (start zero-padded to 12 digits so
//! that names sort by time): its name says whose data it holds and which range without reading
//! it, which is what retention and compaction plan from. With the local backend the objects are
//! files under the block directory, written through `LocalFileSystem` with fsync (file and
//! directory) before the write returns, and read with `pread` on a file handle kept open, so a
//! block deleted while a query reads it stays readable. With the S3 backend (`bucket.rs`) they
//! are the objects `blocks/<tenant>/...` of the bucket, with copies in the data directory's
//! bounded block cache (`cache/blocks/`, `cache.rs`): a block written here is copied there
//! beside its upload; a block opened without a copy is opened with a ranged GET of its end (its
//! index and names stay decoded in memory) and downloaded whole at its first read (one GET,
//! then `pread` on the copy); a block larger than a quarter of the cache, or that it has no room
//! for, is read with ranged GETs. A
//! read holds its copy, which the cache then does not evict.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use serde::{Deserialize, Serialize};
use smolder_block::{BlockError, Fetched, Footer, Index, Limits, Names, SpanIndex, Tail};
use tracing::warn;

use super::bucket::{Bucket, BucketUpload, RequestError, S3Config};
use super::cache::{BlockCache, Reservation};
use crate::store::{StoreError, StoreMetrics};
use crate::tenant::Tenant;

/// Where blocks are kept: `type: local` (the default) is a directory; `type: s3` is a bucket
/// that several aggregators may share.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum ObjectStoreConfig {
    /// Blocks are files in a local directory.
    Local(LocalConfig),
    /// Blocks are objects in an S3 bucket, with a copy of each in the data directory's cache.
    S3(Box<S3Config>),
}

impl Default for ObjectStoreConfig {
    fn default() -> Self {
        ObjectStoreConfig::Local(LocalConfig::default())
    }
}

/// The local backend: blocks in a directory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct LocalConfig {
    /// The block directory. Default empty: `<data-dir>/blocks`.
    pub path: PathBuf,
}

/// How much of a block's end to read first: its tail, directory and small sections usually
/// fit, which saves the reads that would find them one by one.
const SUFFIX: u64 = 256 << 10;

/// A block's name: whose data, which range, which block.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct BlockName {
    /// Unix seconds of its start.
    pub(crate) start: u64,
    /// Its span in seconds.
    pub(crate) span: u64,
    pub(crate) tenant: Tenant,
    /// Unique among all blocks (the cache, lineage and dedupe know blocks by it): random
    /// for a cut, derived from the inputs for a merge, from the range for a migrated block.
    pub(crate) id: String,
}

impl BlockName {
    /// Unix seconds of its end.
    pub(crate) fn end(&self) -> u64 {
        self.start + self.span
    }

    /// The object path.
    pub(crate) fn path(&self) -> ObjectPath {
        ObjectPath::from(format!(
            "{}/{:012}-{}-{}.block",
            self.tenant.as_str(),
            self.start,
            self.span,
            self.id
        ))
    }

    /// Parses an object path; `None` for an object that is not a block.
    pub(crate) fn parse(path: &ObjectPath) -> Option<BlockName> {
        let mut parts = path.parts();
        let tenant = Tenant::new(parts.next()?.as_ref()).ok()?;
        let file = parts.next()?;
        if parts.next().is_some() {
            return None;
        }
        let stem = file.as_ref().strip_suffix(".block")?;
        let mut fields = stem.splitn(3, '-');
        let start = fields.next()?.parse().ok()?;
        let span = fields.next()?.parse().ok()?;
        let id = fields.next()?;
        let ok = !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        ok.then(|| BlockName {
            start,
            span,
            tenant,
            id: id.to_owned(),
        })
    }
}

impl std::fmt::Display for BlockName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.path())
    }
}

/// Where blocks are kept, through `object_store`.
pub(crate) struct Files {
    backend: Backend,
    /// Where blocks are read from: the block directory, or the bucket's blocks' cache.
    root: PathBuf,
    /// Ids of the blocks this process wrote: its writer publishes them, so the sync loop must
    /// not take one for another aggregator's while its cut or merge is still publishing it.
    written: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

enum Backend {
    Local(LocalFileSystem),
    Bucket(Arc<Bucket>, Arc<BlockCache>),
}

/// Where the bucket's blocks are, under its prefix.
const BLOCKS: &str = "blocks/";

/// Runs an object-store call to completion on this thread. `LocalFileSystem` does its file
/// work inline, or on tokio's blocking pool when called inside a runtime, so this never waits
/// on the calling runtime's own workers. (The bucket runs its requests on its own runtime.)
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut context = std::task::Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let std::task::Poll::Ready(out) = future.as_mut().poll(&mut context) {
            return out;
        }
        std::thread::park();
    }
}

/// A failure of the object store, named with what it was doing.
fn object_error(what: &str, name: &str, err: object_store::Error) -> StoreError {
    StoreError::Object {
        what: format!("{what} {name}"),
        source: Box::new(err),
    }
}

/// A failure of the bucket, as the store reports it.
pub(crate) fn bucket_error(err: RequestError) -> StoreError {
    StoreError::Object {
        what: err.to_string(),
        source: Box::new(err.source),
    }
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_owned(),
        source,
    }
}

impl Files {
    /// The block store `config` names: the block directory, created if needed (under
    /// `data_dir` by default), or the bucket, connected to and checked, with its cache under
    /// `data_dir`.
    ///
    /// # Errors
    ///
    /// [`StoreError::Io`] when a directory cannot be created; [`StoreError::Object`] when the
    /// bucket cannot be used (the message says why: not found, credentials refused, no answer).
    pub(crate) fn open(
        config: &ObjectStoreConfig,
        data_dir: &Path,
        metrics: &StoreMetrics,
    ) -> Result<Files, StoreError> {
        let (backend, root) = match config {
            ObjectStoreConfig::Local(local) => {
                let root = if local.path.as_os_str().is_empty() {
                    data_dir.join("blocks")
                } else {
                    local.path.clone()
                };
                std::fs::create_dir_all(&root).map_err(io_error(&root))?;
                let store = LocalFileSystem::new_with_prefix(&root)
                    .map_err(|err| object_error("opening", &root.display().to_string(), err))?
                    .with_fsync(true);
                (Backend::Local(store), root)
            }
            ObjectStoreConfig::S3(s3) => {
                let root = data_dir.join("cache").join("blocks");
                let cache = BlockCache::open(
                    root.clone(),
                    s3.block_cache_bytes,
                    metrics.block_cache.clone(),
                )
                .map_err(io_error(&root))?;
                let bucket = Bucket::connect(s3, metrics.object.clone()).map_err(|err| {
                    StoreError::Object {
                        what: "opening the bucket (store.object-store)".into(),
                        source: Box::new(err),
                    }
                })?;
                (Backend::Bucket(Arc::new(bucket), Arc::new(cache)), root)
            }
        };
        Ok(Files {
            backend,
            root,
            written: std::sync::Mutex::new(std::collections::BTreeSet::new()),
        })
    }

    /// The bucket, in object-storage mode.
    pub(crate) fn bucket(&self) -> Option<&Arc<Bucket>> {
        match &self.backend {
            Backend::Local(_) => None,
            Backend::Bucket(bucket, _) => Some(bucket),
        }
    }

    /// Every block in the store, with its length; objects that are not blocks are skipped with
    /// a warning.
    pub(crate) fn list(&self) -> Result<Vec<(BlockName, u64)>, StoreError> {
        Ok(self
            .list_with_times()?
            .into_iter()
            .map(|(name, len, _)| (name, len))
            .collect())
    }

    /// [`Files::list`] with each block's Last-Modified (Unix ms, the store's clock).
    pub(crate) fn list_with_times(&self) -> Result<Vec<(BlockName, u64, u64)>, StoreError> {
        let mut out = Vec::new();
        match &self.backend {
            Backend::Local(store) => block_on(async {
                let top = store
                    .list_with_delimiter(None)
                    .await
                    .map_err(|err| object_error("listing", "the block directory", err))?;
                for prefix in top.common_prefixes {
                    let listing = store
                        .list_with_delimiter(Some(&prefix))
                        .await
                        .map_err(|err| object_error("listing", prefix.as_ref(), err))?;
                    for object in listing.objects {
                        match BlockName::parse(&object.location) {
                            Some(name) => out.push((name, object.size, millis(&object))),
                            None => warn!(object = %object.location, "not a block; left alone"),
                        }
                    }
                }
                for object in top.objects {
                    warn!(object = %object.location, "not a block; left alone");
                }
                Ok::<_, StoreError>(())
            })?,
            Backend::Bucket(bucket, _) => {
                for object in bucket.list(BLOCKS).map_err(bucket_error)? {
                    let name = bucket
                        .key(&object.location)
                        .and_then(|key| key.strip_prefix(BLOCKS))
                        .and_then(|key| BlockName::parse(&ObjectPath::from(key)));
                    match name {
                        Some(name) => out.push((name, object.size, millis(&object))),
                        None => warn!(object = %object.location, "not a block; left alone"),
                    }
                }
            }
        }
        out.sort();
        Ok(out)
    }

    /// Whether this process wrote block `id` ([`Files::put`], [`Files::upload`]).
    pub(crate) fn written_here(&self, id: &str) -> bool {
        self.written.lock().expect("written lock").contains(id)
    }

    fn note_written(&self, name: &BlockName) {
        self.written
            .lock()
            .expect("written lock")
            .insert(name.id.clone());
    }

    /// Writes block `name` whole; durable (fsynced, or stored in the bucket) when this returns.
    pub(crate) fn put(&self, name: &BlockName, bytes: Vec<u8>) -> Result<(), StoreError> {
        self.note_written(name);
        match &self.backend {
            Backend::Local(store) => block_on(store.put(&name.path(), PutPayload::from(bytes)))
                .map(|_| ())
                .map_err(|err| object_error("writing", &name.to_string(), err)),
            Backend::Bucket(bucket, cache) => {
                let bytes = bytes::Bytes::from(bytes);
                bucket
                    .put(&bucket_key(name), bytes.clone())
                    .map_err(bucket_error)?;
                // A copy the cache has no room for costs a download when the block is read.
                let mut copy = cache.reserve(name);
                if copy.write(&bytes) {
                    copy.finish();
                }
                Ok(())
            }
        }
    }

    /// Starts writing block `name` in pieces; see [`Upload`].
    pub(crate) fn upload(&self, name: &BlockName) -> Result<Upload<'_>, StoreError> {
        self.note_written(name);
        let writer = match &self.backend {
            Backend::Local(store) => {
                let upload = block_on(store.put_multipart(&name.path()))
                    .map_err(|err| object_error("starting", &name.to_string(), err))?;
                Writer::Local(WriteMultipart::new(upload))
            }
            Backend::Bucket(bucket, cache) => Writer::Bucket {
                upload: bucket.upload(&bucket_key(name)).map_err(bucket_error)?,
                copy: cache.reserve(name),
            },
        };
        Ok(Upload {
            name: name.clone(),
            writer: Some(writer),
        })
    }

    /// Deletes block `name` (and its cached copy); a block already gone is not an error.
    pub(crate) fn delete(&self, name: &BlockName) -> Result<(), StoreError> {
        match &self.backend {
            Backend::Local(store) => match block_on(store.delete(&name.path())) {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(err) => Err(object_error("deleting", &name.to_string(), err)),
            },
            Backend::Bucket(bucket, cache) => {
                bucket.delete(&bucket_key(name)).map_err(bucket_error)?;
                cache.forget(name);
                Ok(())
            }
        }
    }

    /// Removes the cached copy of block `name` (object-storage mode), leaving the bucket's.
    pub(crate) fn forget_cached(&self, name: &BlockName) {
        if let Backend::Bucket(_, cache) = &self.backend {
            cache.forget(name);
        }
    }

    /// Deletes the pieces of writes that never finished (a process killed while writing a
    /// block leaves `<block>#<n>` files); returns how many. Only files older than `min_age`
    /// go, so that a write in progress keeps its file.
    pub(crate) fn delete_unfinished(&self, min_age: std::time::Duration) -> u64 {
        let mut deleted = 0;
        let Ok(tenants) = std::fs::read_dir(&self.root) else {
            return 0;
        };
        for tenant in tenants.flatten() {
            let Ok(files) = std::fs::read_dir(tenant.path()) else {
                continue;
            };
            for file in files.flatten() {
                let name = file.file_name();
                let old = file
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age >= min_age);
                if name.to_string_lossy().contains('#') && old {
                    match std::fs::remove_file(file.path()) {
                        Ok(()) => deleted += 1,
                        Err(err) => {
                            warn!(file = %file.path().display(), error = %err, "deleting an unfinished block failed");
                        }
                    }
                }
            }
        }
        deleted
    }

    /// The file of block `name` in the block directory (local mode).
    fn local_path(store: &LocalFileSystem, name: &BlockName) -> Result<PathBuf, StoreError> {
        store
            .path_to_filesystem(&name.path())
            .map_err(|err| object_error("locating", &name.to_string(), err))
    }

    /// Block `name` of `len` bytes, whole (`check`); `None` when it is gone. In object-storage
    /// mode from its cached copy, else downloaded without caching it (a check reads every
    /// block once, which would only push out what queries read).
    pub(crate) fn read_whole(
        &self,
        name: &BlockName,
        len: u64,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let path = match &self.backend {
            Backend::Local(store) => Files::local_path(store, name)?,
            Backend::Bucket(bucket, cache) => {
                if let Some(file) = cache.get(name, len) {
                    let path = cache.path(name);
                    return read_at(&file, 0..len)
                        .map(Some)
                        .map_err(|source| StoreError::Io { path, source });
                }
                return match bucket.get(&bucket_key(name)) {
                    Ok(bytes) => Ok(Some(bytes.to_vec())),
                    Err(err) if err.not_found() => Ok(None),
                    Err(err) => Err(bucket_error(err)),
                };
            }
        };
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(StoreError::Io { path, source }),
        }
    }

    /// Opens block `name` of `len` bytes that this store has just written (a cut's or a
    /// merge's): a block it cannot read back is a failed write.
    pub(crate) fn open_written(&self, name: &BlockName, len: u64) -> Result<BlockFile, StoreError> {
        self.open_block(name, len)
            .map_err(|err| StoreError::Object {
                what: format!("reading back {name}"),
                source: Box::new(err),
            })
    }

    /// Opens block `name` of `len` bytes and decodes what every read needs: from its file, or
    /// in object-storage mode from its cached copy, else with ranged GETs of its end.
    pub(crate) fn open_block(&self, name: &BlockName, len: u64) -> Result<BlockFile, OpenError> {
        let (source, path) = match &self.backend {
            Backend::Local(store) => {
                let path = Files::local_path(store, name).map_err(OpenError::Store)?;
                let file = File::open(&path).map_err(|source| {
                    OpenError::Store(StoreError::Io {
                        path: path.clone(),
                        source,
                    })
                })?;
                (Source::Local(file), path)
            }
            Backend::Bucket(bucket, cache) => (
                Source::Bucket(InBucket {
                    bucket: Arc::clone(bucket),
                    cache: Arc::clone(cache),
                    fetching: std::sync::Mutex::new(()),
                }),
                cache.path(name),
            ),
        };
        BlockFile::open(name.clone(), source, len).map_err(|err| match err {
            Opening::Read(source) if unavailable(&source) => OpenError::Store(StoreError::Object {
                what: format!("opening {name}"),
                source: Box::new(source),
            }),
            Opening::Read(source) => OpenError::Store(StoreError::Io { path, source }),
            Opening::Block(err) => OpenError::Block(err),
        })
    }
}

/// An object's Last-Modified in Unix milliseconds.
fn millis(object: &object_store::ObjectMeta) -> u64 {
    u64::try_from(object.last_modified.timestamp_millis()).unwrap_or(0)
}

/// The bucket key of block `name`.
fn bucket_key(name: &BlockName) -> String {
    format!("{BLOCKS}{}", name.path())
}

/// The bucket did not give a block's bytes: not damage, the read fails and the next tries
/// again. Carried inside the `std::io::Error` of [`BlockFile::read`].
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Unavailable(RequestError);

/// Whether `err` is a read that the bucket failed ([`Unavailable`]), not damage.
pub(crate) fn unavailable(err: &std::io::Error) -> bool {
    err.get_ref().is_some_and(|inner| inner.is::<Unavailable>())
}

/// Where an open block's bytes are.
enum Source {
    /// A file of the block directory (local mode), kept open.
    Local(File),
    /// A block of the bucket.
    Bucket(InBucket),
}

/// Where a block of the bucket is read from: its cached copy, downloaded whole at its first
/// read when the cache has room, else ranged GETs.
struct InBucket {
    bucket: Arc<Bucket>,
    cache: Arc<BlockCache>,
    /// One download of the block at a time: the readers that wait use its copy.
    fetching: std::sync::Mutex<()>,
}

impl InBucket {
    /// The bytes `range` of block `name` of `len` bytes: from its copy, else downloaded whole
    /// (with `whole`, when the cache has room) or by a ranged GET.
    fn read(
        &self,
        name: &BlockName,
        len: u64,
        range: Range<u64>,
        whole: bool,
    ) -> std::io::Result<Vec<u8>> {
        let metrics = self.cache.metrics();
        // Hits and misses count profile reads: opening a block (its end, `whole` false) costs
        // a ranged GET whatever the cache holds, and every block another aggregator cuts is
        // opened, which would dilute the ratio the dashboard shows.
        if let Some(file) = self.cache.get(name, len) {
            if whole {
                metrics.hits.inc();
            }
            return read_at(&file, range);
        }
        if !whole {
            return self.read_range(name, range);
        }
        metrics.misses.inc();
        let _fetching = self.fetching.lock().expect("fetch lock");
        if let Some(file) = self.cache.get(name, len) {
            return read_at(&file, range);
        }
        let mut copy = self.cache.reserve(name);
        // Room is reserved before the download: a block the cache would not keep (a quarter of
        // it, or more than the room reads leave) is never downloaded whole, so that a query of
        // a few series does not download a block many times their size. It is read with
        // ranged GETs.
        if copy.reserve(len) {
            let bytes = self
                .bucket
                .get(&bucket_key(name))
                .map_err(|err| std::io::Error::other(Unavailable(err)))?;
            metrics.downloads.inc();
            if bytes.len() as u64 != len {
                return Err(std::io::Error::other(format!(
                    "downloaded {} bytes of a block listed with {len}",
                    bytes.len()
                )));
            }
            let out = slice(&bytes, &range)?;
            if copy.write(&bytes) {
                copy.finish();
            }
            return Ok(out);
        }
        drop(copy);
        self.read_range(name, range)
    }

    /// The bytes `range` of block `name`, by a ranged GET.
    fn read_range(&self, name: &BlockName, range: Range<u64>) -> std::io::Result<Vec<u8>> {
        self.cache.metrics().ranged_reads.inc();
        let want = range.end - range.start;
        let bytes = self
            .bucket
            .get_range(&bucket_key(name), range)
            .map_err(|err| std::io::Error::other(Unavailable(err)))?;
        if bytes.len() as u64 != want {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
        }
        Ok(bytes.to_vec())
    }
}

/// The bytes `range` of a whole block `bytes`.
fn slice(bytes: &[u8], range: &Range<u64>) -> std::io::Result<Vec<u8>> {
    let start = usize::try_from(range.start).unwrap_or(usize::MAX);
    let end = usize::try_from(range.end).unwrap_or(usize::MAX);
    bytes
        .get(start..end)
        .map(<[u8]>::to_vec)
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))
}

/// A block being written in pieces ([`Files::upload`]).
pub(crate) struct Upload<'f> {
    name: BlockName,
    writer: Option<Writer<'f>>,
}

enum Writer<'f> {
    Local(WriteMultipart),
    /// To the bucket, and to the cache beside it as far as it has room.
    Bucket {
        upload: BucketUpload<'f>,
        copy: Reservation<'f>,
    },
}

impl Upload<'_> {
    /// Appends `bytes`.
    pub(crate) fn write(&mut self, bytes: &[u8]) {
        match self.writer.as_mut().expect("not finished") {
            Writer::Local(writer) => writer.write(bytes),
            Writer::Bucket { upload, copy } => {
                upload.write(bytes);
                // A copy given up (no room, a failed write) costs a download when it is read.
                copy.write(bytes);
            }
        }
    }

    /// Finishes the block; durable when this returns.
    pub(crate) fn finish(mut self) -> Result<(), StoreError> {
        match self.writer.take().expect("not finished") {
            Writer::Local(writer) => block_on(writer.finish())
                .map(|_| ())
                .map_err(|err| object_error("finishing", &self.name.to_string(), err)),
            Writer::Bucket { upload, copy } => {
                upload.finish().map_err(bucket_error)?;
                copy.finish();
                Ok(())
            }
        }
    }
}

impl Drop for Upload<'_> {
    fn drop(&mut self) {
        match self.writer.take() {
            // An abandoned write leaves nothing behind.
            Some(Writer::Local(writer)) => {
                let _ = block_on(writer.abort());
            }
            // The upload is aborted and the copy given up as they drop.
            Some(Writer::Bucket { .. }) | None => {}
        }
    }
}

/// Why a block could not be opened.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OpenError {
    /// The file could not be read.
    #[error(transparent)]
    Store(StoreError),
    /// The file is not a readable block: damaged, truncated, or of a newer format.
    #[error(transparent)]
    Block(BlockError),
}

/// An open block: its name, its decoded footer, index, names and sources, and its file.
pub(crate) struct BlockFile {
    pub(crate) name: BlockName,
    source: Source,
    pub(crate) len: u64,
    pub(crate) footer: Footer,
    pub(crate) index: Index,
    pub(crate) names: Names,
    /// Where its span chunks are (empty without span profiles).
    pub(crate) spans: SpanIndex,
    /// Ids of the blocks it replaces.
    pub(crate) sources: Vec<String>,
    /// The app deletions it was built with, one per app in app order (`deletions.rs`).
    pub(crate) deletions: Vec<smolder_block::Deletion>,
    /// The cut blocks whose data it holds: itself, or its sources' (`lineage.rs`).
    pub(crate) leaves: std::collections::BTreeSet<String>,
    /// Set when a read found damage: reads and compaction leave it alone from then on.
    bad: AtomicBool,
}

/// Why [`BlockFile::open`] failed.
enum Opening {
    Read(std::io::Error),
    Block(BlockError),
}

impl BlockFile {
    /// Decodes block `name` of `len` bytes from `source`: its end first (tail, directory and
    /// the small sections, usually in one read), then whatever of the index and names lay
    /// before it.
    fn open(name: BlockName, source: Source, len: u64) -> Result<BlockFile, Opening> {
        let limits = Limits::default();
        // Opening reads only the end of a block of the bucket: its profiles may never be read.
        let read = |range: Range<u64>| match &source {
            Source::Local(file) => read_at(file, range),
            Source::Bucket(in_bucket) => in_bucket.read(&name, len, range, false),
        };
        let block = Opening::Block;
        let suffix_start = len.saturating_sub(SUFFIX);
        let suffix = read(suffix_start..len).map_err(Opening::Read)?;
        let covering = |range: Range<u64>| covering(&read, suffix_start, &suffix, range);
        let fetched = Fetched::new(suffix_start, &suffix);
        let tail = Tail::decode(len, &fetched).map_err(block)?;
        let directory = covering(tail.directory_range()).map_err(Opening::Read)?;
        let footer = Footer::decode(&tail, &directory.fetched()).map_err(block)?;
        let index_bytes = covering(footer.index_range()).map_err(Opening::Read)?;
        let index = Index::decode(&footer, &index_bytes.fetched(), &limits).map_err(block)?;
        let names_bytes = covering(footer.names_range()).map_err(Opening::Read)?;
        let names = Names::decode(&footer, &names_bytes.fetched(), &limits).map_err(block)?;
        let spans = match footer.span_index_range() {
            Some(range) => {
                let bytes = covering(range).map_err(Opening::Read)?;
                SpanIndex::decode(&footer, &index, &bytes.fetched(), &limits).map_err(block)?
            }
            None => {
                SpanIndex::decode(&footer, &index, &Fetched::new(0, &[]), &limits).map_err(block)?
            }
        };
        let sources = match footer.sources_range() {
            Some(range) => {
                let bytes = covering(range).map_err(Opening::Read)?;
                footer.sources(&bytes.fetched(), &limits).map_err(block)?
            }
            None => Vec::new(),
        };
        let deletions = match footer.deletions_range() {
            Some(range) => {
                let bytes = covering(range).map_err(Opening::Read)?;
                footer.deletions(&bytes.fetched(), &limits).map_err(block)?
            }
            None => Vec::new(),
        };
        let meta = index.meta();
        if meta.start != name.start
            || meta.span() != name.span
            || meta.tenant != name.tenant.as_str()
        {
            return Err(Opening::Block(BlockError::Malformed {
                section: smolder_block::Section::Meta,
                offset: 0,
                problem: smolder_block::Problem::Invalid {
                    field: "range",
                    reason: "differs from the block's name",
                },
            }));
        }
        let leaves = super::lineage::leaves(&name.id, &sources);
        Ok(BlockFile {
            name,
            source,
            len,
            footer,
            index,
            names,
            spans,
            sources,
            deletions,
            leaves,
            bad: AtomicBool::new(false),
        })
    }

    /// Reads the bytes of `range`: from its file, or in object-storage mode from its cached
    /// copy, downloaded first when it has none. An error that [`unavailable`] recognises is the
    /// bucket's, not damage.
    pub(crate) fn read(&self, range: Range<u64>) -> std::io::Result<Vec<u8>> {
        match &self.source {
            Source::Local(file) => read_at(file, range),
            Source::Bucket(in_bucket) => in_bucket.read(&self.name, self.len, range, true),
        }
    }

    /// Its finest bucket, in seconds.
    pub(crate) fn finest(&self) -> u64 {
        self.index.meta().finest()
    }

    /// The horizon of the deletion of `app` it was built with, if any.
    pub(crate) fn listed(&self, app: &str) -> Option<u64> {
        self.deletions
            .binary_search_by(|d| d.app.as_str().cmp(app))
            .ok()
            .map(|at| self.deletions[at].horizon)
    }

    /// Whether a read found it damaged.
    pub(crate) fn is_bad(&self) -> bool {
        self.bad.load(Ordering::Relaxed)
    }

    /// Marks it damaged; returns whether it was not already.
    pub(crate) fn mark_bad(&self) -> bool {
        !self.bad.swap(true, Ordering::Relaxed)
    }
}

/// Bytes read from a file at an offset, as a [`Fetched`].
struct Owned {
    start: u64,
    bytes: Vec<u8>,
}

impl Owned {
    fn fetched(&self) -> Fetched<'_> {
        Fetched::new(self.start, &self.bytes)
    }
}

/// The bytes of `range`: from `suffix` (the block's bytes from `suffix_start` to its end) when
/// it holds them, else read.
fn covering(
    read: &dyn Fn(Range<u64>) -> std::io::Result<Vec<u8>>,
    suffix_start: u64,
    suffix: &[u8],
    range: Range<u64>,
) -> std::io::Result<Owned> {
    let bytes = match range.start.checked_sub(suffix_start) {
        Some(from) => {
            let from = usize::try_from(from).unwrap_or(usize::MAX);
            let to =
                from.saturating_add(usize::try_from(range.end - range.start).unwrap_or(usize::MAX));
            match suffix.get(from..to) {
                Some(bytes) => bytes.to_vec(),
                None => read(range.clone())?,
            }
        }
        None => read(range.clone())?,
    };
    Ok(Owned {
        start: range.start,
        bytes,
    })
}

fn read_at(file: &File, range: Range<u64>) -> std::io::Result<Vec<u8>> {
    let len = usize::try_from(range.end.saturating_sub(range.start))
        .map_err(|_| std::io::Error::other("range larger than memory"))?;
    let mut bytes = vec![0; len];
    file.read_exact_at(&mut bytes, range.start)?;
    Ok(bytes)
}

/// The store's blocks, as an immutable snapshot: reads take one and work from it while the
/// writer publishes the next.
#[derive(Clone, Default)]
pub(crate) struct BlockSet {
    /// Live blocks, by tenant, sorted by name (start first).
    pub(crate) blocks: std::collections::BTreeMap<Tenant, Vec<Arc<BlockFile>>>,
    /// Object-storage mode: blocks of the bucket opened but not shown, as `lineage.rs`
    /// resolves them (merges' inputs until a compactor deletes them, merges that lost), by
    /// tenant, sorted by name; they show again when what hides them goes.
    pub(crate) held: std::collections::BTreeMap<Tenant, Vec<Arc<BlockFile>>>,
    /// Per block id, the apps whose series reads hide in it (app deletions, as
    /// `deletions.rs` marks them).
    pub(crate) hidden: std::collections::HashMap<String, std::collections::BTreeSet<String>>,
    /// Per block id, the positions of the batches (in its index's markers) whose separable
    /// trees reads leave out: another block holds them too (object-storage mode, `dedupe.rs`).
    pub(crate) skip: std::collections::HashMap<String, Arc<std::collections::HashSet<u32>>>,
}

impl BlockSet {
    /// The live blocks of `tenant` overlapping `[from, until)`.
    pub(crate) fn overlapping(
        &self,
        tenant: &Tenant,
        from: u64,
        until: u64,
    ) -> impl Iterator<Item = &Arc<BlockFile>> {
        self.blocks
            .get(tenant)
            .into_iter()
            .flatten()
            .filter(move |b| b.name.start < until && b.name.end() > from && !b.is_bad())
    }

    /// Every live block.
    pub(crate) fn all(&self) -> impl Iterator<Item = &Arc<BlockFile>> {
        self.blocks.values().flatten()
    }

    /// Whether block `id` hides the series of `app`.
    pub(crate) fn hides(&self, id: &str, app: &str) -> bool {
        self.hidden.get(id).is_some_and(|apps| apps.contains(app))
    }

    /// The batches reads of block `id` leave out, if any.
    pub(crate) fn skipped(&self, id: &str) -> Option<&std::collections::HashSet<u32>> {
        self.skip.get(id).map(|positions| &**positions)
    }

    /// Adds `block`, unless a block of its name is there (shown or held); in object-storage mode
    /// `dedupe.rs` then says whether it shows.
    pub(crate) fn insert(&mut self, block: Arc<BlockFile>) {
        if self
            .held
            .get(&block.name.tenant)
            .is_some_and(|held| held.iter().any(|b| b.name == block.name))
        {
            return;
        }
        let list = self.blocks.entry(block.name.tenant.clone()).or_default();
        let at = list.partition_point(|b| b.name < block.name);
        if list.get(at).is_none_or(|b| b.name != block.name) {
            list.insert(at, block);
        }
    }

    /// Every block known, shown or held.
    pub(crate) fn candidates(&self) -> impl Iterator<Item = &Arc<BlockFile>> {
        self.blocks.values().chain(self.held.values()).flatten()
    }

    /// Whether a block of id `id` is known, shown or held.
    pub(crate) fn knows(&self, id: &str) -> bool {
        self.candidates().any(|b| b.name.id == id)
    }

    /// Removes the blocks named in `ids`, shown or held; returns them.
    pub(crate) fn remove(
        &mut self,
        ids: &std::collections::BTreeSet<String>,
    ) -> Vec<Arc<BlockFile>> {
        let mut removed = Vec::new();
        for list in self.blocks.values_mut().chain(self.held.values_mut()) {
            list.retain(|b| {
                let gone = ids.contains(&b.name.id);
                if gone {
                    removed.push(Arc::clone(b));
                }
                !gone
            });
        }
        self.blocks.retain(|_, list| !list.is_empty());
        self.held.retain(|_, list| !list.is_empty());
        for id in ids {
            self.skip.remove(id);
        }
        removed
    }

    /// Bytes of every live block.
    pub(crate) fn bytes(&self) -> u64 {
        self.all().map(|b| b.len).sum()
    }
}
