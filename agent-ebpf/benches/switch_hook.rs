//! What a `sched_switch` hook costs a context switch, against the floor of any such hook
//! (issue 16's off-CPU goal: ≤ 2 % of a same-CPU ping-pong at probability 0.01). As root:
//!
//! ```sh
//! cargo bench -p smolder-agent-ebpf --bench switch_hook
//! ```
//!
//! `SMOLDER_BENCH_ROUNDS` (default 40) rounds; in each, every condition runs one
//! `taskset -c 1 perf bench sched pipe -T -l $SMOLDER_BENCH_LOOPS` (default 50,000 round trips,
//! two context switches each, about a quarter of a second), in an order that rotates from round
//! to round:
//! - `none`: nothing attached to `sched_switch`;
//! - `empty`: a program that returns at once (`switch_floor.bpf.c`), the kernel's dispatch to
//!   any switch hook: the floor;
//! - `on_switch`: the agent's program with threshold 1 (a probability of 2⁻³²), its unsampled
//!   path, which every switch takes but the sampled ones.
//!
//! Printed: each condition's median µs per round trip; the median and quartiles over rounds of
//! its ratio to `none` in the same round (runs close in time, so that this VM's drift cancels);
//! and each program's run time per invocation with `kernel.bpf_stats_enabled`, over one more
//! run (the stats add two clock reads to it). The sampled path, and the agent's whole cost at
//! the default probability, are in `agent/benches/offcpu/bench.sh`.

use std::process::Command;

use aya::maps::Array;
use aya::programs::BtfTracePoint;
use aya::{Btf, Ebpf, EbpfLoader};
use smolder_agent_ebpf::offcpu::{MAP_CONFIG, PROGRAM_SWITCH, TRACEPOINT_SWITCH};
use smolder_agent_ebpf::{GLOBAL_SELF_TGID, OBJECT};

/// The empty program, built by `build.rs`.
static FLOOR: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/switch_floor.bpf.o"));
const PROGRAM_FLOOR: &str = "switch_floor";

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

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// µs per round trip of one pinned ping-pong between two threads.
fn ping_pong(loops: usize) -> f64 {
    let output = Command::new("taskset")
        .args(["-c", "1", "perf", "bench", "sched", "pipe", "-T", "-l"])
        .arg(loops.to_string())
        .output()
        .expect("running `perf bench` (apt-get install linux-perf)");
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines()
        .find(|line| line.contains("usecs/op"))
        .and_then(|line| line.split_whitespace().next())
        .and_then(|figure| figure.parse().ok())
        .unwrap_or_else(|| panic!("no usecs/op in perf bench's output: {text}"))
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> &'a mut BtfTracePoint {
    ebpf.program_mut(name)
        .unwrap_or_else(|| panic!("no program {name}"))
        .try_into()
        .expect("a tp_btf program")
}

/// Runs one ping-pong with `program` attached, or with nothing when `None`.
fn run(program: Option<&mut BtfTracePoint>, loops: usize) -> f64 {
    match program {
        None => ping_pong(loops),
        Some(program) => {
            let link = program.attach().expect("attaching to sched_switch");
            let figure = ping_pong(loops);
            program.detach(link).expect("detaching");
            figure
        }
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn sorted(mut values: Vec<f64>) -> Vec<f64> {
    values.sort_by(f64::total_cmp);
    values
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not supported.
    let rounds = env_or("SMOLDER_BENCH_ROUNDS", 40).max(1);
    let loops = env_or("SMOLDER_BENCH_LOOPS", 50_000).max(1);
    let btf = Btf::from_sys_fs().expect("the kernel's BTF");
    let mut floor = EbpfLoader::new()
        .load(FLOOR)
        .expect("loading the empty program (as root)");
    program(&mut floor, PROGRAM_FLOOR)
        .load(TRACEPOINT_SWITCH, &btf)
        .expect("the verifier accepts the empty program");
    let self_tgid = std::process::id();
    let mut agent = EbpfLoader::new()
        .override_global(GLOBAL_SELF_TGID, &self_tgid, true)
        // The off-CPU task storage, which aya creates but has no type for.
        .allow_unsupported_maps()
        .load(OBJECT)
        .expect("loading the unwinder object (as root)");
    let mut config: Array<_, [u32; 2]> =
        Array::try_from(agent.map_mut(MAP_CONFIG).expect("the off-CPU config map"))
            .expect("an array");
    config.set(0, [1, 0], 0).expect("setting the threshold");
    program(&mut agent, PROGRAM_SWITCH)
        .load(TRACEPOINT_SWITCH, &btf)
        .expect("the verifier accepts on_switch");

    let names = ["none", "empty", "on_switch"];
    let mut figures: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    for round in 0..rounds {
        for i in 0..names.len() {
            let condition = (i + round) % names.len();
            let figure = match condition {
                0 => run(None, loops),
                1 => run(Some(program(&mut floor, PROGRAM_FLOOR)), loops),
                _ => run(Some(program(&mut agent, PROGRAM_SWITCH)), loops),
            };
            figures[condition].push(figure);
        }
    }

    println!(
        "{rounds} rounds of {loops} round trips, pinned to CPU 1; ratio to none in the same round"
    );
    println!("condition   µs median   ratio median (q1–q3)");
    for (condition, name) in names.iter().enumerate() {
        let ratios = sorted(
            figures[condition]
                .iter()
                .zip(&figures[0])
                .map(|(figure, none)| figure / none)
                .collect(),
        );
        println!(
            "{name:<10}  {:>9.3}   {:.4} ({:.4}–{:.4})",
            quantile(&sorted(figures[condition].clone()), 0.5),
            quantile(&ratios, 0.5),
            quantile(&ratios, 0.25),
            quantile(&ratios, 0.75),
        );
    }

    let _stats = Stats::enable();
    for (ebpf, name) in [(&mut floor, PROGRAM_FLOOR), (&mut agent, PROGRAM_SWITCH)] {
        let program = program(ebpf, name);
        let before = program.info().expect("the program's info");
        run(Some(&mut *program), loops);
        let after = program.info().expect("the program's info");
        let count = after.run_count().saturating_sub(before.run_count()).max(1);
        let time = after.run_time().saturating_sub(before.run_time());
        println!(
            "{name}: {:.1} ns per invocation over {count} switches (with the stats' clock reads)",
            time.as_nanos() as f64 / count as f64
        );
    }
}
