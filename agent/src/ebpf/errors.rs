//! Reads the per-CPU `errors` counters the program keeps.

use smolder_agent_ebpf::ErrorIndex;

use super::{EbpfError, Sampler};

/// How often each kernel-side error happened since the previous read, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErrorCounts {
    /// Samples lost because the counts map was full.
    pub counts_full: u64,
    /// Samples kept without their user stack (stack map slot taken).
    pub user_stack_collisions: u64,
    /// Samples kept without their kernel stack (stack map slot taken).
    pub kernel_stack_collisions: u64,
    /// Samples kept without their user stack (another helper failure).
    pub user_stack_failures: u64,
    /// Samples kept without their kernel stack (another helper failure).
    pub kernel_stack_failures: u64,
    /// Process events lost because the ring buffer was full.
    pub events_lost: u64,
}

impl Sampler {
    /// The error counts since the previous call.
    ///
    /// # Errors
    ///
    /// [`EbpfError::Map`] when the counters cannot be read.
    pub fn read_errors(&mut self) -> Result<ErrorCounts, EbpfError> {
        let mut delta = [0u64; ErrorIndex::ALL.len()];
        for index in ErrorIndex::ALL {
            let i = index as usize;
            let per_cpu = self
                .errors
                .get(&(index as u32), 0)
                .map_err(|source| EbpfError::Map {
                    map: smolder_agent_ebpf::MAP_ERRORS,
                    action: "reading error counters",
                    source: Some(Box::new(source)),
                })?;
            let total: u64 = per_cpu.iter().sum();
            delta[i] = total.saturating_sub(self.errors_seen[i]);
            self.errors_seen[i] = total;
        }
        Ok(ErrorCounts {
            counts_full: delta[ErrorIndex::CountsFull as usize],
            user_stack_collisions: delta[ErrorIndex::UserStackCollision as usize],
            kernel_stack_collisions: delta[ErrorIndex::KernelStackCollision as usize],
            user_stack_failures: delta[ErrorIndex::UserStackOther as usize],
            kernel_stack_failures: delta[ErrorIndex::KernelStackOther as usize],
            events_lost: delta[ErrorIndex::EventsLost as usize],
        })
    }
}
