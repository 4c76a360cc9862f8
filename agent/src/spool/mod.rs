//! The spool: every closed window as a batch on disk until the aggregator acknowledges it.
//!
//! Input: closed [`Window`]s from the window loop ([`run`] is a window sink). Output: batch
//! frames, oldest first, for the shipper ([`Spool::next`]), which reports each one's fate
//! ([`Spool::acked`], [`Spool::retry`], [`Spool::reject`]). Owns a sled database in
//! `<data-dir>/spool/` holding the agent's id, the next sequence number and the batches, each
//! already framed and compressed as it goes on the wire.
//!
//! A batch is written and flushed before anything sends it, so a window that reached the spool
//! survives a crash or restart of the agent; it leaves only on an ack, or when a bound drops
//! it: past `spool.max-bytes` the oldest batches go first, past `spool.max-age` the old ones go,
//! each counted in `smolder_agent_dropped_batches_total{stage="spool",reason}`. The bookkeeping is the
//! sans-IO [`queue::Queue`]; this module applies it to sled.
//!
//! The agent id lives in the same database as the sequence numbers on purpose: a batch is
//! identified by (agent id, sequence), so a new spool must mean a new id, or the aggregator
//! would take the new batches for the old ones and drop them as duplicates.

mod metrics;
pub mod queue;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use smolder_common::wire::{BatchMessage, FrameKind, frame};
use smolder_daemon::Heartbeat;
use tokio::sync::{Notify, mpsc};
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::window::Window;

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
    /// The spool's database cannot be opened (another agent holds it, or it is damaged).
    #[error("cannot open the spool in {path}")]
    Open {
        /// The spool directory.
        path: PathBuf,
        /// What sled said.
        #[source]
        source: sled::Error,
    },
    /// A read or write of the spool failed.
    #[error("spool {operation} failed")]
    Sled {
        /// What was being done.
        operation: &'static str,
        /// What sled said.
        #[source]
        source: sled::Error,
    },
    /// A record of the spool is not what this agent writes.
    #[error("corrupt spool record {key}: {reason}")]
    Corrupt {
        /// The record's key.
        key: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// Encoding the batch panicked, which is a bug.
    #[error("encoding batch {sequence} failed unexpectedly")]
    Encode {
        /// The batch's sequence number.
        sequence: u64,
    },
}

/// Keys of the spool's one sled tree: the agent id, the next sequence number, and the
/// batches by sequence (big-endian, so that sled's order is send order). One tree, so that a
/// batch and the next sequence number are one atomic write.
const AGENT_ID: &[u8] = b"I";
const NEXT_SEQUENCE: &[u8] = b"N";
const BATCH: u8 = b'S';

fn batch_key(sequence: u64) -> [u8; 9] {
    let mut key = [BATCH; 9];
    key[1..].copy_from_slice(&sequence.to_be_bytes());
    key
}

/// The spool. Cheap to clone; clones share the database and the queue.
#[derive(Clone)]
pub struct Spool {
    inner: Arc<Inner>,
}

struct Inner {
    db: sled::Db,
    batches: sled::Tree,
    agent_id: String,
    state: Mutex<State>,
    waiting: Notify,
    metrics: SpoolMetrics,
}

struct State {
    queue: Queue,
    next_sequence: u64,
}

fn sled(operation: &'static str) -> impl FnOnce(sled::Error) -> SpoolError {
    move |source| SpoolError::Sled { operation, source }
}

fn unix_millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Spool {
    /// Opens the spool in `dir` (created if missing), or, with no `dir`, in a temporary
    /// database deleted when the spool is dropped (an agent embedded in tests). Batches left
    /// by an earlier run are sent first.
    ///
    /// # Errors
    ///
    /// [`SpoolError::Open`] when sled cannot open the directory (another agent uses it);
    /// [`SpoolError::Corrupt`] when a record is damaged.
    pub fn open(
        dir: Option<&Path>,
        config: &SpoolConfig,
        metrics: SpoolMetrics,
    ) -> Result<Spool, SpoolError> {
        let sled_config = match dir {
            Some(dir) => sled::Config::new().path(dir),
            None => sled::Config::new().temporary(true),
        };
        let db = sled_config
            .cache_capacity(16 << 20)
            .open()
            .map_err(|source| SpoolError::Open {
                path: dir.map(Path::to_owned).unwrap_or_default(),
                source,
            })?;
        let batches = db.open_tree("spool").map_err(sled("open"))?;
        let agent_id = match batches.get(AGENT_ID).map_err(sled("read"))? {
            Some(id) => String::from_utf8(id.to_vec()).map_err(|_| SpoolError::Corrupt {
                key: "agent-id".to_owned(),
                reason: "not UTF-8",
            })?,
            None => {
                let bytes: [u8; 16] = rand::random();
                let id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
                batches
                    .insert(AGENT_ID, id.as_bytes())
                    .map_err(sled("write"))?;
                db.flush().map_err(sled("flush"))?;
                info!(agent_id = %id, "new agent id");
                id
            }
        };
        let mut queue = Queue::new(config.max_bytes, config.max_age);
        let mut last = 0;
        for entry in batches.scan_prefix([BATCH]) {
            let (key, value) = entry.map_err(sled("read"))?;
            let sequence = sequence_of(&key[1..])?;
            let created = created_of(&key, &value)?;
            // Bounds may have shrunk since the last run; they apply to what is on disk too.
            for dropped in queue.push(sequence, value.len() as u64, created) {
                batches
                    .remove(batch_key(dropped.sequence))
                    .map_err(sled("delete"))?;
                metrics.dropped(&dropped);
            }
            last = sequence;
        }
        let stored_next = match batches.get(NEXT_SEQUENCE).map_err(sled("read"))? {
            Some(bytes) => sequence_of(&bytes)?,
            None => 1,
        };
        let next_sequence = stored_next.max(last + 1);
        if !queue.is_empty() {
            info!(
                batches = queue.len(),
                bytes = queue.bytes(),
                "spooled batches from an earlier run will be sent first"
            );
        }
        let spool = Spool {
            inner: Arc::new(Inner {
                db,
                batches,
                agent_id,
                state: Mutex::new(State {
                    queue,
                    next_sequence,
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

    /// Encodes `window` as the next batch and writes it durably. Returns its sequence number.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: cancelled after the write, the batch is spooled but not yet counted
    /// in the queue until the next start.
    ///
    /// # Errors
    ///
    /// [`SpoolError::Sled`] when the write or its flush fails; the window is lost then.
    pub async fn push(&self, window: Arc<Window>) -> Result<u64, SpoolError> {
        let sequence = {
            let mut state = self.state();
            let sequence = state.next_sequence;
            state.next_sequence += 1;
            sequence
        };
        let agent_id = self.inner.agent_id.clone();
        let now = SystemTime::now();
        // Encoding a large window's trees takes milliseconds: off the runtime's workers.
        let value = tokio::task::spawn_blocking(move || {
            let message = BatchMessage::from_profiles(
                &agent_id,
                sequence,
                window.start,
                window.end,
                &window.profiles,
            );
            let frame = frame::encode(FrameKind::Batch, &message);
            let mut value = Vec::with_capacity(8 + frame.len());
            value.extend_from_slice(&unix_millis(now).to_be_bytes());
            value.extend_from_slice(&frame);
            value
        })
        .await
        .map_err(|_| SpoolError::Encode { sequence })?;
        let bytes = value.len() as u64;
        let mut batch = sled::Batch::default();
        batch.insert(&batch_key(sequence), value);
        batch.insert(NEXT_SEQUENCE, &(sequence + 1).to_be_bytes());
        self.inner
            .batches
            .apply_batch(batch)
            .map_err(sled("write"))?;
        self.inner.db.flush_async().await.map_err(sled("flush"))?;
        self.inner.metrics.batches_written.inc();
        self.inner.metrics.bytes_written.inc_by(bytes);
        let dropped = self.state().queue.push(sequence, bytes, now);
        self.drop_all(&dropped)?;
        self.update_gauges(now);
        debug!(sequence, bytes, "batch spooled");
        self.inner.waiting.notify_one();
        Ok(sequence)
    }

    /// The oldest batch not in flight, now in flight: its sequence and its frame.
    ///
    /// # Errors
    ///
    /// [`SpoolError::Sled`] when it cannot be read.
    pub fn next(&self) -> Result<Option<(u64, Vec<u8>)>, SpoolError> {
        loop {
            let Some(sequence) = self.state().queue.take_next() else {
                return Ok(None);
            };
            match self
                .inner
                .batches
                .get(batch_key(sequence))
                .map_err(sled("read"))?
            {
                Some(value) if value.len() >= 8 => {
                    return Ok(Some((sequence, value[8..].to_vec())));
                }
                // Evicted between the two steps: take the next one.
                _ => {
                    self.state().queue.acked(sequence);
                }
            }
        }
    }

    /// The aggregator acknowledged `sequence`: delete it.
    ///
    /// # Errors
    ///
    /// [`SpoolError::Sled`] when the delete fails (the batch is sent again later, and the
    /// aggregator drops the copy).
    pub fn acked(&self, sequence: u64) -> Result<(), SpoolError> {
        self.state().queue.acked(sequence);
        self.inner
            .batches
            .remove(batch_key(sequence))
            .map_err(sled("delete"))?;
        self.update_gauges(SystemTime::now());
        Ok(())
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
    /// [`SpoolError::Sled`] when the delete fails.
    pub fn reject(&self, sequence: u64) -> Result<(), SpoolError> {
        let dropped = self.state().queue.remove(sequence, DropReason::Rejected);
        self.drop_all(dropped.as_slice())?;
        self.update_gauges(SystemTime::now());
        Ok(())
    }

    /// Drops batches older than `spool.max-age` at `now`.
    ///
    /// # Errors
    ///
    /// [`SpoolError::Sled`] when a delete fails.
    pub fn expire(&self, now: SystemTime) -> Result<(), SpoolError> {
        let dropped = self.state().queue.expire(now);
        self.drop_all(&dropped)?;
        self.update_gauges(now);
        Ok(())
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

    /// Flushes the database.
    ///
    /// # Errors
    ///
    /// [`SpoolError::Sled`] when the flush fails.
    pub async fn flush(&self) -> Result<(), SpoolError> {
        self.inner
            .db
            .flush_async()
            .await
            .map(|_| ())
            .map_err(sled("flush"))
    }

    fn drop_all(&self, dropped: &[Dropped]) -> Result<(), SpoolError> {
        for batch in dropped {
            self.inner
                .batches
                .remove(batch_key(batch.sequence))
                .map_err(sled("delete"))?;
            self.inner.metrics.dropped(batch);
            match batch.reason {
                DropReason::Rejected => {}
                DropReason::Full | DropReason::Expired => warn!(
                    sequence = batch.sequence,
                    bytes = batch.bytes,
                    reason = batch.reason.as_str(),
                    "dropped an unsent batch (spool.max-bytes, spool.max-age)"
                ),
            }
        }
        Ok(())
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

fn sequence_of(bytes: &[u8]) -> Result<u64, SpoolError> {
    let array: [u8; 8] = bytes.try_into().map_err(|_| SpoolError::Corrupt {
        key: bytes.escape_ascii().to_string(),
        reason: "sequence is not 8 bytes",
    })?;
    Ok(u64::from_be_bytes(array))
}

fn created_of(key: &[u8], value: &[u8]) -> Result<SystemTime, SpoolError> {
    let millis: [u8; 8] = value
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| SpoolError::Corrupt {
            key: key.escape_ascii().to_string(),
            reason: "batch record shorter than its timestamp",
        })?;
    Ok(UNIX_EPOCH + Duration::from_millis(u64::from_be_bytes(millis)))
}

/// How often the age bound and the age gauge are brought up to date, and the spool loop's
/// heartbeat period when idle.
pub(crate) const EXPIRE_INTERVAL: Duration = Duration::from_secs(10);

/// The window sink: spools every closed window until the window loop stops, and applies the
/// age bound on an interval; beats `heartbeat` after each (a disk that blocks a write stops
/// the beats).
pub async fn run(spool: Spool, mut windows: mpsc::Receiver<Arc<Window>>, heartbeat: Heartbeat) {
    let task = async move {
        let mut ticker = tokio::time::interval(EXPIRE_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                window = windows.recv() => match window {
                    Some(window) => {
                        if let Err(err) = spool.push(window).await {
                            spool.inner.metrics.tier.error("write");
                            error!(error = %err, "spooling a window failed; its profiles are lost");
                        }
                    }
                    None => break,
                },
                _ = ticker.tick() => {
                    if let Err(err) = spool.expire(SystemTime::now()) {
                        spool.inner.metrics.tier.error("expire");
                        warn!(error = %err, "applying spool.max-age failed; retrying at the next tick");
                    }
                }
            }
            heartbeat.beat();
        }
        if let Err(err) = spool.flush().await {
            spool.inner.metrics.tier.error("flush");
            error!(error = %err, "final spool flush failed");
        }
    };
    task.instrument(info_span!("spool")).await;
}
