//! Where each binary's names are read from: its own symbol table, else its separate debug
//! file's (found locally, or fetched by the debuginfod client), else its dynamic symbols.
//!
//! Input: a binary the symbolizer holds open, with the process and path it was mapped by.
//! Output: a [`Binary`]: the file blazesym reads names from, and whether addresses must be
//! given to it as virtual addresses (a debug file keeps the binary's addresses, not its file
//! offsets). Caller: the symbolizer thread. Owns the open debug files and the debuginfod
//! client.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use smolder_unwind::{Elf, Layout};
use tracing::debug;

use super::debuginfo::{DebugDirs, DebugSource, downloaded_name};
use super::debuginfod::Debuginfod;
use crate::ebpf::metrics::SymbolizeMetrics;
use crate::ebpf::process::FileKey;
use crate::ebpf::unwind::{FileBytes, Stamp, open_regular};

/// Where one binary's names are read.
pub(crate) struct Binary {
    /// The file blazesym reads: the binary itself or its debug file, as `/proc/self/fd/N`.
    pub(crate) symbols: PathBuf,
    /// The binary's layout when `symbols` is its debug file: file offsets are turned into
    /// virtual addresses with it.
    pub(crate) layout: Option<Layout>,
    /// Keeps the debug file (and so `symbols`) open.
    _debug: Option<File>,
    /// A stripped binary without debug file yet: its build id, asked of debuginfod.
    awaiting: Option<Vec<u8>>,
    /// The binary's layout, kept for when its debug file arrives.
    own_layout: Layout,
}

/// How often the binaries still without a debug file are asked for again (the client waits
/// out a failure before it asks a server again; this keeps the asking itself off every poll).
const ASK_AGAIN: Duration = Duration::from_secs(60);

/// The binaries known to the symbolizer.
pub(crate) struct Binaries {
    binaries: HashMap<FileKey, Binary>,
    dirs: DebugDirs,
    debuginfod: Option<Debuginfod>,
    metrics: SymbolizeMetrics,
    /// When the binaries awaiting a debug file were last asked for again.
    asked: Instant,
}

fn fd_path(file: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

impl Binaries {
    pub(crate) fn new(
        dirs: DebugDirs,
        debuginfod: Option<Debuginfod>,
        metrics: SymbolizeMetrics,
    ) -> Binaries {
        Binaries {
            binaries: HashMap::new(),
            dirs,
            debuginfod,
            metrics,
            asked: Instant::now(),
        }
    }

    pub(crate) fn get(&self, key: FileKey) -> Option<&Binary> {
        self.binaries.get(&key)
    }

    pub(crate) fn contains(&self, key: FileKey) -> bool {
        self.binaries.contains_key(&key)
    }

    /// Forgets a binary (its file was closed); returns the debug file's path, which blazesym
    /// must forget too.
    pub(crate) fn remove(&mut self, key: FileKey) -> Option<PathBuf> {
        let binary = self.binaries.remove(&key)?;
        binary.layout.map(|_| binary.symbols)
    }

    /// Decides where the names of the binary `key` come from: it is open at `open` (a
    /// `/proc/self/fd/N` path) and mapped at `path` by process `pid`.
    pub(crate) fn analyze(&mut self, pid: u32, key: FileKey, path: &str, open: &Path) {
        let plain = |layout: Layout| Binary {
            symbols: open.to_path_buf(),
            layout: None,
            _debug: None,
            awaiting: None,
            own_layout: layout,
        };
        let Some(mapped) = open_regular(open, true)
            .ok()
            .and_then(|file| FileBytes::new(&file, &Stamp::of(&file).ok()?).ok())
        else {
            self.binaries.insert(key, plain(Layout::default()));
            return;
        };
        let Ok(elf) = Elf::parse(mapped.bytes()) else {
            self.binaries.insert(key, plain(Layout::default()));
            return;
        };
        let layout = elf.layout();
        if elf.has_symbol_table() {
            self.binaries.insert(key, plain(layout));
            return;
        }
        if let Some((file, source)) = self.dirs.find(pid, path, &elf) {
            self.metrics
                .debug_files
                .with_label_values(&[source.name()])
                .inc();
            debug!(
                path,
                source = source.name(),
                "names from a separate debug file"
            );
            self.binaries.insert(
                key,
                Binary {
                    symbols: fd_path(&file),
                    layout: Some(layout.clone()),
                    _debug: Some(file),
                    awaiting: None,
                    own_layout: layout,
                },
            );
            return;
        }
        let mut binary = plain(layout);
        if let (Some(client), Some(id)) = (&mut self.debuginfod, elf.build_id()) {
            client.request(id);
            binary.awaiting = Some(id.to_vec());
        }
        self.binaries.insert(key, binary);
    }

    /// Takes in the debug files debuginfod delivered, and asks again for those still missing
    /// (the client waits out a failure before it asks a server again); returns the binaries
    /// that now read names from one (their cached names must go).
    pub(crate) fn poll(&mut self) -> Vec<FileKey> {
        let Some(client) = &mut self.debuginfod else {
            return Vec::new();
        };
        let fetched = client.take_fetched();
        let now = Instant::now();
        if now.duration_since(self.asked) >= ASK_AGAIN {
            self.asked = now;
            for binary in self.binaries.values() {
                if let Some(id) = &binary.awaiting
                    && !fetched.contains(id)
                {
                    client.request(id);
                }
            }
        }
        let Some(dir) = &self.dirs.downloaded else {
            return Vec::new();
        };
        let mut changed = Vec::new();
        for id in fetched {
            let Ok(file) = open_regular(&dir.join(downloaded_name(&id)), false) else {
                continue;
            };
            for (key, binary) in &mut self.binaries {
                if binary.awaiting.as_deref() != Some(&id[..]) {
                    continue;
                }
                let Ok(copy) = file.try_clone() else {
                    continue;
                };
                binary.symbols = fd_path(&copy);
                binary.layout = Some(binary.own_layout.clone());
                binary._debug = Some(copy);
                binary.awaiting = None;
                self.metrics
                    .debug_files
                    .with_label_values(&[DebugSource::Debuginfod.name()])
                    .inc();
                changed.push(*key);
            }
        }
        changed
    }
}
