//! The eBPF source's CPython processes: which are walked in the kernel, the names of their
//! frames, and where those frames go in the native stacks.
//!
//! [`Pythons::learn`] runs at a process's first sight or exec: it detects the interpreter, counts
//! it by release and support, and for a supported one opens its memory and returns the
//! `python_procs` entry that has the kernel walk it. [`Pythons::read_names`] takes the Python
//! frames of each new stack of a window and names them right away, while the process lives;
//! [`Pythons::mix`] turns the drained samples' Python frames into names placed in their native
//! stacks (each interpreter-loop frame replaced by the Python frames it ran), from names checked
//! in this window, read now, or, once the process has exited, the last ones known.
//! [`Pythons::forget`] drops a process after its exit grace.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use smolder_agent_ebpf::{
    PYTHON_FRAME_READ, PYTHON_NO_OFFSET, PYTHON_NO_SHIM, PythonFrame, PythonProc, PythonStatus,
};
use tracing::{debug, warn};

use super::layout::{EntryMarker, FrameAnchor};
use super::mixed::{Walks, place};
use super::{Detector, PythonError, PythonProcess, Target};
use crate::ebpf::metrics::PythonMetrics;
use crate::ebpf::sample::{PythonFrames, Splice, Stack, StackCount};

/// The name of a frame whose code object could not be read.
pub const UNKNOWN_CODE: &str = "[unknown python code]";

/// Frame names held for all processes together (each process holds at most 16,384): some
/// 250 bytes each, about 32 MiB. Past it, names go until a quarter of the room is free again:
/// first those not checked in the current window, then the largest caches whole.
const MAX_TOTAL_NAMES: usize = 131_072;

/// The CPython processes the eBPF source walks.
pub struct Pythons {
    proc: PathBuf,
    detector: Detector,
    processes: HashMap<u32, PythonProcess>,
    /// The frame names all processes hold, and at most how many ([`MAX_TOTAL_NAMES`]).
    cached_names: usize,
    name_limit: usize,
    metrics: PythonMetrics,
}

impl Pythons {
    /// An empty table reading processes under `proc` (normally `/proc`).
    pub fn new(proc: &Path, metrics: PythonMetrics) -> Pythons {
        Pythons {
            proc: proc.to_path_buf(),
            detector: Detector::default(),
            processes: HashMap::new(),
            cached_names: 0,
            name_limit: MAX_TOTAL_NAMES,
            metrics,
        }
    }

    /// Looks for CPython in `pid` (first sight or exec) and returns the entry that has the
    /// kernel walk it, if it runs a supported interpreter.
    pub fn learn(&mut self, pid: u32) -> Option<PythonProc> {
        // After an exec, what was known of the old image is stale.
        self.forget(pid);
        let found = match self.detector.process(&self.proc, pid) {
            Ok(Some(found)) => found,
            Ok(None) => return None,
            Err(PythonError::Maps { .. }) => return None,
            Err(err) => {
                self.metrics.failed(err.reason(), 1);
                warn!(pid, error = %err, "detecting CPython failed; the process keeps native stacks");
                return None;
            }
        };
        let version = found.interpreter.version_label();
        let target = match found.target {
            Ok(target) => target,
            Err(unsupported) => {
                self.metrics.found(version, unsupported.reason());
                debug!(
                    pid,
                    version,
                    reason = unsupported.reason(),
                    "CPython left with native stacks"
                );
                return None;
            }
        };
        let entry = match kernel_entry(&self.proc, pid, &target) {
            Ok(entry) => entry,
            Err(reason) => {
                self.metrics.found(version, reason);
                return None;
            }
        };
        match PythonProcess::attach(&self.proc, pid, target) {
            Ok(process) => {
                self.metrics.found(version, "supported");
                debug!(pid, version = %target.version, path = %found.path.display(), "walking CPython stacks");
                self.processes.insert(pid, process);
                self.metrics.processes.set(self.processes.len() as i64);
                Some(entry)
            }
            Err(err) => {
                self.metrics.failed(err.reason(), 1);
                debug!(pid, error = %err, "CPython process gone or unreadable");
                None
            }
        }
    }

    /// The same with at most `limit` names in all, for the tests.
    #[cfg(test)]
    fn with_name_limit(proc: &Path, metrics: PythonMetrics, limit: usize) -> Pythons {
        Pythons {
            name_limit: limit,
            ..Pythons::new(proc, metrics)
        }
    }

    /// Forgets `pid` (its exit grace is over, or it is not profiled).
    pub fn forget(&mut self, pid: u32) {
        if let Some(process) = self.processes.remove(&pid) {
            self.cached_names -= process.cached_names();
            self.metrics.processes.set(self.processes.len() as i64);
            self.metrics.cached_names.set(self.cached_names as i64);
        }
    }

    /// Names the frames of a new stack of process `pid` while the process still runs, so that
    /// they stay known after its exit.
    pub fn read_names(&mut self, pid: u32, frames: &[PythonFrame]) {
        if let Some(process) = self.processes.get_mut(&pid) {
            let before = process.cached_names();
            for frame in frames {
                // Failures are counted when the drain names the frame.
                let _ = process.name(frame.code_object());
            }
            self.names_changed(pid, before);
        }
    }

    /// Accounts for the names of `pid` having been `before` and keeps the total under
    /// [`MAX_TOTAL_NAMES`].
    fn names_changed(&mut self, pid: u32, before: usize) {
        let Some(process) = self.processes.get_mut(&pid) else {
            return;
        };
        self.metrics
            .names_evicted
            .inc_by(process.take_evicted_names() as u64);
        // `before` is part of the total: the sum does not underflow.
        self.cached_names = self.cached_names + process.cached_names() - before;
        if self.cached_names > self.name_limit {
            self.evict_names(self.name_limit - self.name_limit / 4);
        }
        self.metrics.cached_names.set(self.cached_names as i64);
    }

    /// Drops names until at most `target` remain: first every process's names not checked in
    /// the current window (a live process's are read again when needed), then the largest
    /// caches whole.
    fn evict_names(&mut self, target: usize) {
        let mut evicted = 0;
        for process in self.processes.values_mut() {
            evicted += process.evict_stale_names();
        }
        let mut sizes: Vec<(usize, u32)> = self
            .processes
            .iter()
            .map(|(&pid, process)| (process.cached_names(), pid))
            .collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        let mut left = self.cached_names - evicted;
        for (_, pid) in sizes {
            if left <= target {
                break;
            }
            if let Some(process) = self.processes.get_mut(&pid) {
                let dropped = process.clear_names();
                evicted += dropped;
                left -= dropped;
            }
        }
        self.cached_names = left;
        self.metrics.names_evicted.inc_by(evicted as u64);
        debug!(evicted, left, "Python frame names evicted");
    }

    /// Names the Python frames of `samples` and places them in their native stacks, counts
    /// what the kernel's walk found for the window's samples of profiled processes (`statuses`,
    /// samples per [`PythonStatus`] in code order), then starts a new window.
    ///
    /// A sample whose stacks do not mix (see [`place`]) keeps its Python frames alone above its
    /// kernel frames, counted in `smolder_agent_python_samples_total{stack="python_only"}`. The
    /// metrics count the kernel's samples of every kind (`StackCount::samples`), not their
    /// values (off-CPU nanoseconds, memory bytes).
    pub fn mix(&mut self, samples: &mut [StackCount], statuses: &[u64; PythonStatus::ALL.len()]) {
        let mut native = 0;
        for status in PythonStatus::ALL {
            let n = statuses[status as usize];
            match status {
                PythonStatus::None | PythonStatus::Ok | PythonStatus::Truncated => {}
                PythonStatus::NoThread | PythonStatus::NoFrames => native += n,
                failure => {
                    native += n;
                    self.metrics.failed(status_reason(failure), n);
                }
            }
        }
        let (mut mixed, mut alone, mut frames) = (0, 0, 0);
        for sample in samples.iter_mut() {
            let PythonFrames::Walked {
                frames: walked,
                truncated,
                native_complete,
            } = &sample.python
            else {
                continue;
            };
            let (walked, truncated, native_complete) =
                (Arc::clone(walked), *truncated, *native_complete);
            if truncated {
                self.metrics.failed("truncated", sample.samples);
            }
            frames += walked.len() as u64 * sample.samples;
            let names = self.frame_names(sample.pid, &walked, sample.samples);
            let eval_loop = self
                .processes
                .get(&sample.pid)
                .and_then(|process| process.target().eval_loop);
            let walks = Walks {
                native_complete,
                python_complete: !truncated,
            };
            let placed = match (&sample.user, eval_loop) {
                (Stack::Frames(native), Some(eval_loop)) => {
                    place(native, &walked, eval_loop, walks).ok()
                }
                _ => None,
            };
            match placed {
                Some(placements) => {
                    mixed += sample.samples;
                    sample.python = PythonFrames::Mixed(
                        placements
                            .into_iter()
                            .map(|p| Splice {
                                depth: p.depth,
                                names: names[p.frames].into(),
                            })
                            .collect(),
                    );
                }
                None => {
                    alone += sample.samples;
                    sample.user = Stack::Named(names.into());
                    sample.truncated = truncated;
                    sample.python = PythonFrames::None;
                }
            }
        }
        for (stack, n) in [("mixed", mixed), ("python_only", alone), ("native", native)] {
            self.metrics.samples.with_label_values(&[stack]).inc_by(n);
        }
        self.metrics.frames.inc_by(frames);
        for process in self.processes.values_mut() {
            process.next_window();
        }
    }

    /// The names of `raw` (innermost first) in process `pid`.
    fn frame_names(&mut self, pid: u32, raw: &[PythonFrame], count: u64) -> Vec<Arc<str>> {
        let Some(process) = self.processes.get_mut(&pid) else {
            self.metrics.failed("unknown_process", count);
            return raw.iter().map(|_| Arc::from(UNKNOWN_CODE)).collect();
        };
        let before = process.cached_names();
        let names = raw
            .iter()
            .map(|frame| {
                let code = frame.code_object();
                let name = process
                    .checked_name(code)
                    .map(Ok)
                    .unwrap_or_else(|| process.name(code))
                    .or_else(|err| process.cached_name(code).ok_or(err.reason()));
                match name {
                    Ok(name) if process.instruction_in_code(code, name.units, frame.instr) => {
                        name.name
                    }
                    Ok(_) => {
                        self.metrics.failed("stale_code", count);
                        Arc::from(UNKNOWN_CODE)
                    }
                    Err(reason) => {
                        self.metrics.failed(reason, count);
                        Arc::from(UNKNOWN_CODE)
                    }
                }
            })
            .collect();
        self.names_changed(pid, before);
        names
    }
}

/// The read-failure reason of a kernel status.
fn status_reason(status: PythonStatus) -> &'static str {
    match status {
        PythonStatus::ReadThread => "thread_state",
        PythonStatus::ReadFrame => "frame",
        PythonStatus::ThreadLimit => "thread_limit",
        _ => "other",
    }
}

/// The kernel's `dev_t` encoding (major << 20 | minor) of a `st_dev` in glibc's encoding, as
/// `bpf_get_ns_current_pid_tgid` compares it.
fn kernel_dev(dev: u64) -> u64 {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major << 20) | minor
}

/// The `python_procs` entry that has the kernel walk process `pid` (under `proc`, normally
/// `/proc`), whose interpreter was found as `target`.
///
/// # Errors
///
/// Why the kernel walk cannot take this process, as a label value of
/// `smolder_agent_python_processes_total{support}`: `no_pid_namespace` (the process is gone),
/// `bpf_layout` (an offset does not fit the walk's fields or its frame read).
pub fn kernel_entry(proc: &Path, pid: u32, target: &Target) -> Result<PythonProc, &'static str> {
    use std::os::unix::fs::MetadataExt;
    let namespace = std::fs::metadata(proc.join(pid.to_string()).join("ns/pid"))
        .map_err(|_| "no_pid_namespace")?;
    let layout = &target.layout;
    let small = |offset: u64| {
        u16::try_from(offset)
            .ok()
            .filter(|&o| o != PYTHON_NO_OFFSET)
    };
    let in_frame = |offset: u64, width: u64| {
        (offset + width <= PYTHON_FRAME_READ)
            .then_some(offset)
            .and_then(small)
    };
    let (tstate_frame, cframe_current_frame) = match layout.tstate_frame {
        FrameAnchor::Direct(offset) => (small(offset), Some(PYTHON_NO_OFFSET)),
        FrameAnchor::CFrame {
            cframe,
            current_frame,
        } => (small(cframe), small(current_frame)),
    };
    let (shim_owner, frame_is_entry) = match layout.frame_entry {
        EntryMarker::Flag(offset) => (
            PYTHON_NO_SHIM,
            in_frame(offset, 1)
                .and_then(|o| u8::try_from(o).ok())
                .filter(|&o| o != PYTHON_NO_SHIM)
                .ok_or("bpf_layout")?,
        ),
        EntryMarker::ShimOwner(owner) if owner != PYTHON_NO_SHIM => (owner, PYTHON_NO_SHIM),
        EntryMarker::ShimOwner(_) => return Err("bpf_layout"),
    };
    let entry = || -> Option<PythonProc> {
        Some(PythonProc {
            interpreters_head: target
                .runtime
                .checked_add(layout.runtime_interpreters_head)?,
            pidns_dev: kernel_dev(namespace.dev()),
            pidns_ino: namespace.ino(),
            interp_next: small(layout.interp_next)?,
            interp_threads_head: small(layout.interp_threads_head)?,
            tstate_next: small(layout.tstate_next)?,
            tstate_native_thread_id: small(layout.tstate_native_thread_id)?,
            tstate_frame: tstate_frame?,
            cframe_current_frame: cframe_current_frame?,
            frame_previous: in_frame(layout.frame_previous, 8)?,
            frame_code: in_frame(layout.frame_code, 8)?,
            frame_instr: in_frame(layout.frame_instr, 8)?,
            frame_owner: in_frame(layout.frame_owner, 1)?,
            shim_owner,
            frame_is_entry,
            reserved: [0; 2],
        })
    };
    entry().ok_or("bpf_layout")
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead as _, BufReader};
    use std::process::{Command, Stdio};

    use super::*;
    use crate::ebpf::python::{Layout, PythonVersion};

    /// Debian's python3.11 with `count` functions, printing their code objects' addresses.
    fn python_with_functions(count: usize) -> (std::process::Child, Vec<u64>) {
        let script = format!(
            "import sys\nfs = [eval(compile(f'lambda: {{i}}', f'f{{i}}.py', 'eval')) for i in range({count})]\n\
             print(' '.join(str(id(f.__code__)) for f in fs), flush=True)\nsys.stdin.read()\n"
        );
        let mut child = Command::new("/usr/bin/python3.11")
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("Debian's python3.11 runs (apt-get install python3.11)");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let codes = line
            .split_whitespace()
            .map(|a| a.parse().unwrap())
            .collect();
        (child, codes)
    }

    fn frames(codes: &[u64]) -> Vec<PythonFrame> {
        codes
            .iter()
            .map(|&code| PythonFrame { code, instr: 0 })
            .collect()
    }

    #[test]
    fn names_of_all_processes_stay_under_their_bound() {
        let registry = prometheus::Registry::new();
        let metrics = PythonMetrics::new(&registry);
        let mut pythons = Pythons::with_name_limit(Path::new("/proc"), metrics.clone(), 100);
        let (mut a, codes_a) = python_with_functions(60);
        let (mut b, codes_b) = python_with_functions(60);
        for (child, codes) in [(&a, &codes_a), (&b, &codes_b)] {
            let pid = child.id();
            assert!(pythons.learn(pid).is_some(), "python3.11 is walked");
            pythons.read_names(pid, &frames(codes));
        }
        // 120 names over a bound of 100: back to 75 at most, the window's names first kept.
        assert!(pythons.cached_names <= 75, "{}", pythons.cached_names);
        assert_eq!(metrics.cached_names.get(), pythons.cached_names as i64);
        assert!(metrics.names_evicted.get() >= 45);
        // A new window: what is needed again is read again from the live process.
        pythons.mix(&mut [], &[0; PythonStatus::ALL.len()]);
        pythons.read_names(a.id(), &frames(&codes_a[..10]));
        let process = &pythons.processes[&a.id()];
        let name = process.checked_name(codes_a[0]).expect("read again");
        assert_eq!(&*name.name, "<lambda> (f0.py:1)");
        assert!(pythons.cached_names <= 100);
        pythons.forget(a.id());
        pythons.forget(b.id());
        assert_eq!(pythons.cached_names, 0);
        assert_eq!(metrics.cached_names.get(), 0);
        for child in [&mut a, &mut b] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    #[test]
    fn device_numbers_convert_to_the_kernel_encoding() {
        // nsfs is 0:4 on this kind of host; a large device such as 259:65536 splits its minor.
        assert_eq!(kernel_dev(4), 4);
        let glibc = (259u64 << 8) | (0x10000 << 12);
        assert_eq!(kernel_dev(glibc), (259 << 20) | 0x10000);
    }

    #[test]
    fn each_supported_layout_fits_the_kernel_walk() {
        for (layout, version) in [(Layout::V3_11, 0x030b07f0), (Layout::V3_12, 0x030c01f0)] {
            let target = Target {
                layout,
                version: PythonVersion(version),
                runtime: 0x7f00_0000_0000,
                code_type: 0,
                unicode_type: 0,
                eval_loop: None,
            };
            let entry = kernel_entry(Path::new("/proc"), std::process::id(), &target).unwrap();
            assert_eq!(entry.interpreters_head, 0x7f00_0000_0000 + 40);
            assert_eq!(entry.frame_code, layout.frame_code as u16);
            let entries = match layout.frame_entry {
                EntryMarker::Flag(offset) => (PYTHON_NO_SHIM, offset as u8),
                EntryMarker::ShimOwner(owner) => (owner, PYTHON_NO_SHIM),
            };
            assert_eq!((entry.shim_owner, entry.frame_is_entry), entries);
        }
        let mut too_far = Layout::V3_12;
        too_far.frame_owner = 80;
        let target = Target {
            layout: too_far,
            version: PythonVersion(0x030c01f0),
            runtime: 0,
            code_type: 0,
            unicode_type: 0,
            eval_loop: None,
        };
        assert_eq!(
            kernel_entry(Path::new("/proc"), std::process::id(), &target),
            Err("bpf_layout")
        );
    }
}
