//! Whole stacks (issue 14), end to end: the real agent binary (`smolder-agent record --format
//! json`), as root and under exactly the capabilities of `systemd/smolder-agent.service` (run
//! as `nobody` through `setpriv`), against programs built here without frame pointers and
//! Debian's own `/usr/bin/python3.11`, each started before the agent. Samples count from the
//! first window that starts after the agent reports the process's tables loaded; at least 99%
//! of them must reach the true root (`_start`, or `clone3`/`start_thread` for threads).
//! `perf record --call-graph dwarf` on the same run must agree on the distribution of stack
//! shapes, a uprobe at a known function walked with the agent's own tables must give the known
//! call path frame by frame, a stripped binary must be named through a real `debuginfod`, and a
//! recursion 300 deep must give a `[truncated]` root over 128 frames.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::num::NonZeroU32;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aya::programs::UProbe;
use aya::programs::uprobe::UProbeScope;
use regex::Regex;
use serde::Deserialize;
use smolder_agent::config::{Config, SymbolizeConfig};
use smolder_agent::ebpf::process::{Object, ProcessMap};
use smolder_agent::ebpf::symbolize::{DebugDirs, Symbolizer};
use smolder_agent::ebpf::{
    PythonFrames, Reporting, SampleKind, Sampler, Stack, StackCount, Unwinder,
};
use smolder_agent::metrics::Metrics;
use smolder_agent_ebpf::PROGRAM_UPROBE;
use smolder_agent_ebpf::unwind::{SampleKind as RawKind, Status};

use crate::util::exclusive;

const WORKLOAD: &str = include_str!("testdata/unwind/workload.c");
const LIBRARY: &str = include_str!("testdata/unwind/library.c");
const CPP: &str = include_str!("testdata/unwind/sort.cpp");
const RUST: &str = include_str!("testdata/unwind/sort.rs");
const UNIT: &str = include_str!("../../../systemd/smolder-agent.service");

/// How the agent runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Privilege {
    Root,
    /// As `nobody`, with exactly the unit's capabilities, or with those but the ones named.
    Unit {
        without: &'static [&'static str],
    },
}

/// The capabilities `systemd/smolder-agent.service` grants, as setpriv names them.
fn unit_capabilities() -> Vec<String> {
    let line = UNIT
        .lines()
        .find_map(|line| line.strip_prefix("AmbientCapabilities="))
        .expect("the unit grants ambient capabilities");
    line.split_whitespace()
        .map(|cap| cap.trim_start_matches("CAP_").to_lowercase())
        .collect()
}

/// Builds the test programs into a temporary directory.
struct Programs {
    dir: tempfile::TempDir,
}

impl Programs {
    fn new() -> Programs {
        Programs {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn compile(&self, compiler: &str, source: &str, extension: &str, name: &str, args: &[&str]) {
        let file = self.path(&format!("{name}.{extension}"));
        std::fs::write(&file, source).unwrap();
        let output = Command::new(compiler)
            .args(args)
            .arg("-o")
            .arg(self.path(name))
            .arg(&file)
            .output()
            .unwrap_or_else(|err| panic!("running {compiler}: {err}"));
        assert!(
            output.status.success(),
            "{compiler} {name}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// `workload.c` with gcc -O2 and no frame pointers.
    fn workload(&self, name: &str) -> PathBuf {
        let args = ["-O2", "-fomit-frame-pointer", "-pthread"];
        self.compile("gcc", WORKLOAD, "c", name, &args);
        self.path(name)
    }

    /// A copy of `binary` under another name (the series' service name).
    fn copy(&self, binary: &Path, name: &str) -> PathBuf {
        std::fs::copy(binary, self.path(name)).unwrap();
        self.path(name)
    }
}

/// A program started before the agent, killed on drop.
struct Workload {
    child: Child,
    pid: u32,
    service: String,
}

impl Workload {
    fn start(service: &str, program: &Path, args: &[&str]) -> Workload {
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|err| panic!("starting {}: {err}", program.display()));
        Workload {
            pid: child.id(),
            child,
            service: service.to_owned(),
        }
    }
}

impl Workload {
    /// The next line the workload printed.
    fn line(&mut self) -> String {
        let mut line = String::new();
        BufReader::new(self.child.stdout.as_mut().expect("stdout is piped"))
            .read_line(&mut line)
            .unwrap();
        line
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Deserialize)]
struct Recorded {
    profiles: Vec<RecordedProfile>,
    ready: Vec<RecordedReady>,
}

#[derive(Deserialize)]
struct RecordedProfile {
    series: String,
    from: u128,
    stacks: Vec<(String, u64)>,
}

#[derive(Deserialize)]
struct RecordedReady {
    pid: u32,
    at: u128,
    after_ms: u128,
    refresh: bool,
    preloaded: bool,
}

/// A data directory every user may write: the agent may run as `nobody`.
fn data_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

/// Runs `smolder-agent record` for `seconds` with `config` (YAML), as `privilege`.
fn record(privilege: Privilege, config: &str, seconds: u64, data: &Path) -> Recorded {
    let file = data.join("agent.yaml");
    std::fs::write(&file, config).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let agent = env!("CARGO_BIN_EXE_smolder-agent");
    let mut command = match privilege {
        Privilege::Root => Command::new(agent),
        Privilege::Unit { without } => {
            let caps: Vec<String> = unit_capabilities()
                .into_iter()
                .filter(|cap| !without.contains(&cap.as_str()))
                .collect();
            let set = format!(
                "-all,{}",
                caps.iter()
                    .map(|cap| format!("+{cap}"))
                    .collect::<Vec<_>>()
                    .join(",")
            );
            let mut command = Command::new("setpriv");
            command
                .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
                .args(["--inh-caps", &set, "--ambient-caps", &set])
                .args(["--bounding-set", &set, "--"])
                .arg(agent);
            command
        }
    };
    let output = command
        .arg("--config")
        .arg(&file)
        .arg("--data-dir")
        .arg(data)
        .args(["--log-level", "warn", "record", "--format", "json"])
        .args(["--duration", &format!("{seconds}s")])
        .output()
        .expect("the agent runs");
    assert!(
        output.status.success(),
        "the agent failed ({privilege:?}): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("the recording is JSON")
}

/// A config keeping only the processes whose command line names `marker`, in 1 s windows.
fn config(marker: &str, extra: &str) -> String {
    format!(
        "window:\n  length: 1s\nebpf:\n  relabel-configs:\n    - {{source_labels: [__meta_process_cmdline], regex: '.*{marker}.*', action: keep}}\n{extra}"
    )
}

fn service_of(series: &str) -> &str {
    series.split(".cpu{").next().unwrap_or(series)
}

impl Recorded {
    /// When the agent last reported `pid`'s tables loaded (a refresh after a dlopen counts).
    fn ready_at(&self, pid: u32) -> Option<u128> {
        self.ready
            .iter()
            .filter(|ready| ready.pid == pid)
            .map(|ready| ready.at)
            .max()
    }

    /// The stacks of `service` in the windows that start at or after `since` (Unix ms).
    fn stacks_since(&self, service: &str, since: u128) -> Vec<(&str, u64)> {
        self.profiles
            .iter()
            .filter(|profile| service_of(&profile.series) == service && profile.from >= since)
            .flat_map(|profile| profile.stacks.iter().map(|(s, n)| (s.as_str(), *n)))
            .collect()
    }

    /// Asserts that at least 99% of `workload`'s samples taken once its tables were loaded
    /// match `root`, out of at least `min` samples.
    fn assert_whole(&self, workload: &Workload, root: &Regex, min: u64) -> Vec<(&str, u64)> {
        let ready = self
            .ready_at(workload.pid)
            .unwrap_or_else(|| panic!("{} never had its tables loaded", workload.service));
        let stacks = self.stacks_since(&workload.service, ready);
        let total: u64 = stacks.iter().map(|(_, n)| n).sum();
        let bad: Vec<&(&str, u64)> = stacks.iter().filter(|(s, _)| !root.is_match(s)).collect();
        let bad_total: u64 = bad.iter().map(|(_, n)| n).sum();
        assert!(
            total >= min,
            "{}: {total} samples after its tables loaded, too few to judge",
            workload.service
        );
        assert!(
            bad_total * 100 <= total,
            "{}: {bad_total} of {total} samples miss {root}: {:#?}",
            workload.service,
            &bad[..bad.len().min(8)]
        );
        stacks
    }
}

fn regex(pattern: &str) -> Regex {
    Regex::new(pattern).unwrap()
}

/// The whole-stack scenario, as `privilege`: every workload at once, one recording. With
/// `load_at_start`, the agent loads the tables of every kept process at its start; without, at
/// each one's first sample. Either way each gets its tables (how soon is printed, and measured
/// by the `startup` benchmark), and an idle process that is never sampled has its tables loaded
/// only with `load_at_start`.
fn whole_stacks(privilege: Privilege, load_at_start: bool) {
    let _host = exclusive();
    let programs = Programs::new();
    let workload = programs.workload("smolder-uw-qsort");
    let signal = programs.copy(&workload, "smolder-uw-signal");
    let plt = programs.copy(&workload, "smolder-uw-plt");
    let dlopen = programs.copy(&workload, "smolder-uw-dlopen");
    let deep = programs.copy(&workload, "smolder-uw-deep");
    programs.compile(
        "gcc",
        LIBRARY,
        "c",
        "libsmolder-uw.so",
        &["-O2", "-fomit-frame-pointer", "-shared", "-fPIC"],
    );
    let library = programs.path("libsmolder-uw.so");
    programs.compile(
        "g++",
        CPP,
        "cpp",
        "smolder-uw-cpp",
        &["-O2", "-fomit-frame-pointer"],
    );
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    programs.compile(
        &rustc,
        RUST,
        "rs",
        "smolder-uw-rust",
        &["-C", "opt-level=3"],
    );
    let idle = programs.copy(Path::new("/usr/bin/sleep"), "smolder-uw-idle");
    let script = programs.path("smolder-uw-python.py");
    std::fs::write(&script, "while True:\n    sum(range(1000))\n").unwrap();

    let qsort = Workload::start("smolder-uw-qsort", &workload, &["qsort", "6"]);
    let signal = Workload::start("smolder-uw-signal", &signal, &["signal", "6"]);
    let plt = Workload::start("smolder-uw-plt", &plt, &["plt", "0"]);
    let mut dlopen = Workload::start(
        "smolder-uw-dlopen",
        &dlopen,
        &["dlopen", "0", library.to_str().unwrap()],
    );
    let deep = Workload::start("smolder-uw-deep", &deep, &["qsort", "300"]);
    let idle = Workload::start("smolder-uw-idle", &idle, &["600"]);
    let cpp = Workload::start("smolder-uw-cpp", &programs.path("smolder-uw-cpp"), &[]);
    let rust = Workload::start("smolder-uw-rust", &programs.path("smolder-uw-rust"), &[]);
    let python = Workload::start(
        "python3.11",
        Path::new("/usr/bin/python3.11"),
        &[script.to_str().unwrap()],
    );
    let data = data_dir();
    // Kernel frames would follow the user frames: the deep stacks' frames are counted without.
    // Twelve threads share the CPUs: 199 Hz gives each enough samples to judge.
    let config = config(
        "smolder-uw-",
        &format!(
            "  frequency: 199\n  unwind:\n    load-at-start: {load_at_start}\nsymbolize:\n  kernel-frames: false\n"
        ),
    );
    let recorded = record(privilege, &config, 16, data.path());

    for workload in [&qsort, &signal, &plt, &dlopen, &deep, &cpp, &rust, &python] {
        let first = recorded
            .ready
            .iter()
            .find(|ready| ready.pid == workload.pid && !ready.refresh)
            .unwrap_or_else(|| panic!("{} never had its tables loaded", workload.service));
        // How soon is a benchmark figure (`ebpf_overhead -- startup`), not a bound here: on a
        // loaded CI machine the unwinder thread waits for a CPU like everything else. A process
        // first sampled counts from that sample (its wait in the unwinder's queue included), one
        // running at the agent's start from the start.
        assert!(!first.preloaded || load_at_start, "{}", workload.service);
        eprintln!(
            "{}: tables loaded {} ms after its first sight (preloaded: {})",
            workload.service, first.after_ms, first.preloaded
        );
    }
    let idle_loaded = recorded.ready.iter().any(|ready| ready.pid == idle.pid);
    assert!(
        recorded
            .profiles
            .iter()
            .all(|profile| service_of(&profile.series) != idle.service),
        "the idle process was sampled"
    );
    assert_eq!(
        idle_loaded, load_at_start,
        "an idle process has its tables loaded at start exactly with load-at-start"
    );

    // Main thread or either worker thread: entry point, libc's start, then the program's own,
    // recursing the known depth (recurse(6) down to recurse(0): seven frames).
    let threads =
        regex(r"^(_start;[^;]+;[^;]+;main|[^;]+;[^;]+;worker)(;recurse){7}(;[^r;][^;]*)*$");
    let stacks = recorded.assert_whole(&qsort, &threads, 50);
    assert!(
        stacks.iter().any(|(s, _)| s.contains(";worker;")),
        "no thread stack"
    );
    assert!(
        stacks.iter().any(|(s, _)| s.starts_with("_start;")),
        "no main-thread stack"
    );
    let main = regex(r"^_start;[^;]+;[^;]+;main(;recurse){7}(;[^r;][^;]*)*$");
    let stacks = recorded.assert_whole(&signal, &main, 50);
    // The handler's frames above the interrupted code, through glibc's __restore_rt.
    assert!(
        stacks
            .iter()
            .any(|(s, _)| s.contains(";sort_it;") && s.contains(";on_alarm;handler_work")),
        "no stack through the signal frame: {stacks:#?}"
    );
    recorded.assert_whole(&plt, &regex(r"^_start;[^;]+;[^;]+;main;plt_loop(;|$)"), 50);
    let stacks = recorded.assert_whole(
        &dlopen,
        &regex(r"^_start;[^;]+;[^;]+;main;call_library;library_outer(;library_outer)*(;library_inner)?$"),
        50,
    );
    // Loaded before the library was, the process's mappings were read again after walks left
    // them.
    let line = dlopen.line();
    let opened: u128 = line
        .strip_prefix("dlopen ")
        .and_then(|ms| ms.trim().parse().ok())
        .unwrap_or_else(|| panic!("the dlopen workload printed {line:?}"));
    let first = recorded
        .ready
        .iter()
        .filter(|r| r.pid == dlopen.pid)
        .map(|r| r.at)
        .min()
        .unwrap();
    if first < opened {
        assert!(
            recorded
                .ready
                .iter()
                .any(|r| r.pid == dlopen.pid && r.refresh && r.at > opened),
            "no refresh after the dlopen"
        );
    }
    assert!(stacks.iter().any(|(s, _)| s.ends_with(";library_inner")));
    recorded.assert_whole(
        &cpp,
        &regex(r"^_start;[^;]+;[^;]+;main;sort_forever\(\)(;|$)"),
        50,
    );
    recorded.assert_whole(
        &rust,
        &regex(r"^_start;[^;]+;[^;]+;main;.*;smolder_uw_rust::main;smolder_uw_rust::recurse(;smolder_uw_rust::recurse)*(;|$)"),
        50,
    );
    recorded.assert_whole(&python, &regex(r"^_start;[^;]+;[^;]+;Py_BytesMain;"), 50);
    // 300 calls deep: the leaf's 128 frames under a [truncated] root, never a lost sample.
    let stacks = recorded.assert_whole(&deep, &regex(r"^\[truncated\](;[^;]+){128}$"), 50);
    assert!(
        stacks.iter().any(|(s, _)| s.ends_with(";cmp;burn")),
        "the leaf part is kept"
    );
}

/// As root, tables loaded at each process's first sample (`ebpf.unwind.load-at-start: false`).
#[test]
fn whole_stacks_as_root() {
    whole_stacks(Privilege::Root, false);
}

/// Under the unit's capabilities, with its config's default: tables loaded at the agent's start.
#[test]
fn whole_stacks_under_the_units_capabilities() {
    whole_stacks(Privilege::Unit { without: &[] }, true);
}

/// `perf script` output: one stack per sample, leaf first, as symbol names.
fn perf_stacks(data: &Path) -> Vec<Vec<String>> {
    let output = Command::new("perf")
        .args(["script", "--no-inline", "-F", "ip,sym", "-i"])
        .arg(data)
        .output()
        .expect("perf script runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8_lossy(&output.stdout);
    let mut stacks = Vec::new();
    let mut current = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() {
            if !current.is_empty() {
                stacks.push(std::mem::take(&mut current));
            }
            continue;
        }
        let symbol = line.split_once(' ').map_or("", |(_, sym)| sym.trim());
        current.push(symbol.to_owned());
    }
    if !current.is_empty() {
        stacks.push(current);
    }
    stacks
}

/// The shape of a qsort stack, root first: how many frames libc's sort puts between `sort_it`
/// and `cmp`.
fn shape<'a>(frames: impl Iterator<Item = &'a str>) -> Option<usize> {
    frames
        .skip_while(|frame| *frame != "sort_it")
        .skip(1)
        .position(|frame| frame == "cmp")
}

fn distribution(shapes: &[(usize, u64)]) -> BTreeMap<usize, f64> {
    let total: u64 = shapes.iter().map(|(_, n)| n).sum();
    let mut out = BTreeMap::new();
    for (shape, n) in shapes {
        *out.entry(*shape).or_insert(0.0) += *n as f64 / total.max(1) as f64;
    }
    out
}

#[test]
fn perf_agrees_on_the_distribution_of_stack_shapes() {
    let _host = exclusive();
    let programs = Programs::new();
    let binary = programs.workload("smolder-uw-shapes");
    let workload = Workload::start("smolder-uw-shapes", &binary, &["qsort", "4"]);
    let data = data_dir();
    let perf_data = data.path().join("perf.data");
    let mut perf = Command::new("perf")
        .args([
            "record",
            "-q",
            "-F",
            "99",
            "--call-graph",
            "dwarf,65528",
            "-p",
        ])
        .arg(workload.pid.to_string())
        .arg("-o")
        .arg(&perf_data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("perf runs (apt-get install linux-perf)");
    let recorded = record(
        Privilege::Root,
        &config("smolder-uw-shapes", ""),
        10,
        data.path(),
    );
    // SIGINT: perf writes its data and exits.
    Command::new("kill")
        .args(["-INT", &perf.id().to_string()])
        .status()
        .unwrap();
    perf.wait().unwrap();

    let ready = recorded.ready_at(workload.pid).expect("tables loaded");
    let ours: Vec<(usize, u64)> = recorded
        .stacks_since("smolder-uw-shapes", ready)
        .iter()
        .filter_map(|(stack, n)| Some((shape(stack.split(';'))?, *n)))
        .collect();
    let theirs: Vec<(usize, u64)> = perf_stacks(&perf_data)
        .iter()
        .filter_map(|stack| Some((shape(stack.iter().rev().map(String::as_str))?, 1)))
        .collect();
    let (n_ours, n_theirs) = (
        ours.iter().map(|(_, n)| n).sum::<u64>(),
        theirs.len() as u64,
    );
    assert!(
        n_ours >= 200 && n_theirs >= 200,
        "too few samples in the sort: ours {n_ours}, perf's {n_theirs}"
    );
    let (ours, theirs) = (distribution(&ours), distribution(&theirs));
    // Total variation distance between the two distributions of libc frames in the sort.
    let shapes: BTreeSet<usize> = ours.keys().chain(theirs.keys()).copied().collect();
    let distance: f64 = shapes
        .iter()
        .map(|s| (ours.get(s).unwrap_or(&0.0) - theirs.get(s).unwrap_or(&0.0)).abs())
        .sum::<f64>()
        / 2.0;
    assert!(
        distance <= 0.15,
        "stack shapes differ by {distance:.3}: ours {ours:?}, perf's {theirs:?}"
    );
}

#[test]
fn a_uprobe_walked_with_the_agents_tables_gives_the_known_call_path() {
    let _host = exclusive();
    let programs = Programs::new();
    let binary = programs.workload("smolder-uw-point");
    let workload = Workload::start("smolder-uw-point", &binary, &["qsort", "5"]);

    let config = Config::default();
    let metrics = Metrics::new();
    let mut sampler = Sampler::load(&config.ebpf, std::process::id()).expect("load (as root)");
    let unwinder = Unwinder::start(
        sampler.take_unwind_maps().unwrap(),
        &config.ebpf.unwind,
        config.ebpf.exit_grace,
        None,
        DebugDirs::default(),
        Reporting {
            metrics: metrics.ebpf.unwind.clone(),
            errors: metrics.ebpf.tier.clone(),
            heartbeat: metrics.health.register("unwind", Duration::from_secs(30)),
        },
    )
    .unwrap();
    let start_time = smolder_agent::ebpf::process::process_start_time(workload.pid).unwrap();
    unwinder.seen(workload.pid, start_time);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !unwinder.take_ready().iter().any(|r| r.pid == workload.pid) {
        assert!(Instant::now() < deadline, "the tables never loaded");
        std::thread::sleep(Duration::from_millis(20));
    }
    let program: &mut UProbe = sampler
        .program_mut(PROGRAM_UPROBE)
        .unwrap()
        .try_into()
        .unwrap();
    program.load().unwrap();
    program
        .attach(
            "burn",
            &binary,
            UProbeScope::OneProcess(NonZeroU32::new(workload.pid).unwrap()),
        )
        .unwrap();

    let mut walks: Vec<(u16, u16, Vec<u64>)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while walks.len() < 300 && Instant::now() < deadline {
        sampler.read_samples(|sample| {
            if RawKind::from_raw(sample.header.kind) == Some(RawKind::Uprobe)
                && sample.header.tgid == workload.pid
            {
                walks.push((
                    sample.header.status,
                    sample.header.fp_frames,
                    sample.user().collect(),
                ));
            }
        });
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(walks.len() >= 300, "{} uprobe hits", walks.len());

    // The agent's symbolizer names the frames.
    let symbolizer = Symbolizer::start(
        SymbolizeConfig::default(),
        DebugDirs::default(),
        metrics.symbolize.clone(),
        metrics
            .health
            .register("symbolize", std::time::Duration::from_secs(10)),
    )
    .unwrap();
    symbolizer.capture(workload.pid).unwrap();
    let stacks: Vec<StackCount> = walks
        .iter()
        .map(|(_, _, frames)| StackCount {
            kind: SampleKind::Cpu,
            pid: workload.pid,
            user: Stack::Frames(frames.as_slice().into()),
            truncated: false,
            kernel: Stack::None,
            python: PythonFrames::None,
            count: 1,
            samples: 1,
        })
        .collect();
    let pending = symbolizer.submit(stacks).unwrap();
    let named = loop {
        if let Some(named) = pending.wait_for(Duration::from_secs(1)).unwrap() {
            break named;
        }
    };
    // Exactly the call path, root first: the entry point, libc's start (or clone3 and
    // start_thread), main or worker, five recursions, sort_it, libc's sort, cmp, burn.
    let path = regex(
        r"^(_start;[^;]+;[^;]+;main|[^;]+;[^;]+;worker)(;recurse){6};sort_it(;[^;]+)+;cmp;burn$",
    );
    let bytes = std::fs::read(&binary).unwrap();
    let elf = smolder_unwind::Elf::parse(&bytes).unwrap();
    let burn = elf.symbol("burn").unwrap().0;
    // burn's runtime address: its ELF address plus the load bias of the executable mapping of
    // the binary that holds it.
    let map = ProcessMap::read(workload.pid).unwrap();
    let burn_at = map
        .mappings
        .iter()
        .filter(|m| matches!(&m.object, Object::File { path, .. } if Path::new(&**path) == binary))
        .find_map(|m| {
            let at = burn.checked_add(elf.bias(m.start, m.offset)?)?;
            (m.start..m.end).contains(&at).then_some(at)
        })
        .expect("burn lies in an executable mapping of the binary");
    assert_eq!(named.len(), walks.len(), "one named stack per walk");
    for ((status, fp_frames, frames), sample) in walks.iter().zip(&named) {
        let text = sample
            .frames
            .iter()
            .map(|f| &**f)
            .collect::<Vec<_>>()
            .join(";");
        assert_eq!(Status::from_raw(*status), Some(Status::Complete), "{text}");
        assert_eq!(*fp_frames, 0, "every frame from a table: {text}");
        assert!(path.is_match(&text), "{text}");
        assert_eq!(frames[0], burn_at, "the leaf is the probed instruction");
    }
}

/// A bare HTTP/1.0 GET on loopback: the status code.
fn http_status(port: u16, path: &str) -> Option<u16> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .ok()?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn a_stripped_binary_is_named_through_debuginfod_and_sampled_without_it() {
    let _host = exclusive();
    let programs = Programs::new();
    let full = programs.workload("smolder-uw-full");
    let served = programs.path("served");
    std::fs::create_dir(&served).unwrap();
    let debug = served.join("smolder-uw-stripped.debug");
    let stripped = programs.path("smolder-uw-stripped");
    for args in [
        vec![
            "--only-keep-debug".to_owned(),
            full.display().to_string(),
            debug.display().to_string(),
        ],
        vec![
            "--strip-all".to_owned(),
            format!("--add-gnu-debuglink={}", debug.display()),
            full.display().to_string(),
            stripped.display().to_string(),
        ],
    ] {
        assert!(
            Command::new("objcopy")
                .args(&args)
                .status()
                .unwrap()
                .success()
        );
    }
    let bytes = std::fs::read(&stripped).unwrap();
    let build_id = hex(smolder_unwind::Elf::parse(&bytes)
        .unwrap()
        .build_id()
        .unwrap());

    // A real debuginfod on loopback, serving the debug file by build id.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = Command::new("debuginfod")
        .args(["-p", &port.to_string(), "-F"])
        .arg(&served)
        .arg("-d")
        .arg(programs.path("debuginfod.sqlite"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("debuginfod runs (apt-get install debuginfod)");
    let url = format!("/buildid/{build_id}/debuginfo");
    let deadline = Instant::now() + Duration::from_secs(60);
    while http_status(port, &url) != Some(200) {
        assert!(
            Instant::now() < deadline,
            "debuginfod never served the file"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let _workload = Workload::start("smolder-uw-stripped", &stripped, &["qsort", "3"]);
    let extra = format!(
        "symbolize:\n  debug-dirs: []\n  debuginfod-urls: ['http://127.0.0.1:{port}']\n  kernel-frames: false\n"
    );
    let config = config("smolder-uw-stripped", &extra);
    let data = data_dir();
    let recorded = record(Privilege::Unit { without: &[] }, &config, 8, data.path());
    // The last windows: by then the debug file has arrived.
    let last = recorded
        .profiles
        .iter()
        .filter(|p| service_of(&p.series) == "smolder-uw-stripped")
        .map(|p| p.from)
        .max()
        .expect("the stripped program was sampled");
    let stacks = recorded.stacks_since("smolder-uw-stripped", last - 2000);
    let unnamed = regex(r"smolder-uw-stripped\+0x");
    assert!(
        stacks.iter().all(|(s, _)| !unnamed.is_match(s)),
        "unnamed frames: {stacks:#?}"
    );
    assert!(
        stacks
            .iter()
            .any(|(s, _)| s.starts_with("_start;") && s.ends_with(";cmp;burn")),
        "{stacks:#?}"
    );
    assert!(
        data.path()
            .join("debuginfod")
            .join(format!("{build_id}.debug"))
            .exists(),
        "the debug file is cached"
    );

    // The server down, a fresh agent: sampling goes on with module+offset frames.
    server.kill().unwrap();
    server.wait().unwrap();
    let data = data_dir();
    let recorded = record(Privilege::Unit { without: &[] }, &config, 4, data.path());
    let stacks = recorded.stacks_since("smolder-uw-stripped", 0);
    assert!(!stacks.is_empty(), "nothing sampled without the server");
    assert!(
        stacks.iter().all(|(s, _)| !s.contains("sort_it")),
        "no names without the debug file"
    );
    assert!(
        stacks.iter().any(|(s, _)| unnamed.is_match(s)),
        "{stacks:#?}"
    );
}

#[test]
fn deleted_binaries_need_checkpoint_restore() {
    let _host = exclusive();
    let programs = Programs::new();
    let binary = programs.workload("smolder-uw-deleted");
    let workload = Workload::start("smolder-uw-deleted", &binary, &["qsort", "3"]);
    // Replaced on disk while it runs, as a package upgrade does.
    std::fs::remove_file(&binary).unwrap();
    let config = config("smolder-uw-deleted", "symbolize:\n  kernel-frames: false\n");
    let main = regex(r"^(_start;[^;]+;[^;]+;main|[^;]+;[^;]+;worker)(;recurse)+(;|$)");

    // With the unit's capabilities, /proc/PID/map_files opens the deleted binary.
    let data = data_dir();
    let recorded = record(Privilege::Unit { without: &[] }, &config, 6, data.path());
    recorded.assert_whole(&workload, &main, 30);

    // Without CAP_CHECKPOINT_RESTORE only /proc/PID/root/<path> is left, which names no file:
    // no table and no names for the program's own code; libc's still work.
    let data = data_dir();
    let recorded = record(
        Privilege::Unit {
            without: &["checkpoint_restore"],
        },
        &config,
        6,
        data.path(),
    );
    let stacks = recorded.stacks_since("smolder-uw-deleted", 0);
    let total: u64 = stacks.iter().map(|(_, n)| n).sum();
    let whole: u64 = stacks
        .iter()
        .filter(|(s, _)| main.is_match(s))
        .map(|(_, n)| n)
        .sum();
    assert!(total >= 30, "{total} samples");
    assert!(
        whole * 10 < total,
        "{whole} of {total} whole without map_files"
    );
    assert!(
        stacks
            .iter()
            .any(|(s, _)| s.contains("smolder-uw-deleted+0x")),
        "{stacks:#?}"
    );
}
