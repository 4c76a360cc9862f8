//! The Python kernel objects (`agent-ebpf/src/python.h`): registers CPython processes in
//! `python_procs`, reads the `python_events` ring buffer of new Python stacks, and empties a
//! buffer's `python_stacks_N` set once its samples are drained.

use aya::maps::{HashMap, MapData, MapError, RingBuf};
use smolder_agent_ebpf::{
    self as kernel, PYTHON_MAX_FRAMES, PythonFrame, PythonProc, PythonStackEvent, PythonStackKey,
};

use crate::ebpf::{EbpfError, Sampler};

/// The Python maps of the loaded sampler.
pub struct PythonMaps {
    /// `python_procs`.
    pub(crate) procs: HashMap<MapData, u32, PythonProc>,
    /// `python_stacks_0`, `python_stacks_1`.
    pub(crate) stacks: [HashMap<MapData, PythonStackKey, u8>; 2],
    /// `python_events`.
    pub(crate) events: RingBuf<MapData>,
}

/// A new Python stack, as its first sample in a buffer sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackEvent {
    /// The stack's key.
    pub key: PythonStackKey,
    /// The buffer (0 or 1) whose counts reference it.
    pub buffer: u32,
    /// Its frames, innermost first.
    pub frames: Vec<PythonFrame>,
}

fn map_error(map: &'static str, action: &'static str) -> impl Fn(MapError) -> EbpfError {
    move |source| EbpfError::Map {
        map,
        action,
        source: Some(Box::new(source)),
    }
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
            .map_err(map_error(kernel::MAP_PYTHON_PROCS, "registering a process"))
    }

    /// Stops walking process `pid` (the kernel forgets exited and exec'd processes itself).
    pub fn unregister_python(&mut self, pid: u32) {
        // Absent already when the kernel saw the process exit or exec.
        let _ = self.python.procs.remove(&pid);
    }

    /// Appends the new Python stacks the kernel sent since the last call to `out`.
    pub fn poll_python_events(&mut self, out: &mut Vec<StackEvent>) {
        while let Some(item) = self.python.events.next() {
            if let Some(event) = StackEvent::parse(&item) {
                out.push(event);
            }
        }
    }

    /// Empties the Python stacks set of `buffer`, after its samples were drained.
    ///
    /// # Errors
    ///
    /// [`EbpfError::Map`] when the set cannot be listed or emptied.
    pub(crate) fn clear_python_stacks(&mut self, buffer: usize) -> Result<(), EbpfError> {
        let name = kernel::MAP_PYTHON_STACKS[buffer];
        let set = &mut self.python.stacks[buffer];
        let keys = set
            .keys()
            .collect::<Result<Vec<PythonStackKey>, _>>()
            .map_err(map_error(name, "listing Python stacks"))?;
        for key in keys {
            match set.remove(&key) {
                Ok(()) | Err(MapError::KeyNotFound) => {}
                Err(err) => return Err(map_error(name, "deleting a Python stack")(err)),
            }
        }
        Ok(())
    }
}

impl StackEvent {
    /// Decodes one `python_events` record: `None` for a record of the wrong size or with too
    /// many frames.
    pub fn parse(bytes: &[u8]) -> Option<StackEvent> {
        read_stack_event(bytes)
    }
}

fn read_stack_event(bytes: &[u8]) -> Option<StackEvent> {
    let word = |at: usize| -> Option<u64> {
        Some(u64::from_ne_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
    };
    let half = |at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
    };
    let header = size_of::<PythonStackEvent>();
    let key = PythonStackKey {
        tgid: half(0)?,
        len: half(4)?,
        hash: word(8)?,
    };
    let buffer = half(16)?;
    let len = usize::try_from(key.len).ok()?;
    if len > PYTHON_MAX_FRAMES
        || buffer > 1
        || bytes.len() != header + len * size_of::<PythonFrame>()
    {
        return None;
    }
    let frames = (0..len)
        .map(|i| {
            let at = header + i * size_of::<PythonFrame>();
            Some(PythonFrame {
                code: word(at)?,
                instr: word(at + 8)?,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some(StackEvent {
        key,
        buffer,
        frames,
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn record(len: u32, frames: usize) -> Vec<u8> {
        let mut bytes = 77u32.to_ne_bytes().to_vec();
        bytes.extend_from_slice(&len.to_ne_bytes());
        bytes.extend_from_slice(&0xabcdu64.to_ne_bytes());
        bytes.extend_from_slice(&1u32.to_ne_bytes());
        bytes.extend_from_slice(&0u32.to_ne_bytes());
        for i in 0..frames as u64 {
            bytes.extend_from_slice(&(0x1000 + i).to_ne_bytes());
            bytes.extend_from_slice(&(0x2000 + i).to_ne_bytes());
        }
        bytes
    }

    #[test]
    fn stack_events_decode_and_odd_ones_are_skipped() {
        let event = read_stack_event(&record(2, 2)).unwrap();
        assert_eq!(
            event.key,
            PythonStackKey {
                tgid: 77,
                len: 2,
                hash: 0xabcd
            }
        );
        assert_eq!(event.buffer, 1);
        assert_eq!(
            event.frames[1],
            PythonFrame {
                code: 0x1001,
                instr: 0x2001
            }
        );
        assert_eq!(read_stack_event(&record(3, 2)), None);
        assert_eq!(read_stack_event(&record(200, 200)), None);
        assert_eq!(read_stack_event(&record(0, 0)).unwrap().frames.len(), 0);
        assert_eq!(read_stack_event(&[1, 2, 3]), None);
    }

    proptest! {
        #[test]
        fn any_record_decodes_to_its_frames_or_is_skipped(
            bytes in proptest::collection::vec(any::<u8>(), 0..600),
        ) {
            if let Some(event) = read_stack_event(&bytes) {
                prop_assert_eq!(event.frames.len() as u32, event.key.len);
                prop_assert!(event.frames.len() <= PYTHON_MAX_FRAMES);
                prop_assert!(event.buffer <= 1);
            }
        }
    }
}
