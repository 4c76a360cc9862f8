//! The Python kernel object the agent writes (`agent-ebpf/src/python.h`): registers CPython
//! processes in `python_procs`. The Python frames themselves come with each sample
//! (`samples.rs`).

use aya::maps::{HashMap, MapData, MapError};
use smolder_agent_ebpf::{self as kernel, PythonProc};

use crate::ebpf::{EbpfError, Sampler};

/// The Python map of the loaded sampler.
pub struct PythonMaps {
    /// `python_procs`.
    pub(crate) procs: HashMap<MapData, u32, PythonProc>,
}

impl Sampler {
    /// Has the walk read process `pid`'s Python stacks from now on.
    ///
    /// # Errors
    ///
    /// [`EbpfError::Map`] when the entry cannot be written (the map is full).
    pub fn register_python(&mut self, pid: u32, proc: &PythonProc) -> Result<(), EbpfError> {
        self.python
            .procs
            .insert(pid, proc, 0)
            .map_err(|source: MapError| EbpfError::Map {
                map: kernel::MAP_PYTHON_PROCS,
                action: "registering a process",
                source: Some(Box::new(source)),
            })
    }

    /// Stops walking process `pid`: the agent no longer profiles it (the kernel forgets exited
    /// and exec'd processes itself).
    pub fn unregister_python(&mut self, pid: u32) {
        // Absent already when the kernel saw the process exit or exec.
        let _ = self.python.procs.remove(&pid);
    }
}
