//! The symbolizer thread: process maps, open binaries, the frame cache and blazesym.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use blazesym::symbolize::source::{Elf, Kernel, Process, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer as Blaze, evict};
use blazesym::{MaybeDefault, Pid};
use smolder_daemon::Heartbeat;
use tracing::{debug, debug_span, warn};

use super::binaries::Binaries;
use super::cache::FrameCache;
use super::debuginfo::DebugDirs;
use super::debuginfod::{ClientConfig, Debuginfod};
use super::maps::Files;
use super::{Request, SymbolizeConfig, SymbolizedSample, TRUNCATED};
use crate::ebpf::metrics::SymbolizeMetrics;
use crate::ebpf::process::{FileKey, Object, ProcessMap, process_start_time};
use crate::ebpf::sample::{PythonFrames, Splice, Stack, StackCount};

/// What a frame's name is cached under.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum FrameKey {
    /// A file offset in a binary.
    File(FileKey, u64),
    /// A kernel address.
    Kernel(u64),
}

/// When a captured process's map may be read again, because its samples hold addresses outside
/// it (a library loaded with `dlopen` since): the sans-IO rule, time passed in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Recapture {
    /// The start time of the process captured: a pid reused since is another process, whose
    /// map would name the old one's frames wrongly.
    start_time: Option<u64>,
    /// Not before then.
    next: Instant,
    /// The wait after a re-read that found nothing new; it doubles up to [`MAX_RECAPTURE_WAIT`].
    wait: Duration,
}

/// The first wait between two re-reads of one process's map.
const RECAPTURE_WAIT: Duration = Duration::from_secs(1);
/// The longest (code in anonymous memory never gets a mapping to find).
const MAX_RECAPTURE_WAIT: Duration = Duration::from_secs(64);

impl Recapture {
    fn new(start_time: Option<u64>, now: Instant) -> Recapture {
        Recapture {
            start_time,
            next: now,
            wait: RECAPTURE_WAIT,
        }
    }

    /// Whether the process, now started at `start_time` (`None`: gone), may be read again.
    fn due(&self, start_time: Option<u64>, now: Instant) -> bool {
        start_time.is_some() && start_time == self.start_time && now >= self.next
    }

    /// Records a re-read at `now`: `changed` says it found a new map.
    fn done(&mut self, changed: bool, now: Instant) {
        self.wait = if changed {
            RECAPTURE_WAIT
        } else {
            (self.wait * 2).min(MAX_RECAPTURE_WAIT)
        };
        self.next = now + self.wait;
    }
}

struct State {
    config: SymbolizeConfig,
    metrics: SymbolizeMetrics,
    blaze: Blaze,
    processes: HashMap<u32, ProcessMap>,
    /// When each captured process may be read again.
    recaptures: HashMap<u32, Recapture>,
    files: Files,
    binaries: Binaries,
    frames: FrameCache<FrameKey>,
    /// Counts requests, for least-recently-used file eviction.
    tick: u64,
}

/// Serves requests until the handle is dropped, beating `beat` between requests, between the
/// processes of a symbolization and every period while idle. Captures jump the queue: they are
/// taken between the processes of a symbolization in progress, so a short-lived process started
/// during a drain is captured before it exits.
pub(super) fn run(
    config: SymbolizeConfig,
    debug: DebugDirs,
    metrics: SymbolizeMetrics,
    rx: &mpsc::Receiver<Request>,
    beat: &Heartbeat,
) {
    let blaze = Blaze::builder()
        .enable_code_info(false)
        .enable_inlined_fns(false)
        .enable_demangling(true)
        .build();
    let debuginfod = match (&debug.downloaded, config.debuginfod_urls.is_empty()) {
        (Some(dir), false) => Debuginfod::start(
            ClientConfig {
                urls: config.debuginfod_urls.clone(),
                timeout: config.debuginfod_timeout,
                max_bytes: config.debuginfod_cache_bytes,
                dir: dir.clone(),
            },
            metrics.clone(),
        )
        .map_err(|err| warn!(error = %err, "the debuginfod client cannot start; stripped binaries keep module+offset names"))
        .ok(),
        (None, false) => {
            warn!("symbolize.debuginfod-urls needs a data directory for its cache; not fetching debug files");
            None
        }
        (_, true) => None,
    };
    let mut state = State {
        files: Files::new(config.max_open_files),
        binaries: Binaries::new(debug, debuginfod, metrics.clone()),
        frames: FrameCache::new(config.max_cached_frames),
        config,
        metrics,
        blaze,
        processes: HashMap::new(),
        recaptures: HashMap::new(),
        tick: 0,
    };
    let mut deferred = VecDeque::new();
    loop {
        beat.beat();
        let request = match deferred.pop_front() {
            Some(request) => request,
            None => match rx.recv_timeout(beat.period()) {
                Ok(request) => request,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            },
        };
        match request {
            Request::Capture(pid) => state.capture(pid),
            Request::Forget(pid) => state.forget(pid),
            Request::Symbolize(samples, reply) => {
                if smolder_daemon::fault::fire("symbolize-panic") {
                    panic!("injected fault symbolize-panic (SMOLDER_FAULTS)");
                }
                let _span = debug_span!("symbolize", samples = samples.len()).entered();
                let started = Instant::now();
                let answer = state.symbolize(samples, || {
                    beat.beat();
                    // Between processes: capture newcomers now, keep the rest for later.
                    deferred.extend(rx.try_iter());
                    let captures: Vec<u32> = deferred
                        .iter()
                        .filter_map(|r| match r {
                            Request::Capture(pid) => Some(*pid),
                            _ => None,
                        })
                        .collect();
                    deferred.retain(|r| !matches!(r, Request::Capture(_)));
                    captures
                });
                state
                    .metrics
                    .duration
                    .observe(started.elapsed().as_secs_f64());
                let _ = reply.send(answer);
            }
        }
    }
}

impl State {
    fn capture(&mut self, pid: u32) {
        self.tick += 1;
        self.recaptures
            .insert(pid, Recapture::new(process_start_time(pid), Instant::now()));
        let map = match ProcessMap::read(pid) {
            Ok(map) => map,
            Err(err) => {
                debug!(pid, error = %err, "process gone before its memory map was captured");
                self.metrics.capture_failures.inc();
                return;
            }
        };
        self.open_files(pid, &map);
        self.processes.insert(pid, map);
        self.metrics.captures.inc();
        self.update_gauges();
    }

    /// Opens the files of `map` not open yet and decides where their names come from.
    fn open_files(&mut self, pid: u32, map: &ProcessMap) {
        let mut evicted = Vec::new();
        self.files.open_for(pid, map, self.tick, &mut evicted);
        self.evict_files(evicted);
        for mapping in &map.mappings {
            let Object::File { key, path, .. } = &mapping.object else {
                continue;
            };
            if self.binaries.contains(*key) {
                continue;
            }
            if let Some(open) = self.files.path(*key, self.tick).map(|p| p.to_path_buf()) {
                self.binaries.analyze(pid, *key, path, &open);
            }
        }
    }

    /// Takes in the debug files debuginfod delivered: names cached from the stripped binaries
    /// go, to be read again from their debug files.
    fn poll_debuginfod(&mut self) {
        for key in self.binaries.poll() {
            self.frames
                .retain(|frame| !matches!(frame, FrameKey::File(file, _) if *file == key));
        }
    }

    fn forget(&mut self, pid: u32) {
        self.processes.remove(&pid);
        self.recaptures.remove(&pid);
        self.frames
            .retain(|key| *key != live_key(pid, key.offset()));
        let _ = self
            .blaze
            .evict(&evict::Process::new(Pid::from(pid)).into());
        self.update_gauges();
    }

    fn evict_files(&mut self, closed: Vec<(FileKey, PathBuf)>) {
        for (key, path) in closed {
            self.metrics.files_evicted.inc();
            let _ = self.blaze.evict(&evict::Elf::new(path).into());
            if let Some(debug) = self.binaries.remove(key) {
                let _ = self.blaze.evict(&evict::Elf::new(debug).into());
            }
        }
        // A closed file's descriptor number may be reused for another file; frames cached
        // under its key stay right, since keys are device and inode, not paths.
    }

    fn update_gauges(&self) {
        self.metrics
            .processes
            .set(i64::try_from(self.processes.len()).unwrap_or(i64::MAX));
        self.metrics
            .open_files
            .set(i64::try_from(self.files.len()).unwrap_or(i64::MAX));
        self.metrics
            .cached_frames
            .set(i64::try_from(self.frames.len()).unwrap_or(i64::MAX));
    }

    fn symbolize(
        &mut self,
        samples: Vec<StackCount>,
        mut between: impl FnMut() -> Vec<u32>,
    ) -> Vec<SymbolizedSample> {
        self.tick += 1;
        self.poll_debuginfod();
        let mut order: Vec<usize> = (0..samples.len()).collect();
        order.sort_by_key(|&i| samples[i].pid);
        let mut out: Vec<Option<SymbolizedSample>> = vec![None; samples.len()];
        let mut start = 0;
        while start < order.len() {
            let pid = samples[order[start]].pid;
            let end = start + order[start..].partition_point(|&i| samples[i].pid == pid);
            let group: Vec<&StackCount> = order[start..end].iter().map(|&i| &samples[i]).collect();
            self.resolve_process(pid, &group);
            for &i in &order[start..end] {
                out[i] = Some(self.name(&samples[i]));
            }
            for newcomer in between() {
                self.capture(newcomer);
            }
            start = end;
        }
        self.update_gauges();
        out.into_iter()
            .map(|s| s.expect("every sample is named"))
            .collect()
    }

    /// Resolves every uncached address of one process's samples, one blazesym call per binary.
    fn resolve_process(&mut self, pid: u32, samples: &[&StackCount]) {
        // Not captured by this run of the thread (it restarted since the process was first
        // seen, and what it knew went with the old run): capture it now, while it runs.
        if !self.processes.contains_key(&pid) && process_start_time(pid).is_some() {
            self.capture(pid);
        }
        // Code mapped since the capture (a library loaded with dlopen): read the map again.
        let unmapped = |map: &ProcessMap| {
            samples.iter().any(|sample| match &sample.user {
                Stack::Frames(frames) => frames
                    .iter()
                    .enumerate()
                    .any(|(depth, &addr)| map.find(call_site(addr, depth)).is_none()),
                Stack::Named(_) | Stack::None | Stack::Lost => false,
            })
        };
        let now = Instant::now();
        if self.processes.get(&pid).is_some_and(unmapped)
            && let Some(recapture) = self.recaptures.get(&pid).copied()
            && recapture.due(process_start_time(pid), now)
        {
            let before = self.processes.get(&pid).cloned();
            self.capture(pid);
            let changed = self.processes.get(&pid) != before.as_ref();
            let mut recapture = recapture;
            recapture.done(changed, now);
            self.recaptures.insert(pid, recapture);
        }
        let mut by_file: HashMap<FileKey, Vec<u64>> = HashMap::new();
        let mut live: Vec<u64> = Vec::new();
        let mut kernel: Vec<u64> = Vec::new();
        for sample in samples {
            if let Stack::Frames(frames) = &sample.user {
                for (depth, &addr) in frames.iter().enumerate() {
                    let addr = call_site(addr, depth);
                    match self.user_key(pid, addr) {
                        Some(FrameKey::File(file, offset)) => {
                            if self.frames.get(&FrameKey::File(file, offset)).is_none() {
                                by_file.entry(file).or_default().push(offset);
                            }
                        }
                        _ => {
                            if self.frames.get(&live_key(pid, addr)).is_none() {
                                live.push(addr);
                            }
                        }
                    }
                }
            }
            if self.config.kernel_frames
                && let Stack::Frames(frames) = &sample.kernel
            {
                for (depth, &addr) in frames.iter().enumerate() {
                    let addr = call_site(addr, depth);
                    if self.frames.get(&FrameKey::Kernel(addr)).is_none() {
                        kernel.push(addr);
                    }
                }
            }
        }
        if by_file.keys().any(|&file| !self.files.is_open(file)) {
            // Closed to stay within max-open-files since capture: reopen from the live process.
            if let Ok(map) = ProcessMap::read(pid) {
                self.open_files(pid, &map);
            }
        }
        let mut resolved = 0u64;
        let mut unresolved = 0u64;
        for (file, mut offsets) in by_file {
            offsets.sort_unstable();
            offsets.dedup();
            if self.files.path(file, self.tick).is_none() {
                continue;
            }
            let Some(binary) = self.binaries.get(file) else {
                continue;
            };
            let symbols = binary.symbols.clone();
            let layout = binary.layout.clone();
            let names = self.names_in(&symbols, layout.as_ref(), &offsets, pid);
            // A signal handler returns to the first byte of the trampoline that called it (the
            // kernel put that address on its stack), so one byte before it lies outside: such
            // frames are tried at the address itself.
            let retry: Vec<u64> = offsets
                .iter()
                .zip(&names)
                .filter(|(_, name)| name.is_none())
                .map(|(offset, _)| offset + 1)
                .collect();
            let retried = if retry.is_empty() {
                Vec::new()
            } else {
                self.names_in(&symbols, layout.as_ref(), &retry, pid)
            };
            let mut retried = retry.iter().zip(retried);
            for (offset, name) in offsets.iter().zip(names) {
                let name = match name {
                    Some(name) => Some(name),
                    None => retried.next().and_then(|(_, name)| name),
                };
                match name {
                    Some(name) => {
                        resolved += 1;
                        self.frames.insert(FrameKey::File(file, *offset), name);
                    }
                    None => unresolved += 1,
                }
            }
        }
        if !kernel.is_empty() {
            kernel.sort_unstable();
            kernel.dedup();
            // kallsyms only: a vmlinux image would cost memory for no better names.
            let source = Kernel {
                vmlinux: MaybeDefault::None,
                debug_syms: false,
                ..Kernel::default()
            };
            match self
                .blaze
                .symbolize(&Source::Kernel(source), Input::AbsAddr(&kernel))
            {
                Ok(names) => {
                    for (addr, name) in kernel.iter().zip(names) {
                        if let Symbolized::Sym(sym) = name {
                            resolved += 1;
                            self.frames
                                .insert(FrameKey::Kernel(*addr), Arc::from(&*sym.name));
                        } else {
                            unresolved += 1;
                        }
                    }
                }
                Err(err) => {
                    unresolved += kernel.len() as u64;
                    debug!(error = %err, "symbolizing kernel addresses failed");
                }
            }
        }
        self.metrics.frames_resolved.inc_by(resolved);
        self.metrics.frames_unresolved.inc_by(unresolved);
        // Anonymous and vDSO code: only the live process (its perf map, its vDSO) can tell.
        if !live.is_empty() && std::path::Path::new(&format!("/proc/{pid}")).exists() {
            live.sort_unstable();
            live.dedup();
            self.resolve_live(pid, &live);
        }
    }

    /// The names of file `offsets` in the ELF file `symbols`, which is the binary itself or,
    /// with `layout` (the binary's), its debug file, read by virtual address.
    fn names_in(
        &self,
        symbols: &std::path::Path,
        layout: Option<&smolder_unwind::Layout>,
        offsets: &[u64],
        pid: u32,
    ) -> Vec<Option<Arc<str>>> {
        let mut elf = Elf::new(symbols);
        elf.debug_syms = false;
        let addresses: Vec<u64> = match layout {
            // Offsets outside every segment stay unnamed.
            Some(layout) => offsets
                .iter()
                .map(|&offset| layout.virtual_address(offset).unwrap_or(u64::MAX))
                .collect(),
            None => offsets.to_vec(),
        };
        let input = match layout {
            Some(_) => Input::VirtOffset(addresses.as_slice()),
            None => Input::FileOffset(addresses.as_slice()),
        };
        match self.blaze.symbolize(&Source::Elf(elf), input) {
            Ok(names) => names
                .into_iter()
                .map(|name| match name {
                    Symbolized::Sym(sym) => Some(Arc::from(&*sym.name)),
                    Symbolized::Unknown(_) => None,
                })
                .collect(),
            Err(err) => {
                debug!(pid, error = %err, "symbolizing a binary failed");
                vec![None; offsets.len()]
            }
        }
    }

    /// Names of anonymous-memory (JIT) and vDSO addresses, cached per process under a pseudo
    /// file key holding the pid ([`live_key`]), which [`State::forget`] clears.
    fn resolve_live(&mut self, pid: u32, addrs: &[u64]) {
        let mut process = Process::new(Pid::from(pid));
        process.debug_syms = false;
        process.map_files = false;
        let Ok(names) = self
            .blaze
            .symbolize(&Source::Process(process), Input::AbsAddr(addrs))
        else {
            return;
        };
        for (addr, name) in addrs.iter().zip(names) {
            if let Symbolized::Sym(sym) = name {
                self.frames
                    .insert(live_key(pid, *addr), Arc::from(&*sym.name));
            }
        }
    }

    fn user_key(&self, pid: u32, addr: u64) -> Option<FrameKey> {
        let mapping = self.processes.get(&pid)?.find(addr)?;
        match &mapping.object {
            Object::File { key, .. } => {
                Some(FrameKey::File(*key, addr - mapping.start + mapping.offset))
            }
            Object::Vdso | Object::Anonymous => None,
        }
    }

    /// The name of a user frame: cached symbol, else `module+0xoffset`, else `[vdso]`,
    /// `[anonymous]` or `[unknown]`.
    fn user_frame(&mut self, pid: u32, addr: u64) -> Arc<str> {
        let Some(mapping) = self.processes.get(&pid).and_then(|map| map.find(addr)) else {
            return Arc::from("[unknown]");
        };
        match &mapping.object {
            Object::File { key, .. } => {
                let offset = addr - mapping.start + mapping.offset;
                let key = *key;
                let name = mapping.object.file_name().unwrap_or("[unknown]").to_owned();
                self.frames
                    .get(&FrameKey::File(key, offset))
                    .unwrap_or_else(|| Arc::from(format!("{name}+0x{offset:x}")))
            }
            Object::Vdso => self
                .frames
                .get(&live_key(pid, addr))
                .unwrap_or_else(|| Arc::from("[vdso]")),
            Object::Anonymous => self
                .frames
                .get(&live_key(pid, addr))
                .unwrap_or_else(|| Arc::from("[anonymous]")),
        }
    }

    fn name(&mut self, sample: &StackCount) -> SymbolizedSample {
        let mut frames: Vec<Arc<str>> = Vec::new();
        match &sample.user {
            Stack::Frames(addrs) => {
                if sample.truncated {
                    frames.push(Arc::from(TRUNCATED));
                }
                let splices: &[Splice] = match &sample.python {
                    PythonFrames::Mixed(splices) => splices,
                    PythonFrames::None | PythonFrames::Walked { .. } => &[],
                };
                let mut splices = splices.iter().peekable();
                let mut user: Vec<Arc<str>> = Vec::with_capacity(addrs.len());
                for (depth, &addr) in addrs.iter().enumerate() {
                    match splices.next_if(|s| s.depth == depth) {
                        Some(splice) => user.extend(splice.names.iter().cloned()),
                        None => user.push(self.user_frame(sample.pid, call_site(addr, depth))),
                    }
                }
                if let Some(above) = splices.next_if(|s| s.depth == addrs.len()) {
                    user.extend(above.names.iter().cloned());
                }
                frames.extend(user.into_iter().rev());
            }
            Stack::Named(names) => {
                if sample.truncated {
                    frames.push(Arc::from(TRUNCATED));
                }
                frames.extend(names.iter().rev().cloned());
            }
            Stack::None => {}
            Stack::Lost => frames.push(Arc::from("[user stack lost]")),
        }
        if self.config.kernel_frames {
            match &sample.kernel {
                Stack::Frames(addrs) => {
                    let kernel: Vec<Arc<str>> = addrs
                        .iter()
                        .enumerate()
                        .map(|(depth, &addr)| {
                            self.frames
                                .get(&FrameKey::Kernel(call_site(addr, depth)))
                                .unwrap_or_else(|| Arc::from("[unknown kernel]"))
                        })
                        .collect();
                    frames.extend(kernel.into_iter().rev());
                }
                Stack::Named(_) | Stack::None => {}
                Stack::Lost => frames.push(Arc::from("[kernel stack lost]")),
            }
        }
        if frames.is_empty() {
            frames.push(Arc::from("[no stack]"));
        }
        SymbolizedSample {
            kind: sample.kind,
            pid: sample.pid,
            frames,
            count: sample.count,
        }
    }
}

impl FrameKey {
    fn offset(&self) -> u64 {
        match self {
            FrameKey::File(_, offset) | FrameKey::Kernel(offset) => *offset,
        }
    }
}

/// The key of an anonymous or vDSO address of a live process.
fn live_key(pid: u32, addr: u64) -> FrameKey {
    FrameKey::File(
        FileKey {
            dev: u64::MAX,
            inode: u64::from(pid),
        },
        addr,
    )
}

/// The address to look up for a frame: a caller's frame holds the return address, which may
/// already belong to the next function when the call was the last instruction of its own.
fn call_site(addr: u64, depth: usize) -> u64 {
    if depth == 0 {
        addr
    } else {
        addr.saturating_sub(1)
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::ebpf::{SampleKind, SourceMetrics};

    const MAPS: &str = "\
55d0c0a01000-55d0c0a02000 r-xp 00001000 fd:01 1234                       /usr/bin/work
7f0000000000-7f0000100000 r-xp 00028000 fd:01 99                         /usr/lib/x86_64-linux-gnu/libc.so.6
";

    #[test]
    fn a_map_is_read_again_with_a_backoff_and_never_for_another_process() {
        let t0 = Instant::now();
        let mut recapture = Recapture::new(Some(100), t0);
        assert!(recapture.due(Some(100), t0));
        assert!(!recapture.due(Some(200), t0), "the pid was reused");
        assert!(!recapture.due(None, t0), "gone");
        recapture.done(false, t0);
        assert!(!recapture.due(Some(100), t0 + Duration::from_millis(1999)));
        assert!(recapture.due(Some(100), t0 + RECAPTURE_WAIT * 2));
        for _ in 0..10 {
            recapture.done(false, t0);
        }
        assert_eq!(recapture.next, t0 + MAX_RECAPTURE_WAIT);
        recapture.done(true, t0);
        assert_eq!(recapture.next, t0 + RECAPTURE_WAIT);
    }

    fn state() -> State {
        let metrics = SourceMetrics::standalone().1.symbolize;
        let mut state = State {
            config: SymbolizeConfig::default(),
            binaries: Binaries::new(DebugDirs::default(), None, metrics.clone()),
            metrics,
            blaze: Blaze::new(),
            processes: HashMap::from([(7, ProcessMap::parse(MAPS))]),
            recaptures: HashMap::new(),
            files: Files::new(4),
            frames: FrameCache::new(64),
            tick: 0,
        };
        let work = FileKey {
            dev: (0xfd << 32) | 1,
            inode: 1234,
        };
        let libc = FileKey {
            dev: (0xfd << 32) | 1,
            inode: 99,
        };
        // Callers are looked up one byte before their return address.
        state
            .frames
            .insert(FrameKey::File(work, 0x1100), Arc::from("leaf"));
        state
            .frames
            .insert(FrameKey::File(work, 0x11ff), Arc::from("main"));
        state.frames.insert(
            FrameKey::File(libc, 0x28010 - 1),
            Arc::from("__libc_start_call_main"),
        );
        state
    }

    fn sample(user: &[u64], truncated: bool, kernel: Stack) -> StackCount {
        StackCount {
            kind: SampleKind::Cpu,
            pid: 7,
            user: Stack::Frames(Arc::from(user)),
            truncated,
            kernel,
            python: PythonFrames::None,
            count: 3,
            samples: 3,
        }
    }

    fn names(named: &SymbolizedSample) -> Vec<&str> {
        named.frames.iter().map(|f| &**f).collect()
    }

    #[test]
    fn frames_are_root_first_and_unknown_ones_show_their_module() {
        let mut state = state();
        let named = state.name(&sample(
            &[
                0x55d0c0a01100,
                0x55d0c0a01200,
                0x7f0000000010,
                0x7f0000000501,
            ],
            false,
            Stack::Lost,
        ));
        assert_eq!(
            names(&named),
            [
                "libc.so.6+0x28500",
                "__libc_start_call_main",
                "main",
                "leaf",
                "[kernel stack lost]"
            ]
        );
        assert_eq!(named.count, 3);
        let outside = state.name(&sample(&[0x55d0c0a01100, 0x10], false, Stack::None));
        assert_eq!(names(&outside), ["[unknown]", "leaf"]);
    }

    #[test]
    fn a_stack_cut_at_the_depth_limit_gets_a_truncated_root() {
        let mut state = state();
        let named = state.name(&sample(
            &[0x55d0c0a01100, 0x55d0c0a01200],
            true,
            Stack::None,
        ));
        assert_eq!(names(&named), [TRUNCATED, "main", "leaf"]);
    }

    #[test]
    fn named_stacks_pass_through_root_first_above_kernel_frames() {
        let mut state = state();
        state.frames.insert(
            FrameKey::Kernel(0xffff_0000 - 1),
            Arc::from("do_syscall_64"),
        );
        state
            .frames
            .insert(FrameKey::Kernel(0xffff_1000), Arc::from("ksys_write"));
        let sample = StackCount {
            kind: SampleKind::Cpu,
            pid: 7,
            user: Stack::Named(Arc::from([
                Arc::from("leaf (/srv/app.py:9)"),
                Arc::from("<module> (/srv/app.py:1)"),
            ])),
            truncated: false,
            kernel: Stack::Frames(Arc::from([0xffff_1000, 0xffff_0000].as_slice())),
            python: PythonFrames::None,
            count: 4,
            samples: 4,
        };
        assert_eq!(
            names(&state.name(&sample)),
            [
                "<module> (/srv/app.py:1)",
                "leaf (/srv/app.py:9)",
                "do_syscall_64",
                "ksys_write"
            ]
        );
    }

    #[test]
    fn splices_stand_for_their_native_frames_and_one_past_the_root_goes_above_it() {
        let mut state = state();
        let python =
            |names: &[&str]| -> Arc<[Arc<str>]> { names.iter().map(|n| Arc::from(*n)).collect() };
        let mut mixed = sample(
            &[0x55d0c0a01100, 0x55d0c0a01200, 0x7f0000000010],
            false,
            Stack::None,
        );
        mixed.python = PythonFrames::Mixed(Arc::from([
            Splice {
                depth: 1,
                names: python(&["cb (/a.py:3)", "<module> (/a.py:1)"]),
            },
            Splice {
                depth: 3,
                names: python(&["outer (/a.py:9)"]),
            },
        ]));
        assert_eq!(
            names(&state.name(&mixed)),
            [
                "outer (/a.py:9)",
                "__libc_start_call_main",
                "<module> (/a.py:1)",
                "cb (/a.py:3)",
                "leaf"
            ]
        );
    }
}
