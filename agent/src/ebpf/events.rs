//! Reads the `events` ring buffer: processes seen for the first time, exec'd or exited.

use smolder_agent_ebpf::{EventKind, ProcessEvent as RawEvent};

use super::Sampler;

/// What happened to a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessEventKind {
    /// Its first sample (or the first since it was forgotten).
    FirstSight,
    /// It called execve: its name and memory map changed.
    Exec,
    /// Its main thread exited.
    Exit,
}

/// One process event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessEvent {
    /// The process (thread group) id.
    pub pid: u32,
    /// What happened.
    pub kind: ProcessEventKind,
}

impl Sampler {
    /// Appends the process events the kernel queued since the last call to `out`, oldest first.
    pub fn poll_events(&mut self, out: &mut Vec<ProcessEvent>) {
        while let Some(item) = self.events.next() {
            let Some(raw) = read_event(&item) else {
                continue;
            };
            let kind = match EventKind::from_raw(raw.kind) {
                Some(EventKind::FirstSight) => ProcessEventKind::FirstSight,
                Some(EventKind::Exec) => ProcessEventKind::Exec,
                Some(EventKind::Exit) => ProcessEventKind::Exit,
                None => continue,
            };
            out.push(ProcessEvent {
                pid: raw.tgid,
                kind,
            });
        }
    }
}

/// Decodes one ring-buffer record; records of another size are not ours and are skipped.
fn read_event(bytes: &[u8]) -> Option<RawEvent> {
    let tgid = u32::from_ne_bytes(bytes.get(0..4)?.try_into().ok()?);
    let kind = u32::from_ne_bytes(bytes.get(4..8)?.try_into().ok()?);
    (bytes.len() == size_of::<RawEvent>()).then_some(RawEvent { tgid, kind })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_decode_in_native_byte_order() {
        let mut bytes = 4242u32.to_ne_bytes().to_vec();
        bytes.extend_from_slice(&3u32.to_ne_bytes());
        assert_eq!(
            read_event(&bytes),
            Some(RawEvent {
                tgid: 4242,
                kind: 3
            })
        );
        assert_eq!(read_event(&bytes[..7]), None);
    }
}
