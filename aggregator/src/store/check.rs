//! `smolder-aggregator check`: reads every block of a data directory whole and verifies it
//! (`smolder_block::verify`: every checksum, the index against the trees, the rollups against
//! the trees below them, the span profiles against their trees), without opening the head, so
//! it runs beside a live aggregator.
//!
//! Input: the data directory and the store's config (where blocks are). Output: a
//! [`CheckReport`] naming every damaged block. Caller: `main.rs`.

use std::collections::BTreeSet;
use std::path::Path;

use smolder_block::{Limits, verify};

use super::StoreConfig;
use super::blocks::files::{Files, ObjectStoreConfig};

/// What `check` found.
#[derive(Debug, Default)]
pub struct CheckReport {
    /// Blocks that verified.
    pub good: u64,
    /// Damaged blocks: name and what is wrong.
    pub damaged: Vec<(String, String)>,
    /// Blocks another block replaces (left by an interrupted compaction; the aggregator
    /// deletes them when it starts).
    pub replaced: u64,
    /// Series, trees and finest-level nodes of the good blocks.
    pub series: u64,
    /// Trees of the good blocks, rollups included.
    pub trees: u64,
    /// Finest-level nodes of the good blocks.
    pub nodes: u64,
    /// Span trees (span profiles) of the good blocks.
    pub spans: u64,
    /// Bytes of the good blocks.
    pub bytes: u64,
}

/// Verifies every block under `data_dir` (or `store.object-store`'s directory).
///
/// # Errors
///
/// When the block directory cannot be listed.
pub(crate) fn check(data_dir: &Path, config: &StoreConfig) -> anyhow::Result<CheckReport> {
    // `check` is a command of its own: its metrics are not served.
    let metrics = crate::metrics::Metrics::new();
    let metrics = super::StoreMetrics::new(metrics.registry(), &metrics.health);
    // In a bucket the blocks are read through a block cache of `check`'s own: the data
    // directory's belongs to a running aggregator, whose downloads and bookkeeping opening it
    // would disturb. Locally the blocks are the data directory's files, only read.
    let scratch = match &config.object_store {
        ObjectStoreConfig::S3(_) => Some(Scratch::new()?),
        ObjectStoreConfig::Local(_) => None,
    };
    let files_dir = scratch
        .as_ref()
        .map_or(data_dir, |scratch| scratch.0.as_path());
    let files = Files::open(&config.object_store, files_dir, &metrics)?;
    let mut report = CheckReport::default();
    let mut sources = BTreeSet::new();
    let mut ids = Vec::new();
    for (name, len) in files.list()? {
        let bytes = match files.read_whole(&name, len) {
            Ok(Some(bytes)) => bytes,
            // Deleted by a running aggregator since the listing.
            Ok(None) => continue,
            Err(err) => {
                report
                    .damaged
                    .push((name.to_string(), format!("cannot be read: {err}")));
                continue;
            }
        };
        match verify(&bytes, &Limits::default()) {
            Ok(verified) => {
                report.good += 1;
                report.series += verified.series;
                report.trees += verified.trees;
                report.nodes += verified.nodes;
                report.spans += verified.spans;
                report.bytes += bytes.len() as u64;
                if verified.sources > 0 {
                    let file = files
                        .open_block(&name, bytes.len() as u64)
                        .map_err(|err| anyhow::anyhow!("{name}: {err}"))?;
                    sources.extend(file.sources.iter().cloned());
                }
                ids.push(name.id.clone());
            }
            Err(err) => report.damaged.push((name.to_string(), err.to_string())),
        }
    }
    report.replaced = ids.iter().filter(|id| sources.contains(*id)).count() as u64;
    Ok(report)
}

/// A directory of `check`'s own under the system's temporary directory, deleted when dropped.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new() -> anyhow::Result<Scratch> {
        let dir = std::env::temp_dir().join(format!(
            "smolder-check-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir)
            .map_err(|err| anyhow::anyhow!("creating {}: {err}", dir.display()))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
