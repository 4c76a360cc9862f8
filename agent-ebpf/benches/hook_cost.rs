//! What the off-CPU and memory-growth hooks cost the work they watch, against the floor of any
//! such hook on this kernel (issue 16's goals: ≤ 2 % of a same-CPU ping-pong at probability
//! 0.01, ≤ 1 % of a page-fault-heavy workload at the default period). As root:
//!
//! ```sh
//! cargo bench -p smolder-agent-ebpf --bench hook_cost [-- switch|fault]
//! ```
//!
//! `SMOLDER_BENCH_ROUNDS` (default 40) rounds; in each, every condition runs the workload once,
//! in an order that rotates from round to round, pinned to CPU 1:
//! - `switch`: `perf bench sched pipe -T -l 50000` (two context switches per round trip, about
//!   a quarter of a second), under
//!   - `none`: nothing attached to `sched_switch`;
//!   - `empty`: a program that returns at once (`hook_floor.bpf.c`), the kernel's dispatch to
//!     any switch hook: the floor;
//!   - `on_switch`: the agent's program with threshold 1 (a probability of 2⁻³²), its
//!     unsampled path, which every switch takes but the sampled ones;
//! - `fault`: this binary touching 2 × 256 MiB of fresh memory page by page (131,072 minor
//!   faults with base pages, where transparent huge pages are `madvise` or `never`), under
//!   - `none`;
//!   - `count`: `perf stat -a -e minor-faults`, the kernel counting the event, no sampling;
//!   - `empty`: the empty program on the page-faults-min event of every CPU, one sample every
//!     1,024 faults: the floor of any page-fault sampler;
//!   - `on_fault`: the agent's program the same way, for a process it does not profile (so it
//!     returns after its lookup in `profiled`; the whole agent is in
//!     `agent/benches/offcpu/bench.sh`).
//!
//! Printed: each condition's median (µs per round trip, or ms), and the median and quartiles
//! over rounds of its ratio to `none` in the same round (runs close in time, so that this VM's
//! drift cancels); then each program's run time per invocation with
//! `kernel.bpf_stats_enabled` over one more run (the stats add two clock reads to it).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aya::maps::Array;
use aya::programs::perf_event::{
    PerfEventConfig, PerfEventLinkId, PerfEventScope, SamplePolicy, SoftwareEvent,
};
use aya::programs::{BtfTracePoint, PerfEvent, ProgramInfo};
use aya::{Btf, Ebpf, EbpfLoader};
use smolder_agent_ebpf::offcpu::{MAP_CONFIG, PROGRAM_FAULT, PROGRAM_SWITCH, TRACEPOINT_SWITCH};
use smolder_agent_ebpf::{GLOBAL_SELF_TGID, OBJECT};

/// The empty programs, built by `build.rs`.
static FLOOR: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/hook_floor.bpf.o"));
const SWITCH_FLOOR: &str = "switch_floor";
const FAULT_FLOOR: &str = "fault_floor";
/// The agent's default `ebpf.memory.period`.
const FAULT_PERIOD: u64 = 1024;
/// Set in the environment of this binary when it runs as the fault workload.
const FAULT_CHILD: &str = "SMOLDER_BENCH_FAULT_CHILD";
const FAULT_BYTES: usize = 256 << 20;
const PAGE: usize = 4096;

/// Enables `kernel.bpf_stats_enabled` until dropped, also when the bench panics.
struct Stats;

impl Stats {
    const PATH: &str = "/proc/sys/kernel/bpf_stats_enabled";

    fn enable() -> Stats {
        std::fs::write(Self::PATH, "1").expect("enabling kernel.bpf_stats_enabled");
        Stats
    }
}

impl Drop for Stats {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::PATH, "0");
    }
}

fn rounds() -> usize {
    std::env::var("SMOLDER_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40usize)
        .max(1)
}

/// The fault workload's body: touches fresh memory page by page, twice, and prints the
/// milliseconds it took.
fn touch_fresh_memory() {
    let start = Instant::now();
    for _ in 0..2 {
        // Large enough that the allocator maps it fresh and unmaps it when dropped.
        let mut memory = vec![0u8; FAULT_BYTES];
        for page in memory.iter_mut().step_by(PAGE) {
            *page = 1;
        }
        std::hint::black_box(&memory);
    }
    println!("{}", start.elapsed().as_secs_f64() * 1e3);
}

/// Runs `command` pinned to CPU 1 and reads the figure `pick` finds in its output.
fn pinned(command: &str, args: &[&str], env: Option<&str>, pick: fn(&str) -> Option<f64>) -> f64 {
    let mut taskset = Command::new("taskset");
    taskset.args(["-c", "1", command]).args(args);
    if let Some(name) = env {
        taskset.env(name, "1");
    }
    let output = taskset
        .output()
        .unwrap_or_else(|err| panic!("running {command}: {err}"));
    let text = String::from_utf8_lossy(&output.stdout);
    pick(&text).unwrap_or_else(|| panic!("no figure in {command}'s output: {text}"))
}

/// µs per round trip of one pinned ping-pong between two threads.
fn ping_pong() -> f64 {
    let args = ["bench", "sched", "pipe", "-T", "-l", "50000"];
    pinned("perf", &args, None, |text| {
        text.lines()
            .find(|line| line.contains("usecs/op"))
            .and_then(|line| line.split_whitespace().next())
            .and_then(|figure| figure.parse().ok())
    })
}

/// Milliseconds of one pinned run of the fault workload.
fn faults() -> f64 {
    let exe = std::env::current_exe().expect("this bench's path");
    let exe = exe.to_str().expect("a UTF-8 path");
    pinned(exe, &[], Some(FAULT_CHILD), |text| text.trim().parse().ok())
}

fn tracepoint<'a>(ebpf: &'a mut Ebpf, name: &str) -> &'a mut BtfTracePoint {
    ebpf.program_mut(name)
        .unwrap_or_else(|| panic!("no program {name}"))
        .try_into()
        .expect("a tp_btf program")
}

fn perf_event<'a>(ebpf: &'a mut Ebpf, name: &str) -> &'a mut PerfEvent {
    ebpf.program_mut(name)
        .unwrap_or_else(|| panic!("no program {name}"))
        .try_into()
        .expect("a perf_event program")
}

/// Runs `workload` with `program` attached to `sched_switch`, or with nothing when `None`.
fn under_switch(program: Option<&mut BtfTracePoint>, workload: fn() -> f64) -> f64 {
    let Some(program) = program else {
        return workload();
    };
    let link = program.attach().expect("attaching to sched_switch");
    let figure = workload();
    program.detach(link).expect("detaching");
    figure
}

/// Runs `workload` with `program` on every CPU's page-faults-min event, one sample every
/// [`FAULT_PERIOD`] faults.
fn under_fault(program: &mut PerfEvent, workload: fn() -> f64) -> f64 {
    let cpus = aya::util::online_cpus().expect("the online CPUs");
    let links: Vec<PerfEventLinkId> = cpus
        .iter()
        .map(|&cpu| {
            program
                .attach(
                    PerfEventConfig::Software(SoftwareEvent::PageFaultsMin),
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Period(FAULT_PERIOD),
                    false,
                )
                .expect("attaching to page-faults-min")
        })
        .collect();
    let figure = workload();
    for link in links {
        program.detach(link).expect("detaching");
    }
    figure
}

/// Runs `workload` while `perf stat` counts minor faults on every CPU.
fn under_count(workload: fn() -> f64) -> f64 {
    let mut count: Child = Command::new("perf")
        .args(["stat", "-a", "-e", "minor-faults", "-o", "/dev/null"])
        .stdout(Stdio::null())
        .spawn()
        .expect("running perf stat");
    // Time for perf stat to open its counters.
    std::thread::sleep(Duration::from_millis(300));
    let figure = workload();
    let _ = count.kill();
    let _ = count.wait();
    figure
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn sorted(mut values: Vec<f64>) -> Vec<f64> {
    values.sort_by(f64::total_cmp);
    values
}

/// Runs every condition once per round in rotating order and prints the table.
fn compare(what: &str, unit: &str, names: &[&str], mut run: impl FnMut(usize) -> f64) {
    let rounds = rounds();
    let mut figures: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    for round in 0..rounds {
        for i in 0..names.len() {
            let condition = (i + round) % names.len();
            figures[condition].push(run(condition));
        }
    }
    println!("{what}: {rounds} rounds, pinned to CPU 1; ratio to none in the same round");
    println!("condition   {unit:>9} median   ratio median (q1–q3)");
    for (condition, name) in names.iter().enumerate() {
        let ratios = sorted(
            figures[condition]
                .iter()
                .zip(&figures[0])
                .map(|(figure, none)| figure / none)
                .collect(),
        );
        println!(
            "{name:<10}  {:>16.3}   {:.4} ({:.4}–{:.4})",
            quantile(&sorted(figures[condition].clone()), 0.5),
            quantile(&ratios, 0.5),
            quantile(&ratios, 0.25),
            quantile(&ratios, 0.75),
        );
    }
}

/// Prints a program's run time per invocation between two readings of its info.
fn per_invocation(name: &str, before: &ProgramInfo, after: &ProgramInfo) {
    let count = after.run_count().saturating_sub(before.run_count()).max(1);
    let time = after.run_time().saturating_sub(before.run_time());
    println!(
        "{name}: {:.1} ns per invocation over {count} runs (with the stats' clock reads)",
        time.as_nanos() as f64 / count as f64
    );
}

fn main() {
    if std::env::var_os(FAULT_CHILD).is_some() {
        touch_fresh_memory();
        return;
    }
    // `cargo bench` passes `--bench`; a further argument picks one part.
    let filter = std::env::args().skip(1).find(|arg| !arg.starts_with("--"));
    let part = |name: &str| filter.as_deref().is_none_or(|f| name.contains(f));
    let btf = Btf::from_sys_fs().expect("the kernel's BTF");
    let mut floor = EbpfLoader::new()
        .load(FLOOR)
        .expect("loading the empty programs (as root)");
    let self_tgid = std::process::id();
    let mut agent = EbpfLoader::new()
        .override_global(GLOBAL_SELF_TGID, &self_tgid, true)
        // The off-CPU task storage, which aya creates but has no type for.
        .allow_unsupported_maps()
        .load(OBJECT)
        .expect("loading the unwinder object (as root)");

    if part("switch") {
        let mut config: Array<_, [u32; 2]> =
            Array::try_from(agent.map_mut(MAP_CONFIG).expect("the off-CPU config map"))
                .expect("an array");
        config.set(0, [1, 0], 0).expect("setting the threshold");
        tracepoint(&mut floor, SWITCH_FLOOR)
            .load(TRACEPOINT_SWITCH, &btf)
            .expect("the verifier accepts the empty program");
        tracepoint(&mut agent, PROGRAM_SWITCH)
            .load(TRACEPOINT_SWITCH, &btf)
            .expect("the verifier accepts on_switch");
        compare(
            "switch",
            "µs/trip",
            &["none", "empty", "on_switch"],
            |condition| match condition {
                0 => under_switch(None, ping_pong),
                1 => under_switch(Some(tracepoint(&mut floor, SWITCH_FLOOR)), ping_pong),
                _ => under_switch(Some(tracepoint(&mut agent, PROGRAM_SWITCH)), ping_pong),
            },
        );
        let _stats = Stats::enable();
        for (ebpf, name) in [(&mut floor, SWITCH_FLOOR), (&mut agent, PROGRAM_SWITCH)] {
            let program = tracepoint(ebpf, name);
            let before = program.info().expect("the program's info");
            under_switch(Some(&mut *program), ping_pong);
            let after = program.info().expect("the program's info");
            per_invocation(name, &before, &after);
        }
    }

    if part("fault") {
        perf_event(&mut floor, FAULT_FLOOR)
            .load()
            .expect("the verifier accepts the empty program");
        perf_event(&mut agent, PROGRAM_FAULT)
            .load()
            .expect("the verifier accepts on_fault");
        compare(
            "fault",
            "ms",
            &["none", "count", "empty", "on_fault"],
            |condition| match condition {
                0 => faults(),
                1 => under_count(faults),
                2 => under_fault(perf_event(&mut floor, FAULT_FLOOR), faults),
                _ => under_fault(perf_event(&mut agent, PROGRAM_FAULT), faults),
            },
        );
        let _stats = Stats::enable();
        for (ebpf, name) in [(&mut floor, FAULT_FLOOR), (&mut agent, PROGRAM_FAULT)] {
            let program = perf_event(ebpf, name);
            let before = program.info().expect("the program's info");
            under_fault(&mut *program, faults);
            let after = program.info().expect("the program's info");
            per_invocation(name, &before, &after);
        }
    }
}
