//! The spool: every closed window as batches on disk until the aggregator acknowledges them.
//!
//! Input: closed [`Window`]s from the window loop ([`run`] is a window sink). Output: batch
//! frames, oldest first, for the shipper ([`Spool::next`]), which reports each one's fate
//! ([`Spool::acked`], [`Spool::retry`], [`Spool::reject`], [`Spool::resplit`]). Owns the spool
//! directory `<data-dir>/spool/` (`files.rs`): the agent's id, the sequence reservation, the
//! aggregator's last limits, and one file per batch, already framed and compressed as it goes
//! on the wire.
//!
//! A window becomes as many batches as the aggregator's limits ask ([`BatchLimits`], from its
//! last welcome, kept on disk; v0.1's defaults before the first): its series are checked against
//! the limits on labels (a series over them is dropped and counted, the others go on) and split
//! by count and size ([`limits::split`]), each batch with its own sequence number, so that the
//! aggregator's (agent id, sequence) markers still keep each stored once. A batch is written and
//! synced before anything sends it, so a window that reached the spool survives a crash or
//! restart of the agent; it leaves only on an ack, or when a bound drops it: past
//! `spool.max-bytes` the oldest batches go first, past `spool.max-age` the old ones go, a batch
//! damaged on disk goes when it is found, each counted in
//! `smolder_agent_dropped_batches_total{stage="spool",reason}`. A window the disk
//! cannot take (full, or failing) is dropped and counted the same way (`disk_full`,
//! `write_failed`), the loop says so in its health, and the next window is tried afresh: the
//! spool recovers as soon as space returns (acks free it). The bookkeeping is the sans-IO
//! [`queue::Queue`]; this module applies it to the files, on tokio's blocking pool.
//!
//! The agent id lives in the spool on purpose: a batch is identified by (agent id, sequence),
//! so a new spool must mean a new id, or the aggregator would take the new batches for the old
//! ones and drop them as duplicates.

mod files;
mod metrics;
pub mod queue;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};
use smolder_common::wire::{
    BatchLimits, BatchMessage, FrameKind, FrameLimits, SeriesMessage, frame, limits,
};
use smolder_daemon::Heartbeat;
use tokio::sync::{Notify, mpsc};
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::window::Window;

use self::files::{Files, RESERVE};
pub use self::metrics::SpoolMetrics;
use self::queue::{DropReason, Dropped, Queue};

/// Bounds of the on-disk spool.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct SpoolConfig {
    /// Most bytes of batches kept (compressed, as sent); past it the oldest are dropped.
    /// Default 256 MiB.
    pub max_bytes: u64,
    /// Batches older than this are dropped unsent. Default `24h`.
    #[serde(with = "smolder_common::timestamp::serde_duration")]
    pub max_age: Duration,
}

impl Default for SpoolConfig {
    fn default() -> Self {
        SpoolConfig {
            max_bytes: 256 << 20,
            max_age: Duration::from_secs(24 * 3_600),
        }
    }
}

/// Why the spool failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpoolError {
    /// Another agent uses the spool directory (its `LOCK` is held).
    #[error("the spool in {path} is in use by another agent (its LOCK file is held)")]
    Locked {
        /// The spool directory.
        path: PathBuf,
    },
    /// A file of the spool cannot be read, written or deleted; a full disk is one
    /// ([`SpoolError::is_disk_full`]).
    #[error("spool {operation} of {path} failed: {source}")]
    Io {
        /// What was being done.
        operation: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// What the OS said (in the message: this is where the chain ends).
        source: std::io::Error,
    },
    /// A v0.1 spool (sled) in the spool directory cannot be read to move its batches.
    #[error("cannot read the v0.1 spool in {path} to migrate it")]
    Migrate {
        /// The spool directory.
        path: PathBuf,
        /// What sled said.
        #[source]
        source: sled::Error,
    },
    /// A record of the spool is not what this agent writes.
    #[error("corrupt spool record {key}: {reason}")]
    Corrupt {
        /// The record's key or file.
        key: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// Encoding or writing the batch panicked, which is a bug.
    #[error("spooling failed unexpectedly: {reason}")]
    Panicked {
        /// What tokio said.
        reason: String,
    },
}

impl SpoolError {
    /// Whether the disk (or the user's quota on it) is full.
    pub fn is_disk_full(&self) -> bool {
        const ENOSPC: i32 = 28;
        const EDQUOT: i32 = 122;
        matches!(self, SpoolError::Io { source, .. }
            if source.kind() == std::io::ErrorKind::StorageFull
                || matches!(source.raw_os_error(), Some(ENOSPC | EDQUOT)))
    }
}

/// The spool. Cheap to clone; clones share the directory and the queue.
#[derive(Clone)]
pub struct Spool {
    inner: Arc<Inner>,
}

struct Inner {
    files: Files,
    /// A temporary spool's directory, deleted with the spool.
    temporary: Option<PathBuf>,
    agent_id: String,
    state: Mutex<State>,
    waiting: Notify,
    metrics: SpoolMetrics,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(dir) = &self.temporary {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

struct State {
    queue: Queue,
    /// The next sequence number to give out.
    next_sequence: u64,
    /// Numbers below this are reserved on disk; past it, a new reservation comes first.
    reserved: u64,
    /// What a batch may hold, from the aggregator's last welcome.
    limits: BatchLimits,
}

/// What [`Spool::push`] did with a window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pushed {
    /// Batches written.
    pub batches: usize,
    /// Series dropped over the aggregator's limits (labels, size).
    pub refused_series: usize,
}

/// What one blocking write of frames did.
struct Written {
    /// (sequence, bytes) of each batch written, in order.
    written: Vec<(u64, u64)>,
    /// Bytes of the batches not written.
    lost: Vec<(u64, u64)>,
    error: Option<SpoolError>,
}

impl Spool {
    /// Opens the spool in `dir` (created if missing; a v0.1 spool there is migrated), or, with
    /// no `dir`, in a temporary directory deleted when the spool is dropped (an agent embedded
    /// in tests). Batches left by an earlier run are sent first.
    ///
    /// # Errors
    ///
    /// [`SpoolError::Locked`] when another agent uses the directory; [`SpoolError::Io`],
    /// [`SpoolError::Migrate`] or [`SpoolError::Corrupt`] when it cannot be read.
    pub fn open(
        dir: Option<&Path>,
        config: &SpoolConfig,
        metrics: SpoolMetrics,
    ) -> Result<Spool, SpoolError> {
        let (path, temporary) = match dir {
            Some(dir) => (dir.to_owned(), None),
            None => {
                let bytes: [u8; 8] = rand::random();
                let name: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
                let path = std::env::temp_dir().join(format!("smolder-spool-{name}"));
                (path.clone(), Some(path))
            }
        };
        let files = Files::open(&path)?;
        if let Some(moved) = files::migrate_sled(&files)? {
            info!(batches = moved, path = %path.display(), "moved the v0.1 spool (sled) into files");
        }
        let agent_id = match files.agent_id()? {
            Some(id) => id,
            None => {
                let bytes: [u8; 16] = rand::random();
                let id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
                files.set_agent_id(&id)?;
                info!(agent_id = %id, "new agent id");
                id
            }
        };
        let mut queue = Queue::new(config.max_bytes, config.max_age);
        let mut last = 0;
        for found in files.scan()? {
            last = found.sequence;
            if found.damaged {
                files.delete(found.sequence)?;
                metrics.dropped(&Dropped {
                    sequence: found.sequence,
                    bytes: found.bytes,
                    reason: DropReason::Corrupt,
                });
                warn!(
                    sequence = found.sequence,
                    "a spooled batch was damaged on disk; dropped"
                );
                continue;
            }
            // Bounds may have shrunk since the last run; they apply to what is on disk too.
            for dropped in queue.push(found.sequence, found.bytes, found.created) {
                files.delete(dropped.sequence)?;
                metrics.dropped(&dropped);
            }
        }
        let reserved = files.reserved()?;
        let next_sequence = reserved.max(last + 1);
        if !queue.is_empty() {
            info!(
                batches = queue.len(),
                bytes = queue.bytes(),
                "spooled batches from an earlier run will be sent first"
            );
        }
        let limits = files.limits().unwrap_or(BatchLimits::V0_1);
        let spool = Spool {
            inner: Arc::new(Inner {
                files,
                temporary,
                agent_id,
                state: Mutex::new(State {
                    queue,
                    next_sequence,
                    reserved: next_sequence,
                    limits,
                }),
                waiting: Notify::new(),
                metrics,
            }),
        };
        spool.update_gauges(SystemTime::now());
        Ok(spool)
    }

    /// The agent's id, created with the spool.
    pub fn agent_id(&self) -> &str {
        &self.inner.agent_id
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .expect("spool state lock: held for bookkeeping only, never across I/O")
    }

    /// Runs `work` on the blocking pool with this spool.
    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Spool) -> Result<T, SpoolError> + Send + 'static,
    ) -> Result<T, SpoolError> {
        let spool = self.clone();
        tokio::task::spawn_blocking(move || work(&spool))
            .await
            .map_err(|err| SpoolError::Panicked {
                reason: err.to_string(),
            })?
    }

    /// The limits batches are split to.
    pub fn limits(&self) -> BatchLimits {
        self.state().limits
    }

    /// Takes the aggregator's limits (from its welcome) for the windows spooled from now on,
    /// and keeps them on disk for the next start. Batches spooled already stay as they are.
    ///
    /// # Errors
    ///
    /// [`SpoolError::Io`] when they cannot be stored; they apply to this run regardless.
    pub async fn set_limits(&self, limits: BatchLimits) -> Result<(), SpoolError> {
        {
            let mut state = self.state();
            if state.limits == limits {
                return Ok(());
            }
            state.limits = limits;
        }
        self.blocking(move |spool| spool.inner.files.set_limits(&limits))
            .await
    }

    /// Splits `window` into batches within the aggregator's limits and writes them durably,
    /// each with the next sequence number. Series over the limits on labels, or too large for
    /// any batch, are dropped and counted; so are the batches the disk cannot take.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the work goes on on the blocking pool, and a window written after its
    /// caller went away is sent like any other.
    ///
    /// # Errors
    ///
    /// [`SpoolError::Io`] when a batch cannot be written (the disk is full, or fails): those
    /// batches are lost and counted, the ones written before it are kept.
    pub async fn push(&self, window: Arc<Window>) -> Result<Pushed, SpoolError> {
        self.blocking(move |spool| spool.push_blocking(&window))
            .await
    }

    fn push_blocking(&self, window: &Window) -> Result<Pushed, SpoolError> {
        let limits = self.limits();
        // Encoding a large window's trees takes milliseconds: this runs on the blocking pool.
        let series: Vec<SeriesMessage> = window
            .profiles
            .iter()
            .map(SeriesMessage::from_profile)
            .collect();
        let split = limits::split(series, &limits);
        for (message, refusal) in &split.refused {
            self.inner.metrics.refused(refusal.reason);
            warn!(
                series = %message.app,
                reason = refusal.reason.as_str(),
                message = %refusal.message,
                "a series is over the aggregator's limits; dropped"
            );
        }
        let pushed = Pushed {
            batches: split.batches.len(),
            refused_series: split.refused.len(),
        };
        if split.batches.is_empty() {
            return Ok(pushed);
        }
        let now = SystemTime::now();
        let reserved = self.take_sequences(split.batches.len() as u64);
        // Without numbers (the reservation could not be written) the batches are framed only
        // to count what is lost.
        let first = *reserved.as_ref().unwrap_or(&0);
        let frames = self.frames(split.batches, first, window.start, window.end);
        let outcome = match reserved {
            Ok(_) => self.write(&frames, now),
            Err(error) => Written {
                written: Vec::new(),
                lost: frames
                    .iter()
                    .map(|(s, f)| (*s, f.len() as u64 + 8))
                    .collect(),
                error: Some(error),
            },
        };
        self.record(outcome, now).map(|()| pushed)
    }

    /// Each batch's series framed as a batch of the window, numbered from `first`.
    fn frames(
        &self,
        batches: Vec<Vec<SeriesMessage>>,
        first: u64,
        start: SystemTime,
        end: SystemTime,
    ) -> Vec<(u64, Vec<u8>)> {
        batches
            .into_iter()
            .zip(first..)
            .map(|(series, sequence)| {
                let message =
                    BatchMessage::from_series(&self.inner.agent_id, sequence, start, end, series);
                (sequence, frame::encode(FrameKind::Batch, &message))
            })
            .collect()
    }

    /// Gives out `count` sequence numbers, reserving more on disk first when they run out.
    fn take_sequences(&self, count: u64) -> Result<u64, SpoolError> {
        let (first, reserve) = {
            let mut state = self.state();
            let first = state.next_sequence;
            state.next_sequence += count;
            let reserve =
                (state.next_sequence > state.reserved).then(|| state.next_sequence + RESERVE);
            (first, reserve)
        };
        if let Some(until) = reserve {
            self.inner.files.reserve(until)?;
            let mut state = self.state();
            state.reserved = state.reserved.max(until);
        }
        Ok(first)
    }

    fn write(&self, frames: &[(u64, Vec<u8>)], now: SystemTime) -> Written {
        let (written, error) = self.inner.files.write(frames, now);
        let size = |(sequence, frame): &(u64, Vec<u8>)| (*sequence, frame.len() as u64 + 8);
        Written {
            written: frames[..written].iter().map(size).collect(),
            lost: frames[written..].iter().map(size).collect(),
            error,
        }
    }

    /// Puts what was written into the queue (applying its bounds) and counts what was not.
    fn record(&self, outcome: Written, now: SystemTime) -> Result<(), SpoolError> {
        let Written {
            written,
            lost,
            error,
        } = outcome;
        let metrics = &self.inner.metrics;
        let mut evicted = Vec::new();
        {
            let mut state = self.state();
            for &(sequence, bytes) in &written {
                evicted.extend(state.queue.push(sequence, bytes, now));
            }
        }
        for &(sequence, bytes) in &written {
            metrics.batches_written.inc();
            metrics.bytes_written.inc_by(bytes);
            debug!(sequence, bytes, "batch spooled");
        }
        if !lost.is_empty() {
            let reason = match &error {
                Some(error) if error.is_disk_full() => DropReason::DiskFull,
                _ => DropReason::WriteFailed,
            };
            for (sequence, bytes) in lost {
                metrics.dropped(&Dropped {
                    sequence,
                    bytes,
                    reason,
                });
            }
        }
        let deleted = self.drop_all(&evicted);
        self.update_gauges(now);
        if !written.is_empty() {
            self.inner.waiting.notify_one();
        }
        match error {
            Some(error) => Err(error),
            None => deleted,
        }
    }

    /// The oldest batch not in flight, now in flight: its sequence and its frame.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a batch taken by a cancelled call stays in flight until
    /// [`retry_all`](Self::retry_all).
    ///
    /// # Errors
    ///
    /// [`SpoolError::Io`] when it cannot be read.
    pub async fn next(&self) -> Result<Option<(u64, Vec<u8>)>, SpoolError> {
        self.blocking(|spool| {
            loop {
                let Some(sequence) = spool.state().queue.take_next() else {
                    return Ok(None);
                };
                match spool.inner.files.read(sequence) {
                    Ok(Some(frame)) => return Ok(Some((sequence, frame))),
                    // Evicted between the two steps: take the next one.
                    Ok(None) => {
                        spool.state().queue.acked(sequence);
                    }
                    Err(SpoolError::Corrupt { .. }) => spool.drop_corrupt(sequence)?,
                    Err(err) => {
                        spool.state().queue.retry(sequence);
                        return Err(err);
                    }
                }
            }
        })
        .await
    }

    /// The aggregator acknowledged `sequence`: delete it.
    ///
    /// # Errors
    ///
    /// [`SpoolError::Io`] when the delete fails (the batch is sent again at the next start, and
    /// the aggregator drops the copy).
    pub async fn acked(&self, sequence: u64) -> Result<(), SpoolError> {
        self.blocking(move |spool| {
            spool.state().queue.acked(sequence);
            let deleted = spool.inner.files.delete(sequence);
            spool.update_gauges(SystemTime::now());
            deleted
        })
        .await
    }

    /// `sequence` was not delivered; it is sent again.
    pub fn retry(&self, sequence: u64) {
        self.state().queue.retry(sequence);
        self.inner.waiting.notify_one();
    }

    /// The connection is gone: every batch in flight is sent again.
    pub fn retry_all(&self) {
        self.state().queue.retry_all();
        self.inner.waiting.notify_one();
    }

    /// The aggregator rejected `sequence` for good: drop it.
    ///
    /// # Errors
    ///
    /// [`SpoolError::Io`] when the delete fails.
    pub async fn reject(&self, sequence: u64) -> Result<(), SpoolError> {
        self.blocking(move |spool| spool.reject_blocking(sequence))
            .await
    }

    /// The aggregator refused `sequence` as larger than it takes (nothing of it was read, so
    /// nothing was stored): splits it into batches within the current limits, each with a new
    /// sequence number, in its place. Returns how many batches it became; 0 when splitting
    /// cannot make it smaller (it is dropped then, as rejected).
    ///
    /// # Errors
    ///
    /// [`SpoolError::Io`] when it cannot be read or its parts written (those are counted as
    /// lost).
    pub async fn resplit(&self, sequence: u64) -> Result<usize, SpoolError> {
        self.blocking(move |spool| spool.resplit_blocking(sequence))
            .await
    }

    fn resplit_blocking(&self, sequence: u64) -> Result<usize, SpoolError> {
        let limits = self.limits();
        let Some(bytes) = self.inner.files.read(sequence)? else {
            return Ok(0);
        };
        // The spool's own frame: read under its own size, whatever the aggregator takes.
        let own = FrameLimits {
            max_compressed: u32::MAX,
            max_uncompressed: u32::MAX,
        };
        let Ok(message) = frame::decode::<BatchMessage>(&bytes, FrameKind::Batch, own) else {
            self.drop_corrupt(sequence)?;
            return Ok(0);
        };
        let (start, end) = message.window();
        let size = bytes.len().max(prost::Message::encoded_len(&message));
        let too_big = size as u64 > limits.max_batch_bytes;
        let split = limits::split(message.series, &limits);
        if !too_big || split.batches.is_empty() {
            // The aggregator refuses what its own limits allow: splitting would loop.
            self.reject_blocking(sequence)?;
            return Ok(0);
        }
        for (_, refusal) in &split.refused {
            self.inner.metrics.refused(refusal.reason);
        }
        let first = self.take_sequences(split.batches.len() as u64)?;
        let now = SystemTime::now();
        let frames = self.frames(split.batches, first, start, end);
        let parts = frames.len();
        let outcome = self.write(&frames, now);
        let written = outcome.error.is_none();
        self.record(outcome, now)?;
        if written {
            self.state().queue.acked(sequence);
            self.inner.files.delete(sequence)?;
            self.update_gauges(now);
            info!(
                sequence,
                parts, "a batch over the aggregator's limit was split"
            );
        }
        Ok(parts)
    }

    /// Drops batch `sequence`, damaged on disk, and counts it.
    fn drop_corrupt(&self, sequence: u64) -> Result<(), SpoolError> {
        warn!(sequence, "a spooled batch was damaged on disk; dropped");
        let dropped = self.state().queue.remove(sequence, DropReason::Corrupt);
        let deleted = self.drop_all(dropped.as_slice());
        self.update_gauges(SystemTime::now());
        deleted
    }

    fn reject_blocking(&self, sequence: u64) -> Result<(), SpoolError> {
        let dropped = self.state().queue.remove(sequence, DropReason::Rejected);
        let deleted = self.drop_all(dropped.as_slice());
        self.update_gauges(SystemTime::now());
        deleted
    }

    /// Drops batches older than `spool.max-age` at `now`.
    ///
    /// # Errors
    ///
    /// [`SpoolError::Io`] when a delete fails.
    pub async fn expire(&self, now: SystemTime) -> Result<(), SpoolError> {
        self.blocking(move |spool| {
            let dropped = spool.state().queue.expire(now);
            let deleted = spool.drop_all(&dropped);
            spool.update_gauges(now);
            deleted
        })
        .await
    }

    /// Whether a batch waits to be sent.
    pub fn has_waiting(&self) -> bool {
        self.state().queue.has_waiting()
    }

    /// Batches in the spool, sent or not.
    pub fn len(&self) -> usize {
        self.state().queue.len()
    }

    /// Whether the spool is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Resolves when a batch may be waiting: one was spooled or put back since the last call.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a wake-up not taken stays for the next call.
    pub async fn waiting(&self) {
        self.inner.waiting.notified().await;
    }

    /// Deletes `dropped` and counts them; every one is tried, the first failure is returned.
    fn drop_all(&self, dropped: &[Dropped]) -> Result<(), SpoolError> {
        let mut first = Ok(());
        for batch in dropped {
            if let Err(err) = self.inner.files.delete(batch.sequence)
                && first.is_ok()
            {
                first = Err(err);
            }
            self.inner.metrics.dropped(batch);
            match batch.reason {
                DropReason::Full | DropReason::Expired => warn!(
                    sequence = batch.sequence,
                    bytes = batch.bytes,
                    reason = batch.reason.as_str(),
                    "dropped an unsent batch (spool.max-bytes, spool.max-age)"
                ),
                DropReason::Rejected
                | DropReason::DiskFull
                | DropReason::WriteFailed
                | DropReason::Corrupt => {}
            }
        }
        first
    }

    fn update_gauges(&self, now: SystemTime) {
        let state = self.state();
        let metrics = &self.inner.metrics;
        metrics
            .bytes
            .set(i64::try_from(state.queue.bytes()).unwrap_or(i64::MAX));
        metrics
            .batches
            .set(i64::try_from(state.queue.len()).unwrap_or(i64::MAX));
        metrics
            .oldest_age
            .set(state.queue.oldest_age(now).as_secs_f64());
    }
}

/// How often the age bound and the age gauge are brought up to date, and the spool loop's
/// heartbeat period when idle.
pub(crate) const EXPIRE_INTERVAL: Duration = Duration::from_secs(10);

/// A window's write taking longer than this makes the spool loop degraded ("the disk is slow"):
/// a healthy disk writes and syncs a window's batches in milliseconds, and past a few seconds
/// the window loop's queue (four windows) starts to drop windows.
const SLOW_WRITE: Duration = Duration::from_secs(2);

/// The window sink: spools every closed window until the window loop stops, and applies the
/// age bound on an interval. Beats `heartbeat` after each window written; is degraded, with
/// the reason, while windows cannot be written (a full or failing disk: they are dropped and
/// counted) or take longer than [`SLOW_WRITE`]; a write that blocks for good stops the beats.
pub async fn run(spool: Spool, mut windows: mpsc::Receiver<Arc<Window>>, heartbeat: Heartbeat) {
    let task = async move {
        let mut ticker = tokio::time::interval(EXPIRE_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tokio::select! {
                window = windows.recv() => match window {
                    Some(window) => {
                        let started = Instant::now();
                        let outcome = spool.push(window).await;
                        let took = started.elapsed();
                        match outcome {
                            Ok(_) => {
                                if failing {
                                    info!("spooling works again");
                                    failing = false;
                                }
                                if took > SLOW_WRITE {
                                    heartbeat.degraded(format_args!(
                                        "the spool's disk is slow: writing a window took {:.1} s",
                                        took.as_secs_f64()
                                    ));
                                } else {
                                    heartbeat.beat();
                                }
                            }
                            Err(err) => {
                                let error_type = if err.is_disk_full() { "disk_full" } else { "write" };
                                spool.inner.metrics.tier.error(error_type);
                                if !failing {
                                    error!(
                                        error = %err,
                                        "spooling a window failed; windows are dropped (and counted) until it works again"
                                    );
                                    failing = true;
                                }
                                heartbeat.degraded(format_args!(
                                    "windows are dropped: {}",
                                    err
                                ));
                            }
                        }
                    }
                    None => break,
                },
                _ = ticker.tick() => {
                    if let Err(err) = spool.expire(SystemTime::now()).await {
                        spool.inner.metrics.tier.error("expire");
                        warn!(error = %err, "applying spool.max-age failed; retrying at the next tick");
                    }
                    heartbeat.alive();
                }
            }
        }
    };
    task.instrument(info_span!("spool")).await;
}

#[cfg(test)]
mod tests {
    use smolder_common::{Profile, ProfileMeta, Tree};

    use super::*;

    /// The spool's metrics in a registry of their own, and that registry.
    fn own_metrics() -> (SpoolMetrics, prometheus::Registry) {
        let registry = prometheus::Registry::new();
        let metrics = SpoolMetrics::new(&registry, &crate::tier::TierCounters::new(&registry));
        (metrics, registry)
    }

    fn window(series: usize, labels: usize) -> Arc<Window> {
        let start = std::time::UNIX_EPOCH + Duration::from_secs(1_000);
        let profiles = (0..series)
            .map(|i| {
                let mut tree = Tree::new();
                tree.insert_names(["main", &format!("f{i}")], i as u64 + 1);
                let labels: Vec<String> = (0..labels).map(|l| format!("l{l}=v")).collect();
                Profile {
                    series: format!("s{i}.cpu{{{}}}", labels.join(",")).parse().unwrap(),
                    meta: ProfileMeta::default(),
                    from: start,
                    until: start + Duration::from_secs(10),
                    tree,
                }
            })
            .collect();
        Arc::new(Window {
            start,
            end: start + Duration::from_secs(10),
            profiles,
        })
    }

    async fn drain(spool: &Spool) -> Vec<(u64, BatchMessage)> {
        let mut out = Vec::new();
        while let Some((sequence, frame)) = spool.next().await.unwrap() {
            let own = FrameLimits {
                max_compressed: u32::MAX,
                max_uncompressed: u32::MAX,
            };
            out.push((
                sequence,
                frame::decode(&frame, FrameKind::Batch, own).unwrap(),
            ));
        }
        out
    }

    #[tokio::test]
    async fn a_window_is_split_to_the_limits_and_numbered_once_per_batch() {
        let (metrics, registry) = own_metrics();
        let spool = Spool::open(None, &SpoolConfig::default(), metrics.clone()).unwrap();
        spool
            .set_limits(BatchLimits {
                max_series: 4,
                max_labels: 2,
                ..BatchLimits::V0_1
            })
            .await
            .unwrap();
        let pushed = spool.push(window(10, 1)).await.unwrap();
        assert_eq!(
            pushed,
            Pushed {
                batches: 3,
                refused_series: 0
            }
        );
        let pushed = spool.push(window(3, 3)).await.unwrap();
        assert_eq!(
            pushed,
            Pushed {
                batches: 0,
                refused_series: 3
            }
        );
        let batches = drain(&spool).await;
        let shape: Vec<(u64, usize)> = batches
            .iter()
            .map(|(sequence, batch)| (*sequence, batch.series.len()))
            .collect();
        assert_eq!(shape, [(1, 4), (2, 4), (3, 2)]);
        assert!(batches.iter().all(|(s, b)| b.sequence == *s));
        let text = smolder_daemon::metrics::render(&registry).unwrap();
        assert!(
            text.contains("smolder_agent_spool_batches_written_total 3"),
            "{text}"
        );
        assert!(
            text.contains(
                "smolder_agent_dropped_series_total{intentional=\"false\",reason=\"too_many_labels\",stage=\"spool\"} 3"
            ),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_batch_refused_as_too_large_becomes_parts_under_new_numbers() {
        let dir = tempfile::tempdir().unwrap();
        let (metrics, _) = own_metrics();
        let spool =
            Spool::open(Some(dir.path()), &SpoolConfig::default(), metrics.clone()).unwrap();
        spool.push(window(300, 0)).await.unwrap();
        let (sequence, whole) = spool.next().await.unwrap().unwrap();
        let own = FrameLimits {
            max_compressed: u32::MAX,
            max_uncompressed: u32::MAX,
        };
        let whole: BatchMessage = frame::decode(&whole, FrameKind::Batch, own).unwrap();
        let size = prost::Message::encoded_len(&whole) as u64;
        spool
            .set_limits(BatchLimits {
                max_batch_bytes: size / 2 + 1_300,
                ..BatchLimits::V0_1
            })
            .await
            .unwrap();
        let parts = spool.resplit(sequence).await.unwrap();
        assert!(parts >= 2, "{parts}");
        let batches = drain(&spool).await;
        assert_eq!(batches.len(), parts);
        assert!(batches.iter().all(|(s, _)| *s > sequence), "new numbers");
        let series: usize = batches.iter().map(|(_, b)| b.series.len()).sum();
        assert_eq!(series, 300, "every series, once");
        // Splitting what already fits would loop: such a batch is dropped instead.
        let sequence = batches[0].0;
        spool.retry_all();
        assert_eq!(spool.resplit(sequence).await.unwrap(), 0);
        drop(spool);

        // The limits and the numbers survive a restart.
        let (metrics, _) = own_metrics();
        let spool =
            Spool::open(Some(dir.path()), &SpoolConfig::default(), metrics.clone()).unwrap();
        assert_eq!(spool.limits().max_batch_bytes, size / 2 + 1_300);
        assert_eq!(spool.len(), parts - 1);
        spool.push(window(1, 0)).await.unwrap();
        let last = drain(&spool).await.last().unwrap().0;
        assert!(last > batches.last().unwrap().0, "never reused: {last}");
    }

    #[tokio::test]
    async fn a_damaged_batch_is_dropped_and_counted_not_a_stuck_spool() {
        let dir = tempfile::tempdir().unwrap();
        let open = || {
            let (metrics, registry) = own_metrics();
            let spool =
                Spool::open(Some(dir.path()), &SpoolConfig::default(), metrics.clone()).unwrap();
            (spool, registry)
        };
        let (spool, _) = open();
        for _ in 0..3 {
            spool.push(window(2, 0)).await.unwrap();
        }
        drop(spool);
        let batch = |sequence: u64| dir.path().join(format!("batches/{sequence:020}"));
        // One cut short, one whose frame is garbage.
        std::fs::write(batch(1), b"abc").unwrap();
        let mut garbage = std::fs::read(batch(2)).unwrap();
        garbage.truncate(8);
        garbage.extend_from_slice(b"not a frame");
        std::fs::write(batch(2), garbage).unwrap();

        let (spool, registry) = open();
        assert_eq!(spool.len(), 2, "the short one is dropped at open");
        let (sequence, _) = spool.next().await.unwrap().unwrap();
        assert_eq!(sequence, 2);
        // Refused by the aggregator, it cannot be split: dropped as damaged.
        assert_eq!(spool.resplit(2).await.unwrap(), 0);
        assert_eq!(drain(&spool).await.len(), 1);
        let text = smolder_daemon::metrics::render(&registry).unwrap();
        assert!(
            text.contains(
                "smolder_agent_dropped_batches_total{intentional=\"false\",reason=\"corrupt\",stage=\"spool\"} 2"
            ),
            "{text}"
        );
    }
}
