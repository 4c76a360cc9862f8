//! Drains the double-buffered `counts_N` and `stacks_N` maps: the CPU samples, as
//! [`StackCount`]s of [`SampleKind::Cpu`].
//!
//! The program writes to the buffer that `buffer[0]` names. A drain points it at the other
//! buffer, waits for programs already running to finish with the old one, and then reads and
//! empties the old one while nothing writes to it: no sample is counted twice or deleted unread,
//! which iterating and deleting a map that is being written cannot promise.

use std::collections::HashMap as StdHashMap;
use std::sync::Arc;
use std::time::Duration;

use aya::maps::MapError;
use smolder_agent_ebpf::{self as kernel, PythonStatus, SampleKey};

use super::{EbpfError, SampleKind, Sampler, Stack, StackCount};

/// How long a drain waits after flipping the buffer before reading the old one. A perf_event
/// program runs to completion in interrupt context within microseconds (§5 of the eBPF
/// reference: about 3 µs per sample), so any program that read the old index has finished long
/// before this.
const FLIP_SETTLE: Duration = Duration::from_millis(10);

fn map_error(map: &'static str, action: &'static str) -> impl Fn(MapError) -> EbpfError {
    move |source| EbpfError::Map {
        map,
        action,
        source: Some(Box::new(source)),
    }
}

impl Sampler {
    /// Switches the program to the other buffer and returns every sample of the one it wrote
    /// since the previous drain, emptying it (its Python stacks set too). The samples' Python
    /// stacks are keys into the `python_events` the kernel sent for that buffer
    /// ([`Sampler::drained_buffer`]).
    ///
    /// # Errors
    ///
    /// [`EbpfError::Map`] when a map cannot be written or read; the samples of that buffer are
    /// then lost, and the next drain starts from a consistent state again once its maps work.
    pub fn drain(&mut self) -> Result<Vec<StackCount>, EbpfError> {
        let idle = self.active;
        self.active = 1 - idle;
        self.buffer
            .set(0, self.active, 0)
            .map_err(map_error(kernel::MAP_BUFFER, "switching buffers"))?;
        std::thread::sleep(FLIP_SETTLE);

        let index = idle as usize;
        let counts_name = kernel::MAP_COUNTS[index];
        let stacks_name = kernel::MAP_STACKS[index];
        let counts = &mut self.counts[index];
        let keys = counts
            .keys()
            .collect::<Result<Vec<SampleKey>, _>>()
            .map_err(map_error(counts_name, "listing keys"))?;
        let mut entries = Vec::with_capacity(keys.len());
        for key in keys {
            let count = counts
                .get(&key, 0)
                .map_err(map_error(counts_name, "reading a count"))?;
            counts
                .remove(&key)
                .map_err(map_error(counts_name, "deleting a count"))?;
            entries.push((key, count));
        }

        let stacks = &mut self.stacks[index];
        let mut read: StdHashMap<u32, Arc<[u64]>> = StdHashMap::new();
        let mut samples = Vec::with_capacity(entries.len());
        for (key, count) in entries {
            let mut stack = |id: i32| -> Result<Stack, EbpfError> {
                if id == kernel::STACK_ID_NONE {
                    return Ok(Stack::None);
                }
                let Ok(id) = u32::try_from(id) else {
                    return Ok(Stack::Lost);
                };
                if let Some(frames) = read.get(&id) {
                    return Ok(Stack::Frames(Arc::clone(frames)));
                }
                let frames: Arc<[u64]> = match stacks.get(&id, 0) {
                    Ok(trace) => trace.frames().iter().map(|frame| frame.ip).collect(),
                    Err(MapError::KeyNotFound) => return Ok(Stack::Lost),
                    Err(err) => return Err(map_error(stacks_name, "reading a stack")(err)),
                };
                read.insert(id, Arc::clone(&frames));
                Ok(Stack::Frames(frames))
            };
            let user = match key.python_stack() {
                Some(python) => Stack::Python(python),
                None => stack(key.user_stack_id)?,
            };
            let kernel = stack(key.kernel_stack_id)?;
            samples.push(StackCount {
                kind: SampleKind::Cpu,
                pid: key.tgid,
                user,
                kernel,
                python: PythonStatus::from_raw(key.python_status).unwrap_or(PythonStatus::None),
                count,
            });
        }
        // Every stack goes, including those of samples lost to a full counts map, which no key
        // references.
        let ids = stacks
            .stack_ids()
            .collect::<Result<Vec<u32>, _>>()
            .map_err(map_error(stacks_name, "listing stacks"))?;
        for id in ids {
            match stacks.remove(&id) {
                Ok(()) | Err(MapError::KeyNotFound) => {}
                Err(err) => return Err(map_error(stacks_name, "deleting a stack")(err)),
            }
        }
        self.clear_python_stacks(index)?;
        Ok(samples)
    }

    /// The buffer the last [`Sampler::drain`] emptied.
    pub fn drained_buffer(&self) -> usize {
        1 - self.active as usize
    }
}
