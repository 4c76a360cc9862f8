//! Where blocks live, through the `object_store` crate, and the blocks as the store holds them
//! open: named, decoded down to their index, and read with ranged reads.
//!
//! Input: the `store.object-store` config; output: [`Files`] (list, write, delete blocks) and
//! [`BlockFile`]s (a block's footer, index, names and sources, decoded once, and its bytes read
//! on demand). Callers: the writer (cuts), compaction, retention, reads and `check`.
//!
//! A block is the object `<tenant>/<start>-<span>-<id>.block` (start zero-padded to 12 digits so
//! that names sort by time): its name says whose data it holds and which range without reading
//! it, which is what retention and compaction plan from. With the local backend (the only one
//! until issue 18 adds `s3`) the objects are files under the block directory, written through
//! `LocalFileSystem` with fsync (file and directory) before the write returns, and read with
//! `pread` on a file handle kept open, so a block deleted while a query reads it stays readable.
//! A remote backend would download a block to a local cache first and read it the same way.

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
use smolder_block::{BlockError, Fetched, Footer, Index, Limits, Names, Tail};
use tracing::warn;

use crate::store::StoreError;
use crate::tenant::Tenant;

/// Where blocks are kept: `type: local` (the default) is a directory; issue 18 adds `s3`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum ObjectStoreConfig {
    /// Blocks are files in a local directory.
    Local(LocalConfig),
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
    /// Unique among all blocks (the cache, lineage and app deletions know blocks by it): random
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

/// The block directory, through `object_store`.
pub(crate) struct Files {
    store: LocalFileSystem,
    root: PathBuf,
}

/// Runs an object-store call to completion on this thread. `LocalFileSystem` does its file
/// work inline, or on tokio's blocking pool when called inside a runtime, so this never waits
/// on the calling runtime's own workers. (A remote backend, issue 18, needs a runtime's I/O
/// driver and will run its calls there.)
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

impl Files {
    /// The block directory of `config`, created if needed, under `data_dir` by default.
    pub(crate) fn open(config: &ObjectStoreConfig, data_dir: &Path) -> Result<Files, StoreError> {
        let root = match config {
            ObjectStoreConfig::Local(local) if local.path.as_os_str().is_empty() => {
                data_dir.join("blocks")
            }
            ObjectStoreConfig::Local(local) => local.path.clone(),
        };
        std::fs::create_dir_all(&root).map_err(|source| StoreError::Io {
            path: root.clone(),
            source,
        })?;
        let store = LocalFileSystem::new_with_prefix(&root)
            .map_err(|err| object_error("opening", &root.display().to_string(), err))?
            .with_fsync(true);
        Ok(Files { store, root })
    }

    /// Every block in the store, with its length; objects that are not blocks are skipped with
    /// a warning.
    pub(crate) fn list(&self) -> Result<Vec<(BlockName, u64)>, StoreError> {
        block_on(async {
            let top = self
                .store
                .list_with_delimiter(None)
                .await
                .map_err(|err| object_error("listing", "the block directory", err))?;
            let mut out = Vec::new();
            for prefix in top.common_prefixes {
                let listing = self
                    .store
                    .list_with_delimiter(Some(&prefix))
                    .await
                    .map_err(|err| object_error("listing", prefix.as_ref(), err))?;
                for object in listing.objects {
                    match BlockName::parse(&object.location) {
                        Some(name) => out.push((name, object.size)),
                        None => warn!(object = %object.location, "not a block; left alone"),
                    }
                }
            }
            for object in top.objects {
                warn!(object = %object.location, "not a block; left alone");
            }
            out.sort();
            Ok(out)
        })
    }

    /// Writes block `name` whole; durable when this returns.
    pub(crate) fn put(&self, name: &BlockName, bytes: Vec<u8>) -> Result<(), StoreError> {
        block_on(self.store.put(&name.path(), PutPayload::from(bytes)))
            .map(|_| ())
            .map_err(|err| object_error("writing", &name.to_string(), err))
    }

    /// Starts writing block `name` in pieces; see [`Upload`].
    pub(crate) fn upload(&self, name: &BlockName) -> Result<Upload, StoreError> {
        let upload = block_on(self.store.put_multipart(&name.path()))
            .map_err(|err| object_error("starting", &name.to_string(), err))?;
        Ok(Upload {
            name: name.clone(),
            writer: Some(WriteMultipart::new(upload)),
        })
    }

    /// Deletes block `name`; a block already gone is not an error.
    pub(crate) fn delete(&self, name: &BlockName) -> Result<(), StoreError> {
        match block_on(self.store.delete(&name.path())) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(err) => Err(object_error("deleting", &name.to_string(), err)),
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

    /// The local file of block `name`.
    pub(crate) fn local_path(&self, name: &BlockName) -> Result<PathBuf, StoreError> {
        self.store
            .path_to_filesystem(&name.path())
            .map_err(|err| object_error("locating", &name.to_string(), err))
    }

    /// Opens block `name` of `len` bytes and decodes what every read needs.
    pub(crate) fn open_block(&self, name: &BlockName, len: u64) -> Result<BlockFile, OpenError> {
        let path = self.local_path(name).map_err(OpenError::Store)?;
        let file = File::open(&path).map_err(|source| {
            OpenError::Store(StoreError::Io {
                path: path.clone(),
                source,
            })
        })?;
        BlockFile::open(name.clone(), &path, file, len)
    }
}

/// A block being written in pieces ([`Files::upload`]).
pub(crate) struct Upload {
    name: BlockName,
    writer: Option<WriteMultipart>,
}

impl Upload {
    /// Appends `bytes`.
    pub(crate) fn write(&mut self, bytes: &[u8]) {
        self.writer.as_mut().expect("not finished").write(bytes);
    }

    /// Finishes the block; durable when this returns.
    pub(crate) fn finish(mut self) -> Result<(), StoreError> {
        let writer = self.writer.take().expect("not finished");
        block_on(writer.finish())
            .map(|_| ())
            .map_err(|err| object_error("finishing", &self.name.to_string(), err))
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        if let Some(writer) = self.writer.take() {
            // An abandoned write leaves nothing behind.
            let _ = block_on(writer.abort());
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
    file: File,
    pub(crate) len: u64,
    pub(crate) footer: Footer,
    pub(crate) index: Index,
    pub(crate) names: Names,
    /// Ids of the blocks it replaces.
    pub(crate) sources: Vec<String>,
    /// Set when a read found damage: reads and compaction leave it alone from then on.
    bad: AtomicBool,
}

impl BlockFile {
    fn open(name: BlockName, path: &Path, file: File, len: u64) -> Result<BlockFile, OpenError> {
        let limits = Limits::default();
        let io = |source| {
            OpenError::Store(StoreError::Io {
                path: path.to_owned(),
                source,
            })
        };
        let suffix_start = len.saturating_sub(SUFFIX);
        let suffix = read_at(&file, suffix_start..len).map_err(io)?;
        let fetched = Fetched::new(suffix_start, &suffix);
        let tail = Tail::decode(len, &fetched).map_err(OpenError::Block)?;
        let directory =
            covering(&file, suffix_start, &suffix, tail.directory_range()).map_err(io)?;
        let footer = Footer::decode(&tail, &directory.fetched()).map_err(OpenError::Block)?;
        let index_bytes =
            covering(&file, suffix_start, &suffix, footer.index_range()).map_err(io)?;
        let index =
            Index::decode(&footer, &index_bytes.fetched(), &limits).map_err(OpenError::Block)?;
        let names_bytes =
            covering(&file, suffix_start, &suffix, footer.names_range()).map_err(io)?;
        let names =
            Names::decode(&footer, &names_bytes.fetched(), &limits).map_err(OpenError::Block)?;
        let sources = match footer.sources_range() {
            Some(range) => {
                let bytes = covering(&file, suffix_start, &suffix, range).map_err(io)?;
                footer
                    .sources(&bytes.fetched(), &limits)
                    .map_err(OpenError::Block)?
            }
            None => Vec::new(),
        };
        let meta = index.meta();
        if meta.start != name.start
            || meta.span() != name.span
            || meta.tenant != name.tenant.as_str()
        {
            return Err(OpenError::Block(BlockError::Malformed {
                section: smolder_block::Section::Meta,
                offset: 0,
                problem: smolder_block::Problem::Invalid {
                    field: "range",
                    reason: "differs from the block's name",
                },
            }));
        }
        Ok(BlockFile {
            name,
            file,
            len,
            footer,
            index,
            names,
            sources,
            bad: AtomicBool::new(false),
        })
    }

    /// Reads the bytes of `range`.
    pub(crate) fn read(&self, range: Range<u64>) -> std::io::Result<Vec<u8>> {
        read_at(&self.file, range)
    }

    /// Its finest bucket, in seconds.
    pub(crate) fn finest(&self) -> u64 {
        self.index.meta().finest()
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
/// it holds them, else read from `file`.
fn covering(
    file: &File,
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
                None => read_at(file, range.clone())?,
            }
        }
        None => read_at(file, range.clone())?,
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
    /// Per block id, the apps whose series it no longer shows (app deletions).
    pub(crate) hidden: std::collections::HashMap<String, std::collections::BTreeSet<String>>,
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

    /// Adds `block`.
    pub(crate) fn insert(&mut self, block: Arc<BlockFile>) {
        let list = self.blocks.entry(block.name.tenant.clone()).or_default();
        let at = list.partition_point(|b| b.name < block.name);
        list.insert(at, block);
    }

    /// Removes the blocks named in `ids`; returns them.
    pub(crate) fn remove(
        &mut self,
        ids: &std::collections::BTreeSet<String>,
    ) -> Vec<Arc<BlockFile>> {
        let mut removed = Vec::new();
        for list in self.blocks.values_mut() {
            list.retain(|b| {
                let gone = ids.contains(&b.name.id);
                if gone {
                    removed.push(Arc::clone(b));
                }
                !gone
            });
        }
        self.blocks.retain(|_, list| !list.is_empty());
        removed
    }

    /// Bytes of every live block.
    pub(crate) fn bytes(&self) -> u64 {
        self.all().map(|b| b.len).sum()
    }
}
