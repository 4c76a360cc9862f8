//! `smolder-aggregator check`: reads every block of a data directory whole and verifies it
//! (`smolder_block::verify`: every checksum, the index against the trees, the rollups against
//! the trees below them), without opening the head, so it runs beside a live aggregator.
//!
//! Input: the data directory and the store's config (where blocks are). Output: a
//! [`CheckReport`] naming every damaged block. Caller: `main.rs`.

use std::collections::BTreeSet;
use std::path::Path;

use smolder_block::{Limits, verify};

use super::StoreConfig;
use super::blocks::files::Files;

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
    /// Bytes of the good blocks.
    pub bytes: u64,
}

/// Verifies every block under `data_dir` (or `store.object-store`'s directory).
///
/// # Errors
///
/// When the block directory cannot be listed.
pub(crate) fn check(data_dir: &Path, config: &StoreConfig) -> anyhow::Result<CheckReport> {
    let files = Files::open(&config.object_store, data_dir)?;
    let mut report = CheckReport::default();
    let mut sources = BTreeSet::new();
    let mut ids = Vec::new();
    for (name, _) in files.list()? {
        let path = files.local_path(&name)?;
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            // Deleted by a running aggregator since the listing.
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
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
