//! The unwinder's maps in the kernel: a table goes in as an exactly sized array, filled through
//! a memory mapping of its file descriptor and then inserted into `unwind_tables`, with the
//! other tables ready at the same time in one batch; mappings go in and out of the
//! `unwind_mappings` LPM trie.
//!
//! Input: a table's entries, LPM keys and values. Output: the kernel memory a table takes, read
//! from its map's `fdinfo`. Caller: the unwinder's worker thread. Owns the two maps, taken from
//! the loaded object ([`UnwindMaps`]).

use std::os::fd::{AsFd as _, AsRawFd as _, OwnedFd};

use aya::maps::lpm_trie::Key;
use aya::maps::{Array, IterableMap as _, MapData, MapError};
use smolder_agent_ebpf::unwind::{Mapping, MappingKey, TABLE_MAP_FLAGS};

use crate::ebpf::loader::UnwindMaps;

/// Why a table or mapping could not go into the kernel.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// Creating, mapping or inserting a table's array failed.
    #[error("loading an unwind table of {entries} entries into the kernel failed: {action}")]
    Table {
        /// The table's entries.
        entries: usize,
        /// What failed.
        action: &'static str,
        /// The system's or aya's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Inserting or deleting an LPM entry failed.
    #[error("{action} an unwind mapping failed")]
    Mapping {
        /// `inserting` or `deleting`.
        action: &'static str,
        /// aya's error.
        source: Box<MapError>,
    },
}

/// The two maps.
pub(crate) struct Kernel {
    maps: UnwindMaps,
}

/// `BPF_MAP_UPDATE_BATCH` (`enum bpf_cmd` in `linux/bpf.h`).
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Updates `keys[i]` to `values[i]` in the map of `map_fd` in one `BPF_MAP_UPDATE_BATCH`
/// call. Returns how many went in, and the error that stopped the rest (at index `count`).
fn update_batch(map_fd: &OwnedFd, keys: &[u64], values: &[u32]) -> (usize, Option<std::io::Error>) {
    debug_assert_eq!(keys.len(), values.len());
    let mut attr = BatchAttr {
        keys: keys.as_ptr() as u64,
        values: values.as_ptr() as u64,
        count: u32::try_from(keys.len()).unwrap_or(u32::MAX),
        map_fd: u32::try_from(map_fd.as_raw_fd()).unwrap_or(u32::MAX),
        ..BatchAttr::default()
    };
    // SAFETY: `attr` is a valid `bpf_attr.batch` for the size passed; `keys` and `values` hold
    // `count` elements of the map's key (u64) and value (u32, a map fd) sizes and outlive the
    // call; the kernel writes back only `attr.count`.
    let result = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_UPDATE_BATCH,
            &raw mut attr,
            std::mem::size_of::<BatchAttr>(),
        )
    };
    let done = (attr.count as usize).min(keys.len());
    if result == 0 {
        (keys.len(), None)
    } else {
        (done, Some(std::io::Error::last_os_error()))
    }
}

/// A read-write shared mapping of a BPF array map, unmapped on drop.
struct MapMemory {
    ptr: *mut libc::c_void,
    len: usize,
}

impl MapMemory {
    /// Maps the first `len` bytes of the map behind `fd`.
    fn new(fd: std::os::fd::BorrowedFd<'_>, len: usize) -> std::io::Result<MapMemory> {
        // SAFETY: a fresh mapping (null hint) of a BPF_F_MMAPABLE array's own file descriptor;
        // the kernel checks `len` against the map's size and the flags against the map's.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(MapMemory { ptr, len })
    }

    /// Copies `entries` to the start of the mapping.
    fn write(&mut self, entries: &[u64]) {
        let bytes = std::mem::size_of_val(entries);
        assert!(bytes <= self.len, "the mapping holds the table");
        // SAFETY: `ptr` is a live, writable mapping of `len >= bytes` bytes that nothing else in
        // this process aliases; a page-aligned mapping is aligned for u64; the source is a
        // distinct Rust slice, so the ranges do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(entries.as_ptr(), self.ptr.cast::<u64>(), entries.len());
        }
    }
}

impl Drop for MapMemory {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned and nothing borrows the mapping.
        unsafe {
            libc::munmap(self.ptr, self.len);
        }
    }
}

/// The kernel memory a map charges, from `/proc/self/fdinfo/<fd>` (`memlock:`).
fn memlock(map: &MapData) -> Option<u64> {
    let info = std::fs::read_to_string(format!(
        "/proc/self/fdinfo/{}",
        map.fd().as_fd().as_raw_fd()
    ))
    .ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix("memlock:"))?
        .trim()
        .parse()
        .ok()
}

fn page_size() -> usize {
    // SAFETY: sysconf has no memory effects.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096)
}

impl Kernel {
    pub(crate) fn new(maps: UnwindMaps) -> Kernel {
        Kernel { maps }
    }

    /// The kernel memory a table of `entries` entries will take, for the budget before it is
    /// created: the array's pages and the map's own page.
    pub(crate) fn estimate(entries: usize) -> u64 {
        let page = page_size() as u64;
        (entries as u64 * 8).div_ceil(page) * page + page
    }

    /// Puts tables into the kernel, each `(key, entries)`; returns, for each, the kernel
    /// memory it takes. Every insert into `unwind_tables` waits for an RCU grace period (the
    /// kernel's `maybe_wait_bpf_programs` for map-in-map updates, 10 to 100 ms on a loaded
    /// host), so the tables go in with one `BPF_MAP_UPDATE_BATCH`, which waits once (Linux
    /// 6.8+); one by one where batches are refused.
    pub(crate) fn load_tables(
        &mut self,
        tables: &[(u64, &[u64])],
    ) -> Vec<Result<u64, KernelError>> {
        let mut results: Vec<Result<u64, KernelError>> = Vec::with_capacity(tables.len());
        let mut arrays = Vec::new();
        for (i, &(key, entries)) in tables.iter().enumerate() {
            match Kernel::create(entries) {
                Ok((array, bytes)) => {
                    arrays.push((i, key, array));
                    results.push(Ok(bytes));
                }
                Err(err) => results.push(Err(err)),
            }
        }
        let error =
            |entries: usize, source: Box<dyn std::error::Error + Send + Sync>| KernelError::Table {
                entries,
                action: "inserting it into unwind_tables",
                source,
            };
        let mut from = 0;
        {
            let fd = &self.maps.tables_fd;
            let keys: Vec<u64> = arrays.iter().map(|(_, key, _)| *key).collect();
            let fds: Vec<u32> = arrays
                .iter()
                .map(|(_, _, array)| {
                    u32::try_from(array.map().fd().as_fd().as_raw_fd()).unwrap_or(u32::MAX)
                })
                .collect();
            while from < arrays.len() {
                let (done, err) = update_batch(fd, &keys[from..], &fds[from..]);
                from += done;
                let Some(err) = err else { break };
                if done == 0
                    && matches!(
                        err.raw_os_error(),
                        Some(libc::EINVAL | libc::EOPNOTSUPP | 524)
                    )
                {
                    // No batch updates of this map here (524: ENOTSUPP): one by one below.
                    break;
                }
                let (i, _, _) = &arrays[from];
                results[*i] = Err(error(tables[*i].1.len(), Box::new(err)));
                from += 1;
            }
        }
        for (i, key, array) in &arrays[from..] {
            if let Err(err) = self.maps.tables.insert(*key, array, 0) {
                results[*i] = Err(error(tables[*i].1.len(), Box::new(err)));
            }
        }
        results
    }

    /// An exactly sized array holding `entries`, and the kernel memory it takes.
    fn create(entries: &[u64]) -> Result<(Array<MapData, u64>, u64), KernelError> {
        let error = |action: &'static str| {
            move |source: Box<dyn std::error::Error + Send + Sync>| KernelError::Table {
                entries: entries.len(),
                action,
                source,
            }
        };
        let count =
            u32::try_from(entries.len()).map_err(|err| error("sizing the array")(Box::new(err)))?;
        let inner = Array::<MapData, u64>::create(count, TABLE_MAP_FLAGS)
            .map_err(|err| error("creating the array")(Box::new(err)))?;
        let map_data = inner.map();
        let len = std::mem::size_of_val(entries).div_ceil(page_size()) * page_size();
        {
            let mut memory = MapMemory::new(map_data.fd().as_fd(), len)
                .map_err(|err| error("mapping the array")(Box::new(err)))?;
            memory.write(entries);
        }
        let bytes = memlock(map_data).unwrap_or_else(|| Kernel::estimate(entries.len()));
        Ok((inner, bytes))
    }

    /// Takes the table under `key` out of the kernel; the walks that still find it finish with
    /// it, later ones step with frame pointers over its code.
    pub(crate) fn evict_table(&mut self, key: u64) -> Result<(), KernelError> {
        match self.maps.tables.remove(&key) {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
            Err(source) => Err(KernelError::Table {
                entries: 0,
                action: "removing it from unwind_tables",
                source: Box::new(source),
            }),
        }
    }

    /// Inserts (or updates) one LPM entry.
    pub(crate) fn insert_mapping(
        &mut self,
        prefix: u32,
        key: MappingKey,
        value: Mapping,
    ) -> Result<(), KernelError> {
        self.maps
            .mappings
            .insert(&Key::new(prefix, key), value, 0)
            .map_err(|source| KernelError::Mapping {
                action: "inserting",
                source: Box::new(source),
            })
    }

    /// Deletes one LPM entry; a missing one is not an error.
    pub(crate) fn delete_mapping(
        &mut self,
        prefix: u32,
        key: MappingKey,
    ) -> Result<(), KernelError> {
        match self.maps.mappings.remove(&Key::new(prefix, key)) {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
            Err(source) => Err(KernelError::Mapping {
                action: "deleting",
                source: Box::new(source),
            }),
        }
    }
}
