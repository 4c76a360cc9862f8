//! Off-CPU and memory-growth profiles (issue 16), end to end: the real agent binary
//! (`smolder-agent record --format json`) as root, against `testdata/offcpu/workload.c` built
//! with gcc -O2 and no frame pointers, started before the agent and released once its tables
//! are loaded. Each workload measures its own truth in the same run (the time it blocked, the
//! bytes it touched, the huge pages the kernel gave it) and the profiles must agree with it.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use serde::Deserialize;
use smolder_test_support::prometheus::Metrics;

use crate::util::exclusive;

const WORKLOAD: &str = include_str!("testdata/offcpu/workload.c");

/// Builds the workload once per test, under `name`, into `dir`.
fn build(dir: &Path, name: &str) -> PathBuf {
    let source = dir.join("workload.c");
    std::fs::write(&source, WORKLOAD).unwrap();
    let exe = dir.join(name);
    let output = Command::new("gcc")
        .args(["-O2", "-fomit-frame-pointer", "-pthread", "-o"])
        .arg(&exe)
        .arg(&source)
        .output()
        .expect("gcc runs");
    assert!(
        output.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    exe
}

/// A workload started before the agent, waiting for its go; killed on drop.
struct Workload {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    pid: u32,
    service: String,
}

/// What a workload measured itself.
#[derive(Clone, Copy, Debug)]
struct Done {
    /// Wall-clock milliseconds when its measured part began and ended.
    start: u128,
    end: u128,
    /// Nanoseconds blocked, or bytes touched.
    measured: u64,
    /// `AnonHugePages` in kB after touching (memory modes).
    huge_kb: u64,
}

impl Workload {
    fn start(dir: &Path, name: &str, args: &[&str]) -> Workload {
        let exe = build(dir, name);
        let mut child = Command::new(&exe)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        Workload {
            pid: child.id(),
            stdin: child.stdin.take(),
            stdout: BufReader::new(child.stdout.take().unwrap()),
            child,
            service: name.to_owned(),
        }
    }

    fn go(&mut self) {
        writeln!(self.stdin.as_mut().unwrap(), "go").unwrap();
    }

    fn done(&mut self) -> Done {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let fields: Vec<u64> = line
            .strip_prefix("done ")
            .unwrap_or_else(|| panic!("{} printed {line:?}", self.service))
            .split_whitespace()
            .map(|f| f.parse().unwrap())
            .collect();
        Done {
            start: u128::from(fields[0]),
            end: u128::from(fields[1]),
            measured: fields[2],
            huge_kb: fields[3],
        }
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
    profiles: Vec<Profile>,
    ready: Vec<Ready>,
    metrics: String,
}

#[derive(Deserialize)]
struct Profile {
    series: String,
    from: u128,
    until: u128,
    stacks: Vec<(String, u64)>,
}

#[derive(Deserialize)]
struct Ready {
    pid: u32,
    at: u128,
}

impl Profile {
    /// (service, profile type) of `service.type{labels}`.
    fn name(&self) -> (&str, &str) {
        let app = self.series.split('{').next().unwrap();
        app.rsplit_once('.').unwrap()
    }

    fn sum(&self, under: &str) -> u64 {
        self.stacks
            .iter()
            .filter(|(stack, _)| stack.split(';').any(|frame| frame == under))
            .map(|(_, value)| value)
            .sum()
    }

    fn total(&self) -> u64 {
        self.stacks.iter().map(|(_, value)| value).sum()
    }
}

impl Recorded {
    /// The agent's metrics at the end of the recording.
    fn metrics(&self) -> Metrics {
        Metrics::parse(&self.metrics).expect("the recording's metrics parse")
    }

    fn of<'a>(
        &'a self,
        workload: &'a Workload,
        kind: &'a str,
    ) -> impl Iterator<Item = &'a Profile> {
        self.profiles
            .iter()
            .filter(move |p| p.name() == (workload.service.as_str(), kind))
    }

    /// The value of `kind` under the frame `under` over the whole recording.
    fn sum(&self, workload: &Workload, kind: &str, under: &str) -> u64 {
        self.of(workload, kind).map(|p| p.sum(under)).sum()
    }

    /// Asserts the workload's tables went in before its measured part began.
    fn assert_ready_before(&self, workload: &Workload, done: &Done) {
        let ready = self
            .ready
            .iter()
            .filter(|r| r.pid == workload.pid)
            .map(|r| r.at)
            .min()
            .unwrap_or_else(|| panic!("{}: its tables never went in", workload.service));
        assert!(
            ready <= done.start,
            "{}: tables in at {ready}, after its start at {}",
            workload.service,
            done.start
        );
    }

    /// Asserts that at least 90% of `kind`'s value in the windows wholly inside the measured
    /// part lies under `under`.
    fn assert_mostly_under(&self, workload: &Workload, done: &Done, kind: &str, under: &str) {
        let inside: Vec<&Profile> = self
            .of(workload, kind)
            .filter(|p| p.from >= done.start && p.until <= done.end)
            .collect();
        let (part, total): (u64, u64) = inside
            .iter()
            .map(|p| (p.sum(under), p.total()))
            .fold((0, 0), |(a, b), (c, d)| (a + c, b + d));
        assert!(
            !inside.is_empty() && part as f64 >= 0.9 * total as f64,
            "{}: {part} of {total} under {under} in {} windows",
            workload.service,
            inside.len()
        );
    }
}

fn within(value: u64, truth: u64, tolerance: f64) -> bool {
    (value as f64 - truth as f64).abs() <= tolerance * truth as f64
}

/// Runs the agent for `seconds` with `ebpf_extra` under `ebpf:`, keeping only the workloads
/// (named `smolder-oc-*`), in 1 s windows; releases the workloads `go_after` into it.
fn record(
    ebpf_extra: &str,
    seconds: u64,
    go_after: Duration,
    workloads: &mut [&mut Workload],
) -> Recorded {
    let data = tempfile::tempdir().unwrap();
    let config = data.path().join("agent.yaml");
    std::fs::write(
        &config,
        format!(
            "window:\n  length: 1s\nebpf:\n  relabel-configs:\n    - {{source_labels: [__meta_process_cmdline], regex: '.*smolder-oc-.*', action: keep}}\n{ebpf_extra}"
        ),
    )
    .unwrap();
    let agent = Command::new(env!("CARGO_BIN_EXE_smolder-agent"))
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(data.path())
        .args(["--log-level", "warn", "record", "--format", "json"])
        .args(["--duration", &format!("{seconds}s")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the agent runs");
    std::thread::sleep(go_after);
    for workload in workloads.iter_mut() {
        workload.go();
    }
    let output = agent.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "the agent failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("the recording is JSON")
}

/// At probability 1.0: a thread in `nanosleep` through libc, two threads on a mutex, and a
/// minute in one `epoll_wait`, in one recording.
#[test]
fn off_cpu_blocked_time_lock_sites_and_long_waits() {
    let _host = exclusive();
    let dir = tempfile::tempdir().unwrap();
    let mut sleeper = Workload::start(dir.path(), "smolder-oc-sleep", &["sleep", "600", "5"]);
    let mut mutex = Workload::start(dir.path(), "smolder-oc-mutex", &["mutex", "4"]);
    let mut epoll = Workload::start(dir.path(), "smolder-oc-epoll", &["epoll", "60"]);
    let recorded = record(
        "  off-cpu:\n    enabled: true\n    probability: 1.0\n    max-unwinds-per-second: 0\n",
        68,
        Duration::from_secs(5),
        &mut [&mut sleeper, &mut mutex, &mut epoll],
    );

    // nanosleep: >= 90% under nap, the total within 10% of what the program measured.
    let done = sleeper.done();
    recorded.assert_ready_before(&sleeper, &done);
    recorded.assert_mostly_under(&sleeper, &done, "off_cpu", "nap");
    let napped = recorded.sum(&sleeper, "off_cpu", "nap");
    assert!(
        within(napped, done.measured, 0.10),
        "nanosleep: {napped} ns profiled, {} ns measured",
        done.measured
    );
    assert!(
        recorded.of(&sleeper, "off_cpu").any(|p| p
            .stacks
            .iter()
            .any(|(s, _)| s.contains(";nap;nanosleep;") && s.contains("do_nanosleep"))),
        "no nap → nanosleep → do_nanosleep stack"
    );

    // The mutex: the waiting thread's stack shows the lock site, down to the futex.
    let done = mutex.done();
    recorded.assert_ready_before(&mutex, &done);
    let lock_waits: Vec<&(String, u64)> = recorded
        .of(&mutex, "off_cpu")
        .flat_map(|p| &p.stacks)
        .filter(|(s, _)| s.contains(";lock_site;") && s.contains("pthread_mutex_lock"))
        .collect();
    assert!(
        lock_waits.iter().any(|(s, _)| s.contains("futex")),
        "no lock_site → pthread_mutex_lock → futex stack: {lock_waits:#?}"
    );

    // A minute in epoll_wait: every window inside it gets its own second, no spike at wake-up.
    let done = epoll.done();
    recorded.assert_ready_before(&epoll, &done);
    let windows: Vec<(u128, u64)> = recorded
        .of(&epoll, "off_cpu")
        .filter(|p| p.from >= done.start && p.until <= done.end)
        .map(|p| (p.until - p.from, p.sum("wait_for_events")))
        .collect();
    assert!(
        windows.len() >= 50,
        "{} windows inside the wait",
        windows.len()
    );
    for (length_ms, value) in &windows {
        assert!(
            within(*value, (*length_ms * 1_000_000) as u64, 0.10),
            "a {length_ms} ms window got {value} ns of the wait: {windows:?}"
        );
    }
    let waited = recorded.sum(&epoll, "off_cpu", "wait_for_events");
    assert!(
        within(waited, done.measured, 0.10),
        "epoll_wait: {waited} ns profiled, {} ns measured",
        done.measured
    );

    // The probability in use is the configured one (no limit), and every nap was unwound.
    let metrics = recorded.metrics();
    assert_eq!(
        metrics.value("smolder_agent_ebpf_off_cpu_probability", &[]),
        1.0
    );
    let unwinds = metrics.value("smolder_agent_ebpf_off_cpu_unwinds_total", &[]);
    assert!(unwinds >= 600.0, "{unwinds} switch-outs unwound");
}

/// At probability 0.1, 2,000 blocks of 5 ms: the weighted total estimates the blocked time.
#[test]
fn off_cpu_estimate_at_a_tenth() {
    let _host = exclusive();
    let dir = tempfile::tempdir().unwrap();
    let mut sleeper = Workload::start(dir.path(), "smolder-oc-tenth", &["sleep", "2000", "5"]);
    let recorded = record(
        "  off-cpu:\n    enabled: true\n    probability: 0.1\n    max-unwinds-per-second: 0\n",
        18,
        Duration::from_secs(5),
        &mut [&mut sleeper],
    );
    let done = sleeper.done();
    assert!(
        done.end < done.start + 13_000,
        "the blocks outlasted the recording"
    );
    recorded.assert_ready_before(&sleeper, &done);
    let napped = recorded.sum(&sleeper, "off_cpu", "nap");
    assert!(
        within(napped, done.measured, 0.30),
        "nanosleep at 0.1: {napped} ns estimated, {} ns measured",
        done.measured
    );
    let metrics = recorded.metrics();
    assert_eq!(
        metrics.value("smolder_agent_ebpf_off_cpu_probability", &[]),
        0.1
    );
    // About one block in ten is unwound: the kernel's random choice, not every switch.
    let unwinds = metrics.value("smolder_agent_ebpf_off_cpu_unwinds_total", &[]);
    assert!(
        (100.0..=400.0).contains(&unwinds),
        "{unwinds} of 2,000 blocks unwound at 0.1"
    );
}

/// 200 MiB touched page by page, and 200 MiB of `MADV_HUGEPAGE` memory: each within 20% of
/// 200 MiB, as the README's account of huge pages says (a fault that maps a huge page counts
/// its 2 MiB), whether or not the kernel had huge pages to give.
#[test]
fn memory_growth_counts_touched_bytes_and_huge_pages() {
    let _host = exclusive();
    let dir = tempfile::tempdir().unwrap();
    let mut touch = Workload::start(dir.path(), "smolder-oc-touch", &["touch", "200"]);
    let mut huge = Workload::start(dir.path(), "smolder-oc-huge", &["huge", "200"]);
    // Every fault: the huge-page faults are 100, too few to estimate from one in 1,024.
    let recorded = record(
        "  memory:\n    enabled: true\n    period: 1\n",
        10,
        Duration::from_secs(5),
        &mut [&mut touch, &mut huge],
    );
    let mut huge_faults = 0;
    for (workload, function) in [(&mut touch, "touch_memory"), (&mut huge, "touch_huge")] {
        let done = workload.done();
        huge_faults += done.huge_kb / 2048;
        recorded.assert_ready_before(workload, &done);
        let grown = recorded.sum(workload, "memory_growth", function);
        let total: u64 = recorded
            .of(workload, "memory_growth")
            .map(Profile::total)
            .sum();
        assert!(
            within(grown, done.measured, 0.20),
            "{function}: {grown} bytes profiled, {} touched (AnonHugePages {} kB)",
            done.measured,
            done.huge_kb
        );
        assert!(
            grown as f64 >= 0.9 * total as f64,
            "{function}: {grown} of {total} bytes"
        );
    }
    // Only the workloads are profiled: the huge-page samples are the huge pages they got.
    let metrics = recorded.metrics();
    let huge_samples = metrics.value("smolder_agent_ebpf_memory_huge_samples_total", &[]) as u64;
    assert!(
        huge_samples.abs_diff(huge_faults) <= huge_faults / 10,
        "{huge_samples} huge-page samples, {huge_faults} huge pages mapped"
    );
    let samples = metrics.value("smolder_agent_ebpf_memory_samples_total", &[]);
    assert!(
        samples >= (200 << 20) as f64 / 4096.0,
        "{samples} fault samples for 200 MiB of base pages"
    );
}
