//! The eBPF source end to end: the real sampler loaded as root, the real symbolizer, and
//! workloads each test builds with gcc and starts. The tests run one at a time with those of
//! `unwind` (they all sample every CPU) and assert on presence and ratios, never on timing.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::Duration;

use smolder_agent::config::Config;
use smolder_agent::ebpf;
use smolder_agent::relabel::RelabelConfig;
use smolder_common::Profile;
use smolder_test_support::prometheus::Metrics;

use crate::util::exclusive;

/// Shared by every workload: `now()`, and a start gate on stdin so that a test can place the
/// process (in a cgroup, say) before it runs.
const PRELUDE: &str = r#"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
volatile unsigned long sink;
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
static double start_gate(int argc, char **argv) {
    getchar();
    return now() + (argc > 1 ? atof(argv[1]) : 5.0);
}
"#;

/// `main` calls `slow_function`, which spins four times as long as `fast_function`.
const RATIO: &str = r#"
__attribute__((noinline)) void slow_function(void) {
    for (unsigned long i = 0; i < 4000000UL; i++) sink += i;
}
__attribute__((noinline)) void fast_function(void) {
    for (unsigned long i = 0; i < 1000000UL; i++) sink += i;
}
int main(int argc, char **argv) {
    double end = start_gate(argc, argv);
    /* Four processes, for more samples per second on a shared machine. */
    fork();
    fork();
    srand(getpid());
    while (now() < end) {
        slow_function();
        fast_function();
        /* A random pause in main itself, so that the loop's period cannot lock in phase with
           the sampling period and bias which function the samples land in. */
        for (unsigned long i = rand() % 500000UL; i > 0; i--) sink += i;
    }
    return 0;
}
"#;

/// Spends its time in write(2) to /dev/null.
const SYSCALLS: &str = r#"
int main(int argc, char **argv) {
    double end = start_gate(argc, argv);
    int fd = open("/dev/null", O_WRONLY);
    char byte = 0;
    while (now() < end)
        for (int i = 0; i < 1000; i++) sink += write(fd, &byte, 1);
    return 0;
}
"#;

/// Spins in `short_lived_function` for its duration, then exits.
const SHORT_LIVED: &str = r#"
__attribute__((noinline)) void short_lived_function(double end) {
    while (now() < end)
        for (unsigned long i = 0; i < 100000UL; i++) sink += i;
}
int main(int argc, char **argv) {
    double end = start_gate(argc, argv);
    short_lived_function(end);
    return 0;
}
"#;

/// Spins in `busy_function`.
pub(crate) const BUSY: &str = r#"
__attribute__((noinline)) void busy_function(double end) {
    while (now() < end)
        for (unsigned long i = 0; i < 100000UL; i++) sink += i;
}
int main(int argc, char **argv) {
    double end = start_gate(argc, argv);
    busy_function(end);
    return 0;
}
"#;

/// Builds C `source` with frame pointers into `dir/name`.
pub(crate) fn build(dir: &Path, name: &str, source: &str) -> PathBuf {
    build_with("gcc", "c", dir, name, source)
}

/// Builds `source` with `compiler` and frame pointers into `dir/name`.
fn build_with(compiler: &str, extension: &str, dir: &Path, name: &str, source: &str) -> PathBuf {
    let c = dir.join(format!("{name}.{extension}"));
    std::fs::write(&c, format!("{PRELUDE}{source}")).unwrap();
    let exe = dir.join(name);
    let status = Command::new(compiler)
        .args(["-O0", "-fno-omit-frame-pointer", "-o"])
        .arg(&exe)
        .arg(&c)
        .status()
        .expect("gcc runs");
    assert!(status.success(), "gcc failed for {name}");
    exe
}

/// Starts `exe`, waiting at its start gate, to run `seconds` once released.
pub(crate) fn spawn(exe: &Path, seconds: f64) -> Child {
    Command::new(exe)
        .arg(seconds.to_string())
        .stdin(Stdio::piped())
        .spawn()
        .expect("the workload starts")
}

/// Lets a workload past its start gate.
pub(crate) fn release(child: &mut Child) {
    let mut stdin = child.stdin.take().expect("stdin is piped");
    stdin.write_all(b"\n").unwrap();
}

/// Records for `seconds` with `config`, running `during` once the sampler is loaded.
fn record_during(config: Config, seconds: u64, during: impl FnOnce()) -> Vec<Profile> {
    let recording = thread::spawn(move || {
        ebpf::record(&config, Duration::from_secs(seconds), None)
            .unwrap()
            .profiles
    });
    // Loading and attaching takes tens of milliseconds; leave room on a busy machine.
    thread::sleep(Duration::from_millis(1500));
    during();
    recording.join().expect("record does not panic")
}

/// Every stack of the series whose service is `service`, as folded lines.
fn stacks(profiles: &[Profile], service: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for profile in profiles.iter().filter(|p| p.series.service() == service) {
        profile.tree.for_each_stack(|stack, value| {
            let names: Vec<&str> = stack
                .iter()
                .map(|&id| profile.tree.frames().name(id))
                .collect();
            out.push((names.join(";"), value));
        });
    }
    out
}

/// The default config, profiling only the processes whose executable's path matches `regex`: a
/// drain then symbolizes only them, however busy the host is with other processes.
fn only(regex: &str) -> Config {
    let mut config = Config::default();
    config.ebpf.relabel_configs = serde_norway::from_str::<Vec<RelabelConfig>>(&format!(
        "- {{source_labels: [__meta_process_exe], regex: '{regex}', action: keep}}"
    ))
    .unwrap();
    config
}

fn samples_with(stacks: &[(String, u64)], path: &str) -> u64 {
    stacks
        .iter()
        .filter(|(stack, _)| stack.contains(path))
        .map(|(_, value)| value)
        .sum()
}

fn services(profiles: &[Profile]) -> Vec<String> {
    profiles.iter().map(|p| p.series.to_string()).collect()
}

#[test]
fn frame_pointer_stacks_keep_the_ratio_of_callees() {
    let _host = exclusive();
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "smolder-ratio", RATIO);
    let mut child = Command::new(&exe)
        .arg("120")
        .stdin(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("the workload starts");
    release(&mut child);
    // Sampling error shrinks with the sample count: record until the two paths hold enough
    // samples (1200 put the bounds 3 and 5 about three standard errors from the expected 4),
    // however long a busy machine takes to give them.
    // Only the workload is profiled (a keep rule), so each recording symbolizes little.
    let mut config = Config::default();
    config.ebpf.relabel_configs = serde_norway::from_str::<Vec<RelabelConfig>>(
        "- {source_labels: [__meta_process_exe], regex: '.*/smolder-ratio', action: keep}",
    )
    .unwrap();
    let (mut slow, mut fast) = (0, 0);
    let mut last = Vec::new();
    for _ in 0..20 {
        last = ebpf::record(&config, Duration::from_secs(3), None)
            .unwrap()
            .profiles;
        let stacks = stacks(&last, "smolder-ratio");
        slow += samples_with(&stacks, "main;slow_function");
        fast += samples_with(&stacks, "main;fast_function");
        if slow + fast >= 1200 {
            break;
        }
    }
    // The workload's four processes share a process group.
    Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .status()
        .unwrap();
    child.wait().unwrap();
    assert!(
        fast >= 100,
        "too few samples to judge: slow {slow}, fast {fast}"
    );
    let ratio = slow as f64 / fast as f64;
    assert!(
        (3.0..=5.0).contains(&ratio),
        "slow/fast = {slow}/{fast} = {ratio:.2}"
    );
    let profile = last
        .iter()
        .find(|p| p.series.service() == "smolder-ratio")
        .unwrap();
    assert_eq!(profile.meta.spy_name, "ebpfspy");
    assert_eq!(profile.meta.sample_rate, 99);
    assert_eq!(profile.meta.units, "samples");
    assert_eq!(
        profile.series.labels().get("service_name"),
        Some("smolder-ratio")
    );
    assert!(profile.series.labels().get("hostname").is_some());
}

#[test]
fn kernel_stacks_appear_below_user_frames_for_syscalls() {
    let _host = exclusive();
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "smolder-syscalls", SYSCALLS);
    let mut child = spawn(&exe, 3.0);
    let profiles = record_during(only(".*/smolder-syscalls"), 5, || release(&mut child));
    child.wait().unwrap();
    let stacks = stacks(&profiles, "smolder-syscalls");
    let in_kernel = samples_with(&stacks, "do_syscall_64");
    assert!(in_kernel > 0, "no kernel frames: {stacks:?}");
    // User frames first (root), kernel frames below them.
    let syscall = stacks
        .iter()
        .find(|(stack, _)| stack.contains("do_syscall_64"))
        .unwrap();
    let frames: Vec<&str> = syscall.0.split(';').collect();
    let kernel_at = frames.iter().position(|f| *f == "do_syscall_64").unwrap();
    assert!(kernel_at > 0, "no user frame above the kernel: {syscall:?}");
    assert!(
        frames.iter().all(|f| !f.starts_with("0x")),
        "bare address in {syscall:?}"
    );
}

#[test]
fn exited_processes_are_still_symbolized() {
    let _host = exclusive();
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "smolder-short", SHORT_LIVED);
    let mut child = spawn(&exe, 1.5);
    let profiles = record_during(only(".*/smolder-short( \\(deleted\\))?"), 5, || {
        release(&mut child);
        // Gone from disk as well as from the process table before the drain.
        thread::sleep(Duration::from_millis(500));
        std::fs::remove_file(&exe).unwrap();
        assert!(child.wait().unwrap().success());
    });
    let stacks = stacks(&profiles, "smolder-short");
    let named = samples_with(&stacks, "main;short_lived_function");
    assert!(named > 0, "the exited process is unsymbolized: {stacks:?}");
}

#[test]
fn the_agents_own_process_is_never_sampled() {
    let _host = exclusive();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spinning = std::sync::Arc::clone(&stop);
    // Burns CPU inside the agent's (this test binary's) process.
    let spinner = thread::spawn(move || {
        let mut x = 0u64;
        while !spinning.load(std::sync::atomic::Ordering::Relaxed) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
    });
    // And in another process, so that an idle host (CI) still has something to sample.
    let dir = tempfile::tempdir().unwrap();
    let busy = build(dir.path(), "smolder-beside", BUSY);
    let mut child = spawn(&busy, 1.0);
    let profiles = record_during(Config::default(), 3, || release(&mut child));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    spinner.join().unwrap();
    assert!(child.wait().unwrap().success());
    let me = std::env::current_exe().unwrap();
    let me = me.file_name().unwrap().to_str().unwrap();
    let beside = samples_with(&stacks(&profiles, "smolder-beside"), "busy_function");
    assert!(
        beside > 0,
        "the workload beside the agent was not sampled: {:?}",
        services(&profiles)
    );
    for profile in &profiles {
        assert_ne!(profile.series.service(), me, "{}", profile.series);
    }
}

#[test]
fn relabel_rules_drop_and_rename_processes() {
    let _host = exclusive();
    let dir = tempfile::tempdir().unwrap();
    let keep = build(dir.path(), "smolder-keep", BUSY);
    let drop = build(dir.path(), "smolder-drop", BUSY);
    let mut config = Config::default();
    config.ebpf.relabel_configs = serde_norway::from_str::<Vec<RelabelConfig>>(
        r#"
- source_labels: [__meta_process_exe]
  regex: ".*/smolder-drop"
  action: drop
- source_labels: [__meta_process_exe]
  regex: ".*/smolder-(keep)"
  target_label: service_name
  replacement: renamed-$1
- source_labels: [__meta_process_comm]
  target_label: comm
"#,
    )
    .unwrap();
    let mut kept = spawn(&keep, 2.0);
    let mut dropped = spawn(&drop, 2.0);
    let profiles = record_during(config, 4, || {
        release(&mut kept);
        release(&mut dropped);
    });
    kept.wait().unwrap();
    dropped.wait().unwrap();
    let renamed = profiles
        .iter()
        .find(|p| p.series.app() == "renamed-keep.cpu")
        .unwrap_or_else(|| panic!("no renamed series in {:?}", services(&profiles)));
    assert_eq!(
        renamed.series.labels().get("service_name"),
        Some("renamed-keep")
    );
    assert_eq!(renamed.series.labels().get("comm"), Some("smolder-keep"));
    assert!(samples_with(&stacks(&profiles, "renamed-keep"), "busy_function") > 0);
    assert!(
        stacks(&profiles, "smolder-keep").is_empty(),
        "the old name is still used"
    );
    assert!(
        profiles
            .iter()
            .all(|p| p.series.service() != "smolder-drop"),
        "a dropped process was profiled: {:?}",
        services(&profiles)
    );
}

/// A systemd-style unit in the cgroup v1 `name=systemd` hierarchy, removed on drop.
struct Unit {
    dir: PathBuf,
}

impl Unit {
    fn create(name: &str) -> Unit {
        let dir = Path::new("/sys/fs/cgroup/systemd/system.slice").join(name);
        std::fs::create_dir_all(&dir).expect("creating a cgroup in the systemd hierarchy");
        Unit { dir }
    }

    fn adopt(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).unwrap();
    }
}

impl Drop for Unit {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[test]
fn service_name_comes_from_the_systemd_unit_else_the_executable() {
    let _host = exclusive();
    let dir = tempfile::tempdir().unwrap();
    let in_unit = build(dir.path(), "smolder-in-unit", BUSY);
    let plain = build(dir.path(), "smolder-plain", BUSY);
    let unit_name = format!("smolder-test-{}", std::process::id());
    let unit = Unit::create(&format!("{unit_name}.service"));
    let mut served = spawn(&in_unit, 2.0);
    let mut bare = spawn(&plain, 2.0);
    unit.adopt(served.id());
    let profiles = record_during(only(".*/smolder-(in-unit|plain)"), 4, || {
        release(&mut served);
        release(&mut bare);
    });
    served.wait().unwrap();
    bare.wait().unwrap();
    drop(unit);
    let from_unit = profiles
        .iter()
        .find(|p| p.series.service() == unit_name)
        .unwrap_or_else(|| panic!("no series for {unit_name} in {:?}", services(&profiles)));
    assert_eq!(
        from_unit.series.labels().get("systemd_unit"),
        Some(format!("{unit_name}.service").as_str())
    );
    assert!(samples_with(&stacks(&profiles, &unit_name), "busy_function") > 0);
    assert!(stacks(&profiles, "smolder-in-unit").is_empty());
    assert!(
        samples_with(&stacks(&profiles, "smolder-plain"), "busy_function") > 0,
        "{:?}",
        services(&profiles)
    );
}

/// Metric `name` in `text`, all its samples summed; a missing metric fails the test.
fn metric(text: &str, name: &str) -> f64 {
    Metrics::parse(text)
        .expect("Prometheus text")
        .value(name, &[])
}

#[test]
fn the_daemon_drains_the_sampler_every_window() {
    let _host = exclusive();
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "smolder-daemon", BUSY);
    let mut config = crate::util::isolated(Config::default());
    config.window.length = Duration::from_secs(1);
    config.window.settle = Duration::from_secs(1);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut child = spawn(&exe, 4.0);
    let text = runtime.block_on(async {
        let agent = smolder_agent::app::start(config).await.unwrap();
        release(&mut child);
        let url = format!("http://{}/metrics", agent.addr());
        // The first drain symbolizes every binary on the host, which takes a while on a busy
        // machine; wait for two drains however long they take.
        let mut text = String::new();
        for _ in 0..120 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            text = reqwest::get(&url).await.unwrap().text().await.unwrap();
            if metric(&text, "smolder_agent_ebpf_drains_total") >= 2.0
                && metric(&text, "smolder_agent_window_profiles_submitted_total") > 0.0
            {
                break;
            }
        }
        agent.stop().await.unwrap();
        text
    });
    child.wait().unwrap();
    assert!(
        metric(&text, "smolder_agent_ebpf_drains_total") >= 2.0,
        "{text}"
    );
    assert!(metric(&text, "smolder_agent_ebpf_samples_total") > 0.0);
    assert!(metric(&text, "smolder_agent_window_profiles_submitted_total") > 0.0);
    assert!(metric(&text, "smolder_agent_symbolize_captures_total") > 0.0);
}

#[test]
fn loading_without_cap_bpf_names_the_missing_capabilities() {
    // setpriv (util-linux) starts the agent with CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN gone
    // from its bounding set, so even root lacks them.
    let output = Command::new("setpriv")
        .args(["--bounding-set", "-bpf,-perfmon,-sys_admin", "--"])
        .arg(env!("CARGO_BIN_EXE_smolder-agent"))
        .args(["record", "--duration", "1s"])
        .output()
        .expect("setpriv runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("CAP_BPF") && stderr.contains("CAP_PERFMON"),
        "{stderr}"
    );
}

/// Runs machine code it wrote into anonymous memory and names it in `/tmp/perf-PID.map`, as a
/// JIT (the JVM with `-XX:+DumpPerfMapAtExit`, node with `--perf-basic-prof`) does.
const JIT: &str = r#"
#include <string.h>
#include <sys/mman.h>
int main(int argc, char **argv) {
    /* mov rcx, 0x1000000; 1: dec rcx; jnz 1b; ret */
    static const unsigned char code[] = {0x48, 0xc7, 0xc1, 0x00, 0x00, 0x00, 0x01,
                                         0x48, 0xff, 0xc9, 0x75, 0xfb, 0xc3};
    void *mem = mmap(0, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memcpy(mem, code, sizeof code);
    char path[64];
    snprintf(path, sizeof path, "/tmp/perf-%d.map", getpid());
    FILE *map = fopen(path, "w");
    fprintf(map, "%lx %zx jitted_spin\n", (unsigned long)mem, sizeof code);
    fclose(map);
    double end = start_gate(argc, argv);
    void (*spin)(void) = (void (*)(void))mem;
    while (now() < end) spin();
    return 0;
}
"#;

#[test]
fn jit_frames_are_named_from_the_perf_map() {
    let _host = exclusive();
    let dir = tempfile::tempdir().unwrap();
    let exe = build(dir.path(), "smolder-jit", JIT);
    // Perf maps are read from the live process, so it outlives the recording.
    let mut child = spawn(&exe, 6.0);
    let profiles = record_during(only(".*/smolder-jit"), 3, || release(&mut child));
    child.wait().unwrap();
    std::fs::remove_file(format!("/tmp/perf-{}.map", child.id())).unwrap();
    let stacks = stacks(&profiles, "smolder-jit");
    assert!(
        samples_with(&stacks, "jitted_spin") > 0,
        "no JIT frame named: {stacks:?}"
    );
}

/// A C++ method in a namespace: its symbol is mangled (`_ZN7smolder6Worker4spinEd`).
const CPP: &str = r#"
namespace smolder {
struct Worker {
    void spin(double end);
};
__attribute__((noinline)) void Worker::spin(double end) {
    while (now() < end)
        for (unsigned long i = 0; i < 100000UL; i++) sink += i;
}
}
int main(int argc, char **argv) {
    double end = start_gate(argc, argv);
    smolder::Worker worker;
    worker.spin(end);
    return 0;
}
"#;

#[test]
fn cpp_frames_are_demangled() {
    let _host = exclusive();
    let dir = tempfile::tempdir().unwrap();
    let exe = build_with("g++", "cpp", dir.path(), "smolder-cpp", CPP);
    let mut child = spawn(&exe, 2.0);
    let profiles = record_during(only(".*/smolder-cpp"), 3, || release(&mut child));
    child.wait().unwrap();
    let stacks = stacks(&profiles, "smolder-cpp");
    assert!(
        samples_with(&stacks, "main;smolder::Worker::spin(double)") > 0,
        "{stacks:?}"
    );
}
