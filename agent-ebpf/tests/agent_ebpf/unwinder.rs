//! The BPF unwinder on this kernel (as root): the object passes the verifier (the off-CPU and
//! memory programs too); at a uprobe on
//! `burn` the walk gives exactly the victim's call path, leaf at the probed instruction;
//! cpu-clock samples of the same program reach `_start` or `clone3`, also from inside system
//! calls (with their kernel stacks) and PLT stubs; a uprobe in a signal handler sees through the signal frame; stacks
//! deeper than the limit come back truncated with the limit's frames; a walk that meets a zero
//! frame pointer where no table applies is not said to be complete.

use std::num::NonZeroU32;
use std::process::Command;
use std::time::{Duration, Instant};

use aya::programs::perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent};
use aya::programs::uprobe::UProbeScope;
use aya::programs::{BtfTracePoint, PerfEvent, RawTracePoint, UProbe};
use aya::{Btf, Ebpf, EbpfLoader};
use object::{Object as _, ObjectSymbol as _};
use regex::Regex;
use smolder_agent_ebpf::offcpu::{PROGRAM_FAULT, PROGRAM_SWITCH, TRACEPOINT_SWITCH};
use smolder_agent_ebpf::unwind::{DEFAULT_FRAMES, SampleHeader, SampleKind, Status};
use smolder_agent_ebpf::{
    GLOBAL_SELF_TGID, OBJECT, PROGRAM_CPU, PROGRAM_EXEC, PROGRAM_EXIT, PROGRAM_UPROBE,
};

use crate::util::{KillOnDrop, Process, Victim, read_samples};

const DEPTH: u32 = 5;

fn load() -> Ebpf {
    let self_tgid = std::process::id();
    EbpfLoader::new()
        .override_global(GLOBAL_SELF_TGID, &self_tgid, true)
        // The off-CPU task storage, which aya creates but has no type for.
        .allow_unsupported_maps()
        .load(OBJECT)
        .expect("load the unwinder object (as root)")
}

fn attach_uprobe(ebpf: &mut Ebpf, victim: &Victim, function: &str) {
    let program: &mut UProbe = ebpf
        .program_mut(PROGRAM_UPROBE)
        .unwrap()
        .try_into()
        .unwrap();
    program.load().expect("the verifier accepts on_uprobe");
    let pid = NonZeroU32::new(victim.pid).unwrap();
    program
        .attach(function, &victim.binary, UProbeScope::OneProcess(pid))
        .unwrap();
}

/// The call path of a sample at `burn`'s entry, root first.
fn burn_paths() -> (Regex, Regex) {
    let tail = r"( recurse){6} sort_it( libc)+ cmp burn$";
    (
        Regex::new(&format!("^_start __libc_start_main libc main{tail}")).unwrap(),
        Regex::new(&format!("^libc libc worker{tail}")).unwrap(),
    )
}

#[test]
fn unwinder_object_passes_the_verifier() {
    let mut ebpf = load();
    let cpu: &mut PerfEvent = ebpf.program_mut(PROGRAM_CPU).unwrap().try_into().unwrap();
    cpu.load().expect("the verifier accepts on_cpu");
    let uprobe: &mut UProbe = ebpf
        .program_mut(PROGRAM_UPROBE)
        .unwrap()
        .try_into()
        .unwrap();
    uprobe.load().expect("the verifier accepts on_uprobe");
    for name in [PROGRAM_EXEC, PROGRAM_EXIT] {
        let program: &mut RawTracePoint = ebpf.program_mut(name).unwrap().try_into().unwrap();
        program
            .load()
            .expect("the verifier accepts the process-event programs");
    }
}

#[test]
fn offcpu_and_memory_programs_pass_the_verifier() {
    let mut ebpf = load();
    let btf = Btf::from_sys_fs().expect("the kernel's BTF");
    let switch: &mut BtfTracePoint = ebpf
        .program_mut(PROGRAM_SWITCH)
        .unwrap()
        .try_into()
        .unwrap();
    switch
        .load(TRACEPOINT_SWITCH, &btf)
        .expect("the verifier accepts on_switch");
    let fault: &mut PerfEvent = ebpf.program_mut(PROGRAM_FAULT).unwrap().try_into().unwrap();
    fault.load().expect("the verifier accepts on_fault");
}

#[test]
fn uprobe_point_check_gives_the_known_call_path() {
    let mut ebpf = load();
    let mut victim = Victim::start(DEPTH, "plain");
    let process = Process::load(victim.pid, Some(&mut ebpf));
    attach_uprobe(&mut ebpf, &victim, "burn");
    victim.go();
    // burn runs every few microseconds, so 400 samples can all come from main before a busy
    // CI host has scheduled the thread: read on until both have been seen.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut samples: Vec<(SampleHeader, Vec<u64>)> = Vec::new();
    let on_main = |samples: &[(SampleHeader, Vec<u64>)]| {
        let main = samples.iter().filter(|(h, _)| h.tgid == h.tid).count();
        (main, samples.len() - main)
    };
    while Instant::now() < deadline
        && (samples.len() < 400 || matches!(on_main(&samples), (0, _) | (_, 0)))
    {
        samples.extend(read_samples(
            &mut ebpf,
            victim.pid,
            100,
            Duration::from_secs(1),
        ));
    }
    assert!(samples.len() >= 400, "{} samples", samples.len());

    let bytes = std::fs::read(&victim.binary).unwrap();
    let file = object::File::parse(&bytes[..]).unwrap();
    let burn = file
        .symbols()
        .find(|s| s.name() == Ok("burn"))
        .unwrap()
        .address();
    let (main_path, thread_path) = burn_paths();
    for (header, frames) in &samples {
        let path = process.path(frames);
        let status = Status::from_raw(header.status);
        assert_eq!(SampleKind::from_raw(header.kind), Some(SampleKind::Uprobe));
        assert!(
            status == Some(Status::Complete)
                && (main_path.is_match(&path) || thread_path.is_match(&path)),
            "{status:?} ({} frame-pointer frames): {path}",
            header.fp_frames
        );
        assert_eq!(header.fp_frames, 0, "every frame from a table: {path}");
        assert_eq!(process.token(frames[0]), "burn");
        assert_eq!(
            frames[0] % 4096,
            burn % 4096,
            "the leaf is the probed instruction"
        );
    }
    let (main, thread) = on_main(&samples);
    assert!(main > 0 && thread > 0, "main {main}, thread {thread}");
}

/// Samples the victim in `mode` with `on_cpu` at 499 Hz on every CPU until `want` of its
/// samples arrived.
fn cpu_samples(mode: &str, want: usize) -> (Process, Vec<(SampleHeader, Vec<u64>)>) {
    let mut ebpf = load();
    let mut victim = Victim::start(DEPTH, mode);
    let process = Process::load(victim.pid, Some(&mut ebpf));
    let program: &mut PerfEvent = ebpf.program_mut(PROGRAM_CPU).unwrap().try_into().unwrap();
    program.load().expect("the verifier accepts on_cpu");
    for cpu in aya::util::online_cpus().unwrap() {
        program
            .attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Frequency(499),
                false,
            )
            .unwrap();
    }
    victim.go();
    let samples = read_samples(&mut ebpf, victim.pid, want, Duration::from_secs(30));
    assert!(samples.len() >= want, "{} samples", samples.len());
    (process, samples)
}

/// Asserts that at least 99% of the samples (the issue's bar; in practice all) are complete
/// and follow `tail` below main's or the thread's root.
fn assert_whole(process: &Process, samples: &[(SampleHeader, Vec<u64>)], tail: &str) {
    let main_path = Regex::new(&format!("^_start __libc_start_main libc main{tail}")).unwrap();
    let thread_path = Regex::new(&format!("^libc libc worker{tail}")).unwrap();
    let mut bad = Vec::new();
    for (header, frames) in samples {
        let path = process.path(frames);
        let whole = header.status == Status::Complete as u16
            && (main_path.is_match(&path) || thread_path.is_match(&path));
        if !whole {
            bad.push(format!("{:?}: {path}", Status::from_raw(header.status)));
        }
    }
    assert!(
        bad.len() * 100 <= samples.len(),
        "{} of {}: {:#?}",
        bad.len(),
        samples.len(),
        &bad[..bad.len().min(10)]
    );
}

#[test]
fn cpu_samples_reach_the_root() {
    let (process, samples) = cpu_samples("plain", 600);
    // Anywhere in the loop: recursion, sort_it, libc's qsort, the comparator, burn.
    assert_whole(
        &process,
        &samples,
        r"( recurse){1,6}( sort_it( libc)*( cmp( burn)?)?)?$",
    );
}

#[test]
fn cpu_samples_in_system_calls_and_plt_stubs_reach_the_root() {
    let (process, samples) = cpu_samples("syscalls", 600);
    // getppid through its PLT stub: samples in the stub, in libc, and in the kernel, where the
    // user registers are those saved at the system call.
    let tail = r"( recurse){1,6}( sort_it( libc)*( cmp( burn)?)?| syscalls( libc)?| syscalls \?)?$";
    assert_whole(&process, &samples, tail);
    let in_kernel = samples.iter().filter(|(h, _)| h.kernel_len > 0).count();
    assert!(
        in_kernel * 10 >= samples.len(),
        "{in_kernel} of {} samples in the kernel",
        samples.len()
    );
}

/// `_start` zeroes `rbp` and calls `spin`, which keeps no frame pointer, in hand-written
/// assembly without call-frame information (so without a table).
const NO_CFI: &str = "
    .globl _start
_start:
    xor %ebp, %ebp
1:  call spin
    jmp 1b
spin:
    mov $200000, %ecx
2:  dec %ecx
    jnz 2b
    ret
";

/// A frame-pointer step that meets `rbp` 0 ends the chain, but that is the stack's root only
/// where every frame keeps a frame pointer: here the leaf `spin` keeps none, `rbp` is still
/// `_start`'s 0, and its caller `_start` is never reached. The walk says `FpEnd`, never
/// `Complete`.
#[test]
fn a_zero_frame_pointer_met_without_a_table_is_not_a_complete_stack() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("spin.S");
    let binary = dir.path().join("spin");
    std::fs::write(&source, NO_CFI).unwrap();
    let output = Command::new("gcc")
        .args(["-nostdlib", "-static", "-o"])
        .arg(&binary)
        .arg(&source)
        .output()
        .expect("run gcc (apt-get install gcc)");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Killed when the test ends, passed or not, so that a failure leaves no spinning process.
    let child = KillOnDrop(Command::new(&binary).spawn().unwrap());
    let mut ebpf = load();
    let program: &mut PerfEvent = ebpf.program_mut(PROGRAM_CPU).unwrap().try_into().unwrap();
    program.load().expect("the verifier accepts on_cpu");
    for cpu in aya::util::online_cpus().unwrap() {
        program
            .attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Frequency(499),
                false,
            )
            .unwrap();
    }
    let samples = read_samples(&mut ebpf, child.0.id(), 200, Duration::from_secs(30));
    drop(child);
    assert!(samples.len() >= 200, "{} samples", samples.len());
    for (header, frames) in &samples {
        assert_eq!(
            (Status::from_raw(header.status), frames.len()),
            (Some(Status::FpEnd), 1),
            "{frames:x?}"
        );
    }
}

#[test]
fn signal_frames_are_crossed() {
    let mut ebpf = load();
    let mut victim = Victim::start(DEPTH, "signal");
    let process = Process::load(victim.pid, Some(&mut ebpf));
    attach_uprobe(&mut ebpf, &victim, "handler_work");
    victim.go();
    let samples = read_samples(&mut ebpf, victim.pid, 100, Duration::from_secs(30));
    assert!(samples.len() >= 100, "{} samples", samples.len());
    // The interrupted code (anywhere in the loop), glibc's __restore_rt, the handler.
    let tail = r"( recurse){1,6}( sort_it( libc)*( cmp( burn)?)?)? libc on_alarm handler_work$";
    assert_whole(&process, &samples, tail);
}

#[test]
fn deep_stacks_are_truncated_with_the_limit_not_lost() {
    let mut ebpf = load();
    let mut victim = Victim::start(300, "plain");
    let process = Process::load(victim.pid, Some(&mut ebpf));
    attach_uprobe(&mut ebpf, &victim, "burn");
    victim.go();
    let samples = read_samples(&mut ebpf, victim.pid, 50, Duration::from_secs(30));
    assert!(samples.len() >= 50, "{} samples", samples.len());
    for (header, frames) in &samples {
        assert_eq!(Status::from_raw(header.status), Some(Status::Truncated));
        assert_eq!(usize::from(header.len), DEFAULT_FRAMES as usize);
        assert_eq!(frames.len(), DEFAULT_FRAMES as usize);
        // The leaf part is kept: burn, cmp, libc's sort, sort_it, then recursion.
        let path = process.path(frames);
        assert!(
            path.ends_with("sort_it libc libc cmp burn") || path.contains(" sort_it libc"),
            "{path}"
        );
        assert!(path.starts_with("recurse recurse"), "{path}");
    }
}
