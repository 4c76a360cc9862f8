//! The spool's directory: one file per batch, written so that a batch is either whole on disk or
//! absent, with plain file I/O whose every failure (a full disk first) is an error the caller
//! sees. Blocking; the spool calls it on tokio's blocking pool.
//!
//! ```text
//! <dir>/LOCK            flock(2)ed while an agent uses the spool
//! <dir>/agent-id        the agent's id, 32 hex digits
//! <dir>/sequence        sequence numbers below it may have been used (a reservation, so that
//!                       numbers are never reused, written once per RESERVE batches)
//! <dir>/limits          the aggregator's limits last announced (BatchLimits), for splitting
//! <dir>/batches/<seq>   one batch: 8 bytes of creation time (Unix ms, big-endian), then its frame
//! <dir>/batches/*.tmp   a batch being written; deleted at open
//! ```
//!
//! A batch is written to `<seq>.tmp`, synced, renamed to `<seq>`, and the directory synced once
//! for all the batches of a window: a crash leaves each batch whole or absent. A batch leaves by
//! an unlink, which needs no sync: one that comes back after a crash is sent again, and the
//! aggregator's (agent id, sequence) marker keeps it from being stored twice.
//!
//! Agents of v0.1 kept the spool in a sled database in the same directory; sled hangs, without
//! an error, on a full disk. [`migrate_sled`] moves such a spool's id, sequence and batches into
//! this layout at the first start.

use std::fs::{self, File, OpenOptions};
use std::io::{self, ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fs2::FileExt;
use smolder_common::wire::BatchLimits;

use super::SpoolError;

/// Sequence numbers reserved in `sequence` at a time: one synced write per this many batches.
pub(crate) const RESERVE: u64 = 1024;

const LOCK: &str = "LOCK";
const AGENT_ID: &str = "agent-id";
const SEQUENCE: &str = "sequence";
const LIMITS: &str = "limits";
const BATCHES: &str = "batches";
const TMP: &str = "tmp";

/// A batch found on disk at open.
#[derive(Debug)]
pub(crate) struct Found {
    pub(crate) sequence: u64,
    pub(crate) bytes: u64,
    pub(crate) created: SystemTime,
    /// Shorter than its timestamp: damaged since it was written (a crash cannot leave one so,
    /// the rename comes after the sync), and never to be sent.
    pub(crate) damaged: bool,
}

/// The spool's directory, locked.
#[derive(Debug)]
pub(crate) struct Files {
    dir: PathBuf,
    batches: PathBuf,
    /// Held for the lock; closing it releases the lock.
    _lock: File,
}

fn io<'p>(operation: &'static str, path: &'p Path) -> impl FnOnce(io::Error) -> SpoolError + 'p {
    move |source| SpoolError::Io {
        operation,
        path: path.to_owned(),
        source,
    }
}

/// Creates or replaces `path` with `bytes`, durably: a temporary file, synced, renamed over it,
/// and the directory synced.
fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), SpoolError> {
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}.{TMP}"));
    let written = (|| {
        let mut file = File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_data()?;
        fs::rename(&tmp, &path)?;
        sync_dir(dir)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written.map_err(io("write", &path))
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn batch_name(sequence: u64) -> String {
    format!("{sequence:020}")
}

fn unix_millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Files {
    /// Opens (creating it) and locks the spool directory `dir`; deletes batches left half
    /// written.
    ///
    /// # Errors
    ///
    /// [`SpoolError::Locked`] when another agent holds it, [`SpoolError::Io`] when it cannot be
    /// created or read.
    pub(crate) fn open(dir: &Path) -> Result<Files, SpoolError> {
        let batches = dir.join(BATCHES);
        fs::create_dir_all(&batches).map_err(io("create", &batches))?;
        let lock_path = dir.join(LOCK);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io("open", &lock_path))?;
        if let Err(err) = lock.try_lock_exclusive() {
            return Err(
                if err.kind() == ErrorKind::WouldBlock || err.raw_os_error() == Some(11) {
                    SpoolError::Locked {
                        path: dir.to_owned(),
                    }
                } else {
                    SpoolError::Io {
                        operation: "lock",
                        path: lock_path,
                        source: err,
                    }
                },
            );
        }
        let files = Files {
            dir: dir.to_owned(),
            batches,
            _lock: lock,
        };
        for entry in fs::read_dir(&files.batches).map_err(io("list", &files.batches))? {
            let path = entry.map_err(io("list", &files.batches))?.path();
            if path.extension().is_some_and(|ext| ext == TMP) {
                fs::remove_file(&path).map_err(io("delete", &path))?;
            }
        }
        Ok(files)
    }

    /// The directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The agent's id, or `None` for a new spool.
    ///
    /// # Errors
    ///
    /// [`SpoolError::Io`] when it cannot be read, [`SpoolError::Corrupt`] when it is not text.
    pub(crate) fn agent_id(&self) -> Result<Option<String>, SpoolError> {
        let path = self.dir.join(AGENT_ID);
        match fs::read(&path) {
            Ok(bytes) => {
                let id = String::from_utf8(bytes).map_err(|_| SpoolError::Corrupt {
                    key: path.display().to_string(),
                    reason: "not UTF-8",
                })?;
                Ok(Some(id.trim().to_owned()))
            }
            Err(err) if err.kind() == ErrorKind::NotFound => Ok(None),
            Err(source) => Err(SpoolError::Io {
                operation: "read",
                path,
                source,
            }),
        }
    }

    /// Stores the agent's id, durably.
    ///
    /// # Errors
    ///
    /// [`SpoolError::Io`] when it cannot be written.
    pub(crate) fn set_agent_id(&self, id: &str) -> Result<(), SpoolError> {
        write_atomic(&self.dir, AGENT_ID, format!("{id}\n").as_bytes())
    }

    /// The first sequence number not reserved yet (1 for a new spool).
    ///
    /// # Errors
    ///
    /// [`SpoolError::Io`] or [`SpoolError::Corrupt`] when the file is unreadable.
    pub(crate) fn reserved(&self) -> Result<u64, SpoolError> {
        let path = self.dir.join(SEQUENCE);
        match fs::read_to_string(&path) {
            Ok(text) => text.trim().parse().map_err(|_| SpoolError::Corrupt {
                key: path.display().to_string(),
                reason: "not a sequence number",
            }),
            Err(err) if err.kind() == ErrorKind::NotFound => Ok(1),
            Err(source) => Err(SpoolError::Io {
                operation: "read",
                path,
                source,
            }),
        }
    }

    /// Reserves the sequence numbers below `until`, durably.
    ///
    /// # Errors
    ///
    /// [`SpoolError::Io`] when it cannot be written (a full disk).
    pub(crate) fn reserve(&self, until: u64) -> Result<(), SpoolError> {
        write_atomic(&self.dir, SEQUENCE, format!("{until}\n").as_bytes())
    }

    /// The aggregator's limits last stored, if any.
    pub(crate) fn limits(&self) -> Option<BatchLimits> {
        let text = fs::read_to_string(self.dir.join(LIMITS)).ok()?;
        let numbers: Vec<u64> = text
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        let [bytes, series, labels, label_bytes] = numbers[..] else {
            return None;
        };
        let small = |n: u64| u32::try_from(n).ok().filter(|n| *n > 0);
        Some(BatchLimits {
            max_batch_bytes: bytes,
            max_series: small(series)?,
            max_labels: small(labels)?,
            max_label_bytes: small(label_bytes)?,
        })
    }

    /// Stores the aggregator's limits.
    ///
    /// # Errors
    ///
    /// [`SpoolError::Io`] when they cannot be written.
    pub(crate) fn set_limits(&self, limits: &BatchLimits) -> Result<(), SpoolError> {
        let text = format!(
            "{} {} {} {}\n",
            limits.max_batch_bytes, limits.max_series, limits.max_labels, limits.max_label_bytes
        );
        write_atomic(&self.dir, LIMITS, text.as_bytes())
    }

    /// Every batch on disk, in sequence order, the damaged ones marked.
    ///
    /// # Errors
    ///
    /// [`SpoolError::Io`] when the directory or a batch cannot be read.
    pub(crate) fn scan(&self) -> Result<Vec<Found>, SpoolError> {
        let mut found = Vec::new();
        for entry in fs::read_dir(&self.batches).map_err(io("list", &self.batches))? {
            let entry = entry.map_err(io("list", &self.batches))?;
            let name = entry.file_name();
            // Anything that is not a batch's name is not the spool's, and left alone.
            let Some(sequence) = name.to_str().and_then(|n| n.parse::<u64>().ok()) else {
                continue;
            };
            let path = entry.path();
            let mut created = [0u8; 8];
            let mut file = File::open(&path).map_err(io("read", &path))?;
            let len = file.metadata().map_err(io("read", &path))?.len();
            let damaged = len < 8;
            if !damaged {
                io::Read::read_exact(&mut file, &mut created).map_err(io("read", &path))?;
            }
            found.push(Found {
                sequence,
                bytes: len.saturating_sub(8),
                created: UNIX_EPOCH + Duration::from_millis(u64::from_be_bytes(created)),
                damaged,
            });
        }
        found.sort_by_key(|f| f.sequence);
        Ok(found)
    }

    /// Writes `frames`, each under its sequence number, created at `now`; returns how many were
    /// written, in order, before an error (the first error, which the caller counts the rest
    /// under). The directory is synced once, after the last.
    pub(crate) fn write(
        &self,
        frames: &[(u64, Vec<u8>)],
        now: SystemTime,
    ) -> (usize, Option<SpoolError>) {
        let millis = unix_millis(now).to_be_bytes();
        let mut written = 0;
        for (sequence, frame) in frames {
            let name = batch_name(*sequence);
            let path = self.batches.join(&name);
            let tmp = self.batches.join(format!("{name}.{TMP}"));
            let outcome = (|| {
                let mut file = File::create(&tmp)?;
                file.write_all(&millis)?;
                file.write_all(frame)?;
                file.sync_data()?;
                fs::rename(&tmp, &path)
            })();
            if let Err(source) = outcome {
                let _ = fs::remove_file(&tmp);
                return (
                    written,
                    Some(SpoolError::Io {
                        operation: "write",
                        path,
                        source,
                    }),
                );
            }
            written += 1;
        }
        if written > 0
            && let Err(source) = sync_dir(&self.batches)
        {
            // The renames may not survive a crash; the batches are there for this run.
            return (
                written,
                Some(SpoolError::Io {
                    operation: "sync",
                    path: self.batches.clone(),
                    source,
                }),
            );
        }
        (written, None)
    }

    /// The frame of batch `sequence`, or `None` when it is gone.
    ///
    /// # Errors
    ///
    /// [`SpoolError::Io`] when it cannot be read, [`SpoolError::Corrupt`] when it is too short.
    pub(crate) fn read(&self, sequence: u64) -> Result<Option<Vec<u8>>, SpoolError> {
        let path = self.batches.join(batch_name(sequence));
        match fs::read(&path) {
            Ok(mut bytes) if bytes.len() >= 8 => {
                bytes.drain(..8);
                Ok(Some(bytes))
            }
            Ok(_) => Err(SpoolError::Corrupt {
                key: path.display().to_string(),
                reason: "batch file shorter than its timestamp",
            }),
            Err(err) if err.kind() == ErrorKind::NotFound => Ok(None),
            Err(source) => Err(SpoolError::Io {
                operation: "read",
                path,
                source,
            }),
        }
    }

    /// Deletes batch `sequence`; one already gone is fine.
    ///
    /// # Errors
    ///
    /// [`SpoolError::Io`] when the unlink fails.
    pub(crate) fn delete(&self, sequence: u64) -> Result<(), SpoolError> {
        let path = self.batches.join(batch_name(sequence));
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(err) if err.kind() == ErrorKind::NotFound => Ok(()),
            Err(source) => Err(SpoolError::Io {
                operation: "delete",
                path,
                source,
            }),
        }
    }
}

/// The files a v0.1 spool (sled) keeps in the spool directory.
const SLED_FILES: [&str; 3] = ["conf", "db", "blobs"];

/// Moves a v0.1 spool (a sled database in `files`' directory) into `files`: its agent id, its
/// next sequence number and every batch, each as it was spooled; then deletes the sled files.
/// Returns how many batches moved, or `None` when there was no sled spool. Interrupted by a
/// crash, it runs again at the next start: the batches it wrote already are written again
/// under the same numbers.
///
/// # Errors
///
/// [`SpoolError::Migrate`] when the sled database cannot be read, [`SpoolError::Io`] when the
/// new files cannot be written.
pub(crate) fn migrate_sled(files: &Files) -> Result<Option<usize>, SpoolError> {
    let dir = files.dir();
    if !dir.join("conf").exists() || !dir.join("db").exists() {
        return Ok(None);
    }
    let migrate = |source: sled::Error| SpoolError::Migrate {
        path: dir.to_owned(),
        source,
    };
    let moved = {
        let db = sled::Config::new().path(dir).open().map_err(migrate)?;
        let tree = db.open_tree("spool").map_err(migrate)?;
        if let Some(id) = tree.get(b"I").map_err(migrate)? {
            let id = String::from_utf8(id.to_vec()).map_err(|_| SpoolError::Corrupt {
                key: "agent-id".to_owned(),
                reason: "not UTF-8",
            })?;
            files.set_agent_id(&id)?;
        }
        let next = match tree.get(b"N").map_err(migrate)? {
            Some(bytes) => {
                u64::from_be_bytes(bytes.as_ref().try_into().map_err(|_| SpoolError::Corrupt {
                    key: "next-sequence".to_owned(),
                    reason: "sequence is not 8 bytes",
                })?)
            }
            None => 1,
        };
        let mut moved = 0;
        let mut last = 0;
        for entry in tree.scan_prefix(b"S") {
            let (key, value) = entry.map_err(migrate)?;
            let sequence = key
                .get(1..9)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes)
                .ok_or_else(|| SpoolError::Corrupt {
                    key: key.escape_ascii().to_string(),
                    reason: "sequence is not 8 bytes",
                })?;
            let Some(created) = value.get(..8) else {
                continue;
            };
            let created = UNIX_EPOCH
                + Duration::from_millis(u64::from_be_bytes(created.try_into().expect("8 bytes")));
            let (_, error) = files.write(&[(sequence, value[8..].to_vec())], created);
            if let Some(error) = error {
                return Err(error);
            }
            moved += 1;
            last = sequence;
        }
        files.reserve(next.max(last + 1).max(files.reserved()?))?;
        moved
    };
    for name in SLED_FILES {
        let path = dir.join(name);
        let removed = if path.is_dir() {
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        };
        match removed {
            Ok(()) => {}
            Err(err) if err.kind() == ErrorKind::NotFound => {}
            Err(source) => {
                return Err(SpoolError::Io {
                    operation: "delete",
                    path,
                    source,
                });
            }
        }
    }
    // sled's snapshots, `snap.<lsn>`.
    for entry in fs::read_dir(dir).map_err(io("list", dir))? {
        let path = entry.map_err(io("list", dir))?.path();
        if path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("snap."))
        {
            fs::remove_file(&path).map_err(io("delete", &path))?;
        }
    }
    Ok(Some(moved))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_survive_a_reopen_and_half_written_ones_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let files = Files::open(dir.path()).unwrap();
        assert_eq!(files.agent_id().unwrap(), None);
        files.set_agent_id("abc").unwrap();
        assert_eq!(files.reserved().unwrap(), 1);
        files.reserve(1 + RESERVE).unwrap();
        let at = UNIX_EPOCH + Duration::from_secs(1_000);
        let (written, error) = files.write(&[(1, b"one".to_vec()), (2, b"two".to_vec())], at);
        assert_eq!((written, error.is_none()), (2, true));
        std::fs::write(dir.path().join("batches/00000000000000000003.tmp"), b"half").unwrap();
        assert!(
            matches!(Files::open(dir.path()), Err(SpoolError::Locked { .. })),
            "locked while open"
        );
        drop(files);

        let files = Files::open(dir.path()).unwrap();
        assert_eq!(files.agent_id().unwrap().as_deref(), Some("abc"));
        assert_eq!(files.reserved().unwrap(), 1 + RESERVE);
        let found = files.scan().unwrap();
        let seen: Vec<(u64, u64, SystemTime)> = found
            .iter()
            .map(|f| (f.sequence, f.bytes, f.created))
            .collect();
        assert_eq!(seen, [(1, 3, at), (2, 3, at)]);
        assert_eq!(files.read(2).unwrap().as_deref(), Some(&b"two"[..]));
        files.delete(2).unwrap();
        files.delete(2).unwrap();
        assert_eq!(files.read(2).unwrap(), None);
        assert!(!dir.path().join("batches/00000000000000000003.tmp").exists());
    }

    #[test]
    fn limits_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let files = Files::open(dir.path()).unwrap();
        assert_eq!(files.limits(), None);
        let limits = BatchLimits {
            max_batch_bytes: 1 << 20,
            max_series: 7,
            max_labels: 3,
            max_label_bytes: 99,
        };
        files.set_limits(&limits).unwrap();
        assert_eq!(files.limits(), Some(limits));
    }

    #[test]
    fn a_v0_1_spool_moves_into_files() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = sled::Config::new().path(dir.path()).open().unwrap();
            let tree = db.open_tree("spool").unwrap();
            tree.insert(b"I", b"0123456789abcdef".as_slice()).unwrap();
            tree.insert(b"N", &9u64.to_be_bytes()).unwrap();
            for sequence in [4u64, 7] {
                let mut key = vec![b'S'];
                key.extend_from_slice(&sequence.to_be_bytes());
                let mut value = 5_000u64.to_be_bytes().to_vec();
                value.extend_from_slice(format!("frame {sequence}").as_bytes());
                tree.insert(key, value).unwrap();
            }
            db.flush().unwrap();
        }
        let files = Files::open(dir.path()).unwrap();
        assert_eq!(migrate_sled(&files).unwrap(), Some(2));
        assert!(!dir.path().join("db").exists() && !dir.path().join("conf").exists());
        assert_eq!(
            files.agent_id().unwrap().as_deref(),
            Some("0123456789abcdef")
        );
        assert_eq!(files.reserved().unwrap(), 9);
        let found = files.scan().unwrap();
        assert_eq!(found.iter().map(|f| f.sequence).collect::<Vec<_>>(), [4, 7]);
        assert_eq!(found[0].created, UNIX_EPOCH + Duration::from_millis(5_000));
        assert_eq!(files.read(7).unwrap().as_deref(), Some(&b"frame 7"[..]));
        assert_eq!(migrate_sled(&files).unwrap(), None, "once");
    }
}
