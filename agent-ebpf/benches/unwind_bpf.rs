//! BPF run time of the unwinder per sample, by stack depth, from the kernel's own accounting
//! (`kernel.bpf_stats_enabled`: run time and run count of the program). Run as root; needs gcc.
//!
//! The walk runs in `on_uprobe` at `burn` of `tests/data/victim.c` (`gcc -O2
//! -fomit-frame-pointer`), so every sample is the victim's and its depth is exact: recursion 5
//! gives ~19 frames, recursion 112 ~126. The same-run baseline is the same probe without tables
//! (frame-pointer fallback, which stops after a frame or two): the fixed cost of a sample (the
//! probe's context, header, ring-buffer output). `on_cpu` adds only `bpf_get_stack` and the
//! register fetch to the same walk.
//!
//! `cargo bench -p smolder-agent-ebpf --bench unwind_bpf`

#[path = "../tests/agent_ebpf/util.rs"]
#[allow(
    dead_code,
    reason = "the tests' fixtures, of which the bench uses a part"
)]
mod util;

use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use aya::EbpfLoader;
use aya::maps::RingBuf;
use aya::programs::UProbe;
use aya::programs::uprobe::UProbeScope;
use aya::sys::{Stats, enable_stats};
use smolder_agent_ebpf::unwind::{MAP_SAMPLES, Status, parse_sample};
use smolder_agent_ebpf::{OBJECT, PROGRAM_UPROBE};

use util::{Process, Victim};

const MEASURE: Duration = Duration::from_secs(3);

/// Runs one scenario; returns (ns per sample, frames per sample, samples, share complete).
fn scenario(depth: u32, tables: bool) -> (f64, f64, u64, f64) {
    let mut ebpf = EbpfLoader::new()
        // The off-CPU task storage, which aya creates but has no type for.
        .allow_unsupported_maps()
        .load(OBJECT)
        .expect("load the unwinder (as root)");
    let mut victim = Victim::start(depth, "plain");
    Process::load(victim.pid, tables.then_some(&mut ebpf));
    let program: &mut UProbe = ebpf
        .program_mut(PROGRAM_UPROBE)
        .unwrap()
        .try_into()
        .unwrap();
    program.load().unwrap();
    let pid = NonZeroU32::new(victim.pid).unwrap();
    program
        .attach("burn", &victim.binary, UProbeScope::OneProcess(pid))
        .unwrap();
    victim.go();
    let _stats = enable_stats(Stats::RunTime).expect("enable BPF run-time stats");
    let before = program.info().unwrap();
    let (mut samples, mut frames, mut complete) = (0u64, 0u64, 0u64);
    let mut ring = RingBuf::try_from(ebpf.map_mut(MAP_SAMPLES).unwrap()).unwrap();
    let end = Instant::now() + MEASURE;
    while Instant::now() < end {
        while let Some(item) = ring.next() {
            let header = parse_sample(&item).expect("a whole sample").header;
            samples += 1;
            frames += u64::from(header.len);
            complete += u64::from(header.status == Status::Complete as u16);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let program: &mut UProbe = ebpf
        .program_mut(PROGRAM_UPROBE)
        .unwrap()
        .try_into()
        .unwrap();
    let after = program.info().unwrap();
    let runs = after.run_count() - before.run_count();
    let time = after.run_time() - before.run_time();
    drop(victim);
    (
        time.as_nanos() as f64 / runs.max(1) as f64,
        frames as f64 / samples.max(1) as f64,
        runs,
        complete as f64 / samples.max(1) as f64,
    )
}

fn main() {
    if std::env::args().any(|arg| arg == "--list") {
        return;
    }
    println!("scenario                      ns/sample  frames/sample  runs      complete");
    for (name, depth, tables) in [
        ("no tables (baseline)", 5, false),
        ("tables, recursion 5", 5, true),
        ("tables, recursion 112", 112, true),
    ] {
        let (ns, frames, runs, complete) = scenario(depth, tables);
        println!(
            "{name:<29} {ns:>9.0}  {frames:>13.1}  {runs:>8}  {:>7.1}%",
            complete * 100.0
        );
    }
}
