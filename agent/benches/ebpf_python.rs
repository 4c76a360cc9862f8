//! What Python stacks cost, measured against baselines in the same run (BENCHMARKS.md).
//!
//! `bpf_cost`: the sampler's `on_cpu` program attached to one CPython 3.11 process (Debian's
//! `/usr/bin/python3.11`) spinning 30 Python frames deep, at 999 Hz so that rounds are short.
//! Rounds alternate between the process registered for the Python walk and not registered (the
//! native path alone: the unwinder's walk, here without tables, so it stops at the interpreter's
//! first frame without frame pointer, and the kernel stack); the kernel's run time per
//! invocation (`kernel.bpf_stats_enabled`) of this program alone is the measure, so other load on
//! the machine does not enter it, and the difference of the two is the Python walk's own cost.
//! The samples ring buffer is read during each walked round to check that the samples carried
//! 30 Python frames.
//!
//! `slowdown`: a CPU-bound Python workload (a fixed amount of work, 12 frames deep) runs with no
//! profiler, with the release `smolder-agent` daemon sampling at 99 Hz with Python stacks, and
//! under `py-spy record --rate 99` (attached to its pid, default blocking mode), interleaved
//! round by round, each round in another order. The workload's own CPU time (user + system,
//! from `wait4`) and its wall time are the measures; py-spy's cost lands in its own process and
//! in the workload's pauses (wall time), the agent's in the workload's CPU time.
//!
//! `memory`: the daemon with 50 CPython processes (each a different script, waking every 100 ms
//! for a burst 15 frames deep), keeping only them (a `keep` rule), with `ebpf.python.enabled`
//! on and off in alternating order over the rounds, each measured after 25 s: the daemon's RSS
//! from `/proc/PID/smaps_rollup`, split into anonymous memory (its own) and file-backed (the
//! binaries it maps to symbolize, shared and reclaimable), its peak, and what the Python walk
//! reports. A first run fills the disk cache of unwind tables that every measured run reads,
//! so that neither condition builds the tables the other reads.
//!
//! ```sh
//! cargo bench -p smolder-agent --bench ebpf_python -- bpf_cost slowdown memory
//! ```
//! `SMOLDER_BENCH_ROUNDS` (default 10) sets the rounds of all three; `SMOLDER_PY_SPY` the
//! py-spy binary (default `py-spy` on `PATH`). Needs root, Debian's python3.11 and PyPI's
//! py-spy, installed with pip into pyenv's 3.12:
//! `$(pyenv root)/versions/3.12.1/bin/pip install py-spy`, then
//! `SMOLDER_PY_SPY=$(pyenv root)/versions/3.12.1/bin/py-spy`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use aya::EbpfLoader;
use aya::maps::{HashMap, MapData, RingBuf};
use aya::programs::PerfEvent;
use aya::programs::perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent};
use smolder_agent::ebpf::python::{Detector, kernel_entry};
use smolder_agent_ebpf::unwind::{MAP_SAMPLES, parse_sample};
use smolder_agent_ebpf::{self as kernel, PythonProc, PythonStatus};

const AGENT: &str = env!("CARGO_BIN_EXE_smolder-agent");
const PYTHON: &str = "/usr/bin/python3.11";

/// Spins 30 frames deep: `<module>`, `main` and 28 `rec`.
const DEEP: &str = r#"
def rec(n):
    if n == 0:
        while True:
            pass
    rec(n - 1)

def main():
    rec(27)

main()
"#;

/// Waits for a line on stdin, then does `argv[1]` rounds of work 12 frames deep.
const WORKLOAD: &str = r#"
import sys

def leaf(n):
    total = 0
    for i in range(n):
        total += i * i
    return total

def level(depth, n):
    if depth == 0:
        return leaf(n)
    return level(depth - 1, n)

def main(rounds):
    for _ in range(rounds):
        level(9, 2000)

sys.stdin.readline()
main(int(sys.argv[1]))
"#;

fn bench_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("smolder-bench-py-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("creating the bench directory");
    dir
}

fn rounds() -> usize {
    std::env::var("SMOLDER_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Enables `kernel.bpf_stats_enabled` until dropped.
struct BpfStats(String);

impl BpfStats {
    const PATH: &str = "/proc/sys/kernel/bpf_stats_enabled";

    fn enable() -> BpfStats {
        let before = std::fs::read_to_string(Self::PATH).unwrap_or_else(|_| "0".into());
        std::fs::write(Self::PATH, "1").expect("enabling kernel.bpf_stats_enabled (needs root)");
        BpfStats(before)
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::PATH, self.0.trim());
    }
}

fn bpf_cost() {
    let rounds = rounds();
    let dir = bench_dir();
    let script = dir.join("deep.py");
    std::fs::write(&script, DEEP).unwrap();
    let mut workload = Command::new(PYTHON)
        .arg(&script)
        .spawn()
        .expect("python3.11 starts");
    let pid = workload.id();
    sleep(Duration::from_millis(500));
    let found = Detector::default()
        .process(Path::new("/proc"), pid)
        .expect("reading the workload")
        .expect("the workload runs CPython");
    let target = found.target.expect("CPython 3.11 is supported");
    let entry: PythonProc = kernel_entry(Path::new("/proc"), pid, &target).unwrap();

    let _stats = BpfStats::enable();
    let mut ebpf = EbpfLoader::new()
        .override_global(kernel::GLOBAL_SELF_TGID, &std::process::id(), true)
        // The off-CPU task storage, which aya creates but has no type for.
        .allow_unsupported_maps()
        .load(kernel::OBJECT)
        .expect("loading the sampler (needs root)");
    let mut procs: HashMap<_, u32, PythonProc> =
        HashMap::try_from(ebpf.take_map(kernel::MAP_PYTHON_PROCS).unwrap()).unwrap();
    let mut ring = RingBuf::try_from(ebpf.take_map(MAP_SAMPLES).unwrap()).unwrap();
    let program: &mut PerfEvent = ebpf
        .program_mut(kernel::PROGRAM_CPU)
        .unwrap()
        .try_into()
        .unwrap();
    program.load().unwrap();
    program
        .attach(
            PerfEventConfig::Software(SoftwareEvent::CpuClock),
            PerfEventScope::OneProcess { pid, cpu: None },
            SamplePolicy::Frequency(999),
            false,
        )
        .expect("attaching to the workload");
    let stats = |program: &PerfEvent| {
        let info = program.info().unwrap();
        (info.run_time(), info.run_count())
    };
    // Samples with Python frames, and those with all 30, read as the ring buffer fills.
    let mut deep_samples = 0u64;
    let mut all_samples = 0u64;
    let mut drain = |ring: &mut RingBuf<MapData>| {
        while let Some(item) = ring.next() {
            let Ok(sample) = parse_sample(&item) else {
                continue;
            };
            if PythonStatus::from_raw(sample.header.python_status) == Some(PythonStatus::Ok) {
                all_samples += 1;
                if sample.header.python_len == 30 {
                    deep_samples += 1;
                }
            }
        }
    };
    let mut measure = |program: &PerfEvent, ring: &mut RingBuf<MapData>| {
        let before = stats(program);
        for _ in 0..40 {
            sleep(Duration::from_millis(100));
            drain(ring);
        }
        let after = stats(program);
        let runs = after.1 - before.1;
        let ns = (after.0 - before.0).as_nanos() as f64 / runs.max(1) as f64;
        (ns, runs)
    };
    let mut walked = Vec::new();
    let mut native = Vec::new();
    let mut python_own = Vec::new();
    for round in 0..rounds {
        procs.insert(pid, entry, 0).unwrap();
        let (python_ns, python_runs) = measure(program, &mut ring);
        procs.remove(&pid).unwrap();
        let (native_ns, native_runs) = measure(program, &mut ring);
        eprintln!(
            "round {round}: with the Python walk {python_ns:.0} ns ({python_runs} runs), without {native_ns:.0} ns ({native_runs} runs)"
        );
        walked.push(python_ns);
        native.push(native_ns);
        python_own.push(python_ns - native_ns);
    }
    let _ = workload.kill();
    let _ = workload.wait();
    println!("bpf_cost ({rounds} rounds of 4 s at 999 Hz, one python3.11 process 30 frames deep)");
    println!(
        "  on_cpu with the Python walk: median {:.0} ns per sample",
        median(&mut walked)
    );
    println!(
        "  on_cpu without it (native walk and kernel stack): median {:.0} ns per sample",
        median(&mut native)
    );
    println!(
        "  the Python walk's own cost: median {:.0} ns per sample",
        median(&mut python_own)
    );
    println!("  Python samples with 30 frames: {deep_samples} of {all_samples}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Starts the release agent daemon with `extra` config lines and the data directory `data`;
/// returns it and its port.
fn start_agent(dir: &Path, data: &Path, extra: &str) -> (Child, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let config = dir.join("agent.yaml");
    std::fs::write(
        &config,
        format!("http:\n  listen: 127.0.0.1:{port}\nship:\n  aggregator: 127.0.0.1:9\n{extra}"),
    )
    .unwrap();
    let child = Command::new(AGENT)
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(data)
        .arg("--log-level")
        .arg("error")
        .spawn()
        .expect("the agent starts");
    (child, port)
}

fn terminate(mut child: Child, signal: i32) {
    let pid = i32::try_from(child.id()).expect("a pid fits i32");
    // SAFETY: kill(2) on a child we started and have not reaped; no memory is involved.
    unsafe {
        libc::kill(pid, signal);
    }
    let _ = child.wait();
}

fn scrape(port: u16) -> String {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n");
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    text
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn wait_for_drains(port: u16, drains: f64) {
    let started = Instant::now();
    while metric(&scrape(port), "smolder_agent_ebpf_drains_total") < drains
        && started.elapsed() < Duration::from_secs(60)
    {
        sleep(Duration::from_millis(200));
    }
}

/// A workload waiting at its start gate.
struct Gated {
    child: Child,
    started: Option<Instant>,
}

impl Gated {
    fn spawn(script: &Path, rounds: u64) -> Gated {
        let child = Command::new("nice")
            .args(["-n", "-19", PYTHON])
            .arg(script)
            .arg(rounds.to_string())
            .stdin(Stdio::piped())
            .spawn()
            .expect("the workload starts");
        // Let the interpreter start up before anything measures it.
        sleep(Duration::from_millis(300));
        Gated {
            child,
            started: None,
        }
    }

    fn release(&mut self) {
        self.started = Some(Instant::now());
        let mut stdin = self.child.stdin.take().unwrap();
        stdin.write_all(b"\n").unwrap();
    }

    /// (CPU seconds, wall seconds since the release); wait4 reaps the child and returns its
    /// resource usage.
    fn wait(self) -> (f64, f64) {
        let pid = i32::try_from(self.child.id()).expect("a pid fits i32");
        let mut status = 0;
        // SAFETY: an all-zero rusage is a valid value for wait4 to overwrite.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: wait4 on our own child with valid pointers to locals.
        let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        assert_eq!(waited, pid, "wait4 failed");
        let wall = self.started.expect("released").elapsed().as_secs_f64();
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        (secs(usage.ru_utime) + secs(usage.ru_stime), wall)
    }
}

fn run(script: &Path, work: u64) -> (f64, f64) {
    let mut gated = Gated::spawn(script, work);
    gated.release();
    gated.wait()
}

fn slowdown() {
    let rounds = rounds();
    let dir = bench_dir();
    let script = dir.join("smolder-bench-workload.py");
    std::fs::write(&script, WORKLOAD).unwrap();
    let py_spy = std::env::var("SMOLDER_PY_SPY").unwrap_or_else(|_| "py-spy".into());
    // Calibrate to about 3 s of CPU (the interpreter's start-up, some 15 ms, is in both runs).
    let (cpu, _) = run(&script, 5000);
    let work = ((3.0 / cpu) * 5000.0).max(5000.0) as u64;
    eprintln!("workload: {work} rounds (calibrated: 5000 rounds = {cpu:.3} s)");
    let (mut none, mut agent, mut spy) = (Vec::new(), Vec::new(), Vec::new());
    let (mut agent_cpu, mut agent_wall, mut spy_cpu, mut spy_wall) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // Each round runs the three conditions in another order (none, agent, py-spy; then
    // agent, py-spy, none; ...), so that a drift of the VM's speed over a round does not
    // favour the condition that always runs first.
    let mut python_samples = 0.0;
    let mut measure = |condition: usize| -> (f64, f64) {
        match condition {
            0 => run(&script, work),
            1 => {
                let (daemon, port) = start_agent(&dir, &dir.join("agent-data"), "");
                // Steady state: after the first drain, which symbolizes every binary on the
                // host once.
                wait_for_drains(port, 1.0);
                let drains = metric(&scrape(port), "smolder_agent_ebpf_drains_total");
                let sampled = run(&script, work);
                // The drain after the run counts its samples.
                wait_for_drains(port, drains + 1.0);
                python_samples += metric(
                    &scrape(port),
                    "smolder_agent_python_samples_total{stack=\"mixed\"}",
                );
                terminate(daemon, libc::SIGTERM);
                sampled
            }
            _ => {
                let mut gated = Gated::spawn(&script, work);
                let recorder = Command::new(&py_spy)
                    .args(["record", "--rate", "99", "--format", "raw", "--pid"])
                    .arg(gated.child.id().to_string())
                    .arg("-o")
                    .arg(dir.join("py-spy.txt"))
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("py-spy starts (pip install py-spy, or set SMOLDER_PY_SPY)");
                sleep(Duration::from_secs(1));
                gated.release();
                let spied = gated.wait();
                terminate(recorder, libc::SIGINT);
                spied
            }
        }
    };
    for round in 0..rounds {
        let mut results = [(0.0, 0.0); 3];
        for i in 0..3 {
            let condition = (round + i) % 3;
            results[condition] = measure(condition);
        }
        let [base, sampled, spied] = results;
        eprintln!(
            "round {round}: cpu none {:.3} s, agent {:.3} s, py-spy {:.3} s; wall {:.3} / {:.3} / {:.3} s",
            base.0, sampled.0, spied.0, base.1, sampled.1, spied.1
        );
        agent_cpu.push(sampled.0 / base.0);
        agent_wall.push(sampled.1 / base.1);
        spy_cpu.push(spied.0 / base.0);
        spy_wall.push(spied.1 / base.1);
        none.push(base.0);
        agent.push(sampled.0);
        spy.push(spied.0);
    }
    let mean_err = |v: &[f64]| {
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
        format!("{mean:.4} ± {:.4}", (var / n).sqrt())
    };
    println!(
        "slowdown ({rounds} rounds, CPU-bound python3.11 workload; ratios to none: median, mean ± std. error)"
    );
    println!("  none    cpu {:.3} s", median(&mut none));
    println!(
        "  agent   cpu {:.3} s; cpu {:.4} ({}), wall {:.4} ({}); {python_samples:.0} Python samples in all",
        median(&mut agent),
        median(&mut agent_cpu),
        mean_err(&agent_cpu),
        median(&mut agent_wall),
        mean_err(&agent_wall)
    );
    println!(
        "  py-spy  cpu {:.3} s; cpu {:.4} ({}), wall {:.4} ({})",
        median(&mut spy),
        median(&mut spy_cpu),
        mean_err(&spy_cpu),
        median(&mut spy_wall),
        mean_err(&spy_wall)
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// The `field` (kB) of `/proc/PID/<file>` (`status`, `smaps_rollup`), in KiB; 0 when absent.
fn proc_kib(pid: u32, file: &str, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/{file}"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// A script of its own per process: `burst_<i>_<depth>` functions, 15 deep, every 100 ms (about
/// 1 % of a core each).
fn idle_script(i: usize) -> String {
    let mut text = String::from("import time\n\n");
    for depth in 0..14 {
        let next = if depth == 13 {
            "    return sum(range(50000))\n".to_owned()
        } else {
            format!("    return burst_{i}_{}()\n", depth + 1)
        };
        text.push_str(&format!("def burst_{i}_{depth}():\n{next}\n"));
    }
    text.push_str(&format!(
        "while True:\n    burst_{i}_0()\n    time.sleep(0.1)\n"
    ));
    text
}

/// The agent's memory at the end of one run, in MiB.
#[derive(Clone, Copy, Debug)]
struct Footprint {
    rss: f64,
    peak: f64,
    anonymous: f64,
    /// File-backed: the binaries the symbolizer maps and the agent's own, shared and reclaimable.
    file: f64,
    walked: f64,
    samples: f64,
}

/// Runs the daemon with `extra` config, keeping only the benchmark's processes, its tables
/// from the warm disk cache in `data`; measures it after `warm_up`.
fn footprint(dir: &Path, data: &Path, extra: &str, warm_up: Duration) -> Footprint {
    let keep = "ebpf:\n  relabel-configs:\n    - {source_labels: [__meta_process_cmdline], regex: '.*smolder-idle-.*', action: keep}\n";
    let (daemon, port) = start_agent(dir, data, &format!("{keep}{extra}"));
    let pid = daemon.id();
    sleep(warm_up);
    let mib = |file: &str, field: &str| proc_kib(pid, file, field) as f64 / 1024.0;
    let rss = mib("smaps_rollup", "Rss:");
    let anonymous = mib("smaps_rollup", "Anonymous:");
    let shmem = mib("smaps_rollup", "Pss_Shmem:");
    let footprint = Footprint {
        rss,
        peak: mib("status", "VmHWM:"),
        anonymous,
        file: rss - anonymous - shmem,
        walked: 0.0,
        samples: 0.0,
    };
    let metrics = scrape(port);
    terminate(daemon, libc::SIGTERM);
    Footprint {
        walked: metric(&metrics, "smolder_agent_python_processes "),
        samples: metric(
            &metrics,
            "smolder_agent_python_samples_total{stack=\"mixed\"}",
        ),
        ..footprint
    }
}

fn memory() {
    let rounds = rounds();
    let dir = bench_dir();
    let mut processes: Vec<Child> = (0..50)
        .map(|i| {
            let path = dir.join(format!("smolder-idle-{i}.py"));
            std::fs::write(&path, idle_script(i)).unwrap();
            Command::new(PYTHON)
                .arg(&path)
                .spawn()
                .expect("a workload process starts")
        })
        .collect();
    // One run first fills the disk cache of unwind tables; every measured run reads it, so that
    // neither condition builds tables the other reads.
    let data = dir.join("agent-data");
    footprint(&dir, &data, "", Duration::from_secs(25));
    let conditions = [
        ("python on ", ""),
        ("python off", "  python:\n    enabled: false\n"),
    ];
    let mut runs: Vec<Vec<Footprint>> = vec![Vec::new(); conditions.len()];
    for round in 0..rounds {
        // Alternating order, so that neither condition always runs first.
        for k in 0..conditions.len() {
            let c = (k + round) % conditions.len();
            let (label, extra) = conditions[c];
            let run = footprint(&dir, &data, extra, Duration::from_secs(25));
            eprintln!("round {round} {label}: {run:?}");
            runs[c].push(run);
        }
    }
    println!(
        "memory ({rounds} rounds, alternating; 50 python3.11 processes, each waking every 100 ms 15 frames deep; the agent keeps only them, tables from a warm disk cache, measured after 25 s; MiB, median [min, max])"
    );
    let spread = |runs: &[Footprint], field: fn(&Footprint) -> f64| {
        let mut values: Vec<f64> = runs.iter().map(field).collect();
        let (min, max) = (
            values.iter().copied().fold(f64::INFINITY, f64::min),
            values.iter().copied().fold(0.0, f64::max),
        );
        format!("{:.1} [{min:.1}, {max:.1}]", median(&mut values))
    };
    for ((label, _), runs) in conditions.iter().zip(&runs) {
        println!(
            "  {label}: RSS {}, anonymous {}, file {}, peak {}; Python processes walked {}, mixed samples {}",
            spread(runs, |f| f.rss),
            spread(runs, |f| f.anonymous),
            spread(runs, |f| f.file),
            spread(runs, |f| f.peak),
            spread(runs, |f| f.walked),
            spread(runs, |f| f.samples),
        );
    }
    for process in &mut processes {
        let _ = process.kill();
        let _ = process.wait();
    }
    std::fs::remove_dir_all(&dir).ok();
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let wants = |name: &str| {
        let named: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
        named.is_empty() || named.iter().any(|a| *a == name)
    };
    if wants("bpf_cost") {
        bpf_cost();
    }
    if wants("slowdown") {
        slowdown();
    }
    if wants("memory") {
        memory();
    }
}
