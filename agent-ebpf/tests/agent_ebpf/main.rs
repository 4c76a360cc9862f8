//! Tests of `smolder-agent-ebpf`, as root on the running kernel: the objects pass the verifier,
//! the contract agrees with `smolder-unwind`, and the BPF unwinder walks real stacks.

/// The numbers of `unwind.h` are `smolder-unwind`'s.
mod contract;
/// The unwinder: it loads; a uprobe point check and cpu-clock samples give the known call
/// paths of a `gcc -O2` program; deep stacks are truncated, not lost.
mod unwinder;
/// Fixtures: the victim program, table loading, sample reading.
mod util;
