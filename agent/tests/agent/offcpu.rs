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
    /// Nanoseconds blocked, or the bytes its page faults mapped.
    measured: u64,
    /// The faults that mapped a transparent huge page (memory modes).
    huge_faults: u64,
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
            huge_faults: fields[3],
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
    let relabel = "  relabel-configs:\n    - {source_labels: [__meta_process_cmdline], regex: '.*smolder-oc-.*', action: keep}\n";
    record_host(
        &format!("{relabel}{ebpf_extra}"),
        seconds,
        go_after,
        workloads,
    )
    .0
}

/// Runs the agent for `seconds` with `ebpf` under `ebpf:`, in 1 s windows; releases the
/// workloads `go_after` into it. Returns the recording and the agent's process id.
fn record_host(
    ebpf: &str,
    seconds: u64,
    go_after: Duration,
    workloads: &mut [&mut Workload],
) -> (Recorded, u32) {
    let data = tempfile::tempdir().unwrap();
    let config = data.path().join("agent.yaml");
    std::fs::write(&config, format!("window:\n  length: 1s\nebpf:\n{ebpf}")).unwrap();
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
    let pid = agent.id();
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
    let recorded = serde_json::from_slice(&output.stdout).expect("the recording is JSON");
    (recorded, pid)
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

/// Runs the sleeping workload `name` with `args` under a recording of 18 s with `ebpf_extra`,
/// released 5 s in; checks that its blocks ended within the recording and after its tables
/// went in.
fn record_sleeper(
    dir: &Path,
    name: &str,
    args: &[&str],
    ebpf_extra: &str,
) -> (Workload, Recorded, Done) {
    let mut sleeper = Workload::start(dir, name, args);
    let recorded = record(ebpf_extra, 18, Duration::from_secs(5), &mut [&mut sleeper]);
    let done = sleeper.done();
    assert!(
        done.end < done.start + 13_000,
        "{name}: the blocks outlasted the recording"
    );
    recorded.assert_ready_before(&sleeper, &done);
    (sleeper, recorded, done)
}

/// Two threads spinning on one CPU, each waiting on the run queue while the other runs (and
/// while anything else on that CPU does): at probability 1.0 and no minimum duration, their
/// run-queue profile is the run delay the kernel's schedstat gave them over the same spin.
#[test]
fn run_queue_time_is_the_run_delay_of_threads_sharing_a_cpu() {
    let _host = exclusive();
    let dir = tempfile::tempdir().unwrap();
    let mut hogs = Workload::start(dir.path(), "smolder-oc-hog", &["hog", "6"]);
    let recorded = record(
        "  off-cpu:\n    enabled: true\n    probability: 1.0\n    min-duration: 0ns\n    max-unwinds-per-second: 0\n    run-queue: true\n",
        14,
        Duration::from_secs(5),
        &mut [&mut hogs],
    );
    let done = hogs.done();
    recorded.assert_ready_before(&hogs, &done);
    // Each thread waits about half the time at least: the other runs then.
    assert!(
        done.measured >= 4_000_000_000,
        "run delay {} ns over 2 × 6 s",
        done.measured
    );
    let waited = recorded.sum(&hogs, "run_queue", "hog");
    assert!(
        within(waited, done.measured, 0.10),
        "run queue: {waited} ns profiled under hog, {} ns of run delay",
        done.measured
    );
    recorded.assert_mostly_under(&hogs, &done, "run_queue", "hog");
}

/// Past `max-unwinds-per-second` the agent lowers the probability in use and exports it; the
/// samples, weighted by the probability each was taken with, still estimate the blocked time.
#[test]
fn the_unwind_limit_lowers_the_probability_and_keeps_the_estimate() {
    let _host = exclusive();
    let dir = tempfile::tempdir().unwrap();
    // About 480 blocks a second against a limit of 50 unwinds a second; after the measured
    // blocks, the same rate goes on (in `linger`) until the recording ends, so that the
    // probability in use at the end is the limited one.
    let (sleeper, recorded, done) = record_sleeper(
        dir.path(),
        "smolder-oc-limit",
        &["sleep", "4000", "2", "linger"],
        "  off-cpu:\n    enabled: true\n    probability: 1.0\n    max-unwinds-per-second: 50\n",
    );
    let metrics = recorded.metrics();
    let probability = metrics.value("smolder_agent_ebpf_off_cpu_probability", &[]);
    assert!(
        probability <= 0.3,
        "the probability in use is {probability} at the end"
    );
    let unwinds = metrics.value("smolder_agent_ebpf_off_cpu_unwinds_total", &[]);
    // Four thousand blocks; the limit's 50 a second over the recording, and the first second
    // or two at the configured probability before the limit bites.
    assert!(
        (100.0..=2000.0).contains(&unwinds),
        "{unwinds} switch-outs unwound of 4,000"
    );
    let napped = recorded.sum(&sleeper, "off_cpu", "nap");
    // Some hundreds of samples: within 25%.
    assert!(
        within(napped, done.measured, 0.25),
        "nanosleep under the limit: {napped} ns estimated, {} ns measured",
        done.measured
    );
}

/// With the whole host kept (no `keep` rule), a busy machine's off-CPU, run-queue and
/// memory-growth profiles never hold the agent itself, a kernel thread or the idle task, while
/// a workload of the test's is profiled.
#[test]
fn the_agent_kernel_threads_and_idle_are_never_profiled() {
    let _host = exclusive();
    let dir = tempfile::tempdir().unwrap();
    let mut sleeper = Workload::start(dir.path(), "smolder-oc-host", &["sleep", "500", "5"]);
    let relabel =
        "  relabel-configs:\n    - {source_labels: [__meta_process_pid], target_label: pid}\n";
    let (recorded, agent) = record_host(
        &format!(
            "{relabel}  off-cpu:\n    enabled: true\n    probability: 1.0\n    run-queue: true\n  memory:\n    enabled: true\n    period: 64\n"
        ),
        10,
        Duration::from_secs(3),
        &mut [&mut sleeper],
    );
    sleeper.done();
    // Whether or not its tables went in yet among the host's (so not necessarily under nap).
    assert!(
        recorded
            .of(&sleeper, "off_cpu")
            .map(Profile::total)
            .sum::<u64>()
            > 0,
        "the workload was not profiled"
    );
    let pid_of = |series: &str| -> u32 {
        let labels = series.split_once('{').unwrap().1;
        let value = labels
            .split(',')
            .find_map(|pair| pair.strip_prefix("pid="))
            .unwrap_or_else(|| panic!("no pid label: {series}"));
        value
            .trim_end_matches('}')
            .trim_matches('"')
            .parse()
            .unwrap()
    };
    let mut pids = std::collections::BTreeSet::new();
    for profile in &recorded.profiles {
        let (_, kind) = profile.name();
        if !["off_cpu", "run_queue", "memory_growth"].contains(&kind) || profile.total() == 0 {
            continue;
        }
        let pid = pid_of(&profile.series);
        assert_ne!(pid, 0, "the idle task in {}", profile.series);
        assert_ne!(pid, agent, "the agent itself in {}", profile.series);
        pids.insert(pid);
    }
    assert!(pids.contains(&sleeper.pid), "{pids:?}");
    // PF_KTHREAD in /proc/PID/stat's flags (the ninth field), for those still alive.
    for pid in pids {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let after_comm = stat.rsplit_once(") ").unwrap().1;
        let flags: u64 = after_comm.split(' ').nth(6).unwrap().parse().unwrap();
        assert_eq!(
            flags & 0x0020_0000,
            0,
            "kernel thread {pid} profiled: {stat}"
        );
    }
}

/// At probability 0.1, 2,000 blocks of 5 ms: the weighted total estimates the blocked time.
#[test]
fn off_cpu_estimate_at_a_tenth() {
    let _host = exclusive();
    let dir = tempfile::tempdir().unwrap();
    let (sleeper, recorded, done) = record_sleeper(
        dir.path(),
        "smolder-oc-tenth",
        &["sleep", "2000", "5"],
        "  off-cpu:\n    enabled: true\n    probability: 0.1\n    max-unwinds-per-second: 0\n",
    );
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

/// 200 MiB touched page by page, 200 MiB of `MADV_HUGEPAGE` memory (huge pages where the kernel
/// has them to give), and 200 MiB of `MADV_HUGEPAGE` memory whose faults fall back to base
/// pages, every fault sampled: each profile is the bytes the process's own faults mapped
/// (a huge page's 2 MiB for the faults that mapped one, 4 KiB for every other), as the README's
/// account of huge pages says, and the huge-page samples are the process's huge-page faults.
#[test]
fn memory_growth_counts_touched_bytes_and_huge_pages() {
    let _host = exclusive();
    let dir = tempfile::tempdir().unwrap();
    // One after another (each waits its turn after the go), so that the ring buffer holds
    // every fault's sample.
    let mut touch = Workload::start(dir.path(), "smolder-oc-touch", &["touch", "200", "0"]);
    let mut huge = Workload::start(dir.path(), "smolder-oc-huge", &["huge", "200", "3000"]);
    let mut fallback = Workload::start(
        dir.path(),
        "smolder-oc-fallback",
        &["fallback", "200", "6000"],
    );
    // Every fault: the huge-page faults are 100, too few to estimate from one in 1,024.
    let recorded = record(
        "  memory:\n    enabled: true\n    period: 1\n",
        16,
        Duration::from_secs(5),
        &mut [&mut touch, &mut huge, &mut fallback],
    );
    let metrics = recorded.metrics();
    let lost = metrics.value(
        "smolder_agent_dropped_samples_total",
        &[("stage", "ebpf"), ("reason", "ring_buffer_full")],
    );
    assert_eq!(lost, 0.0, "samples lost to a full ring buffer");
    let mut huge_faults = 0;
    for (workload, function) in [
        (&mut touch, "touch_memory"),
        (&mut huge, "touch_huge"),
        (&mut fallback, "touch_huge"),
    ] {
        let done = workload.done();
        huge_faults += done.huge_faults;
        recorded.assert_ready_before(workload, &done);
        // Its faults mapped most of what it touched: khugepaged may collapse a few of the
        // fallback's blocks (they allow huge pages) before their pages fault.
        assert!(
            (150 << 20..=201 << 20).contains(&done.measured),
            "{}: its faults mapped {} bytes",
            workload.service,
            done.measured
        );
        let grown = recorded.sum(workload, "memory_growth", function);
        let total: u64 = recorded
            .of(workload, "memory_growth")
            .map(Profile::total)
            .sum();
        // Every fault is sampled: only the few faults outside the touch loop differ.
        assert!(
            within(total, done.measured, 0.02),
            "{}: {total} bytes profiled, its faults mapped {} ({} of them huge-page faults)",
            workload.service,
            done.measured,
            done.huge_faults
        );
        assert!(
            grown as f64 >= 0.9 * total as f64,
            "{}: {grown} of {total} bytes under {function}",
            workload.service
        );
    }
    // Only the workloads are profiled: the huge-page samples are exactly their huge-page
    // faults (none when the kernel had no huge page to give).
    let huge_samples = metrics.value("smolder_agent_ebpf_memory_huge_samples_total", &[]) as u64;
    assert_eq!(
        huge_samples, huge_faults,
        "huge-page samples against the workloads' huge-page faults"
    );
}

/// At the default period, one fault in 1,024 per CPU: 1 GiB of base pages is about 256 samples
/// of 4 MiB, and their total estimates the bytes within what that many samples allow.
#[test]
fn memory_growth_estimate_at_the_default_period() {
    let _host = exclusive();
    let dir = tempfile::tempdir().unwrap();
    let mut touch = Workload::start(dir.path(), "smolder-oc-touch-1g", &["touch", "1024", "0"]);
    let recorded = record(
        "  memory:\n    enabled: true\n",
        12,
        Duration::from_secs(5),
        &mut [&mut touch],
    );
    let done = touch.done();
    recorded.assert_ready_before(&touch, &done);
    let period = 1024;
    let expected = done.measured as f64 / 4096.0 / f64::from(period);
    assert!(expected >= 200.0, "{expected} samples expected");
    let total: u64 = recorded
        .of(&touch, "memory_growth")
        .map(Profile::total)
        .sum();
    let samples = total as f64 / (4096.0 * f64::from(period));
    // One fault in `period` is sampled on each CPU, whichever process takes it: the workload's
    // share is at worst binomial, sd sqrt(expected); four of them.
    let tolerance = 4.0 / expected.sqrt();
    assert!(
        within(total, done.measured, tolerance),
        "{total} bytes estimated from {samples} samples, {} touched (tolerance {tolerance:.2})",
        done.measured
    );
    assert!(
        recorded.sum(&touch, "memory_growth", "touch_memory") as f64 >= 0.9 * total as f64,
        "the samples are not under touch_memory"
    );
}
