//! The Rust workload of the agent's whole-stack tests (agent/tests/agent/unwind.rs), built with
//! `rustc -C opt-level=3` (a release build: no frame pointers): recursion, then `sort_by` forever
//! with a comparator that spins.

use std::hint::black_box;

#[inline(never)]
fn slow_cmp(a: &u64, b: &u64) -> std::cmp::Ordering {
    let mut x = a ^ b;
    for _ in 0..300 {
        x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407));
    }
    black_box(x);
    a.cmp(b)
}

#[inline(never)]
fn sort_forever() -> ! {
    loop {
        let mut values: Vec<u64> = (0..4096u64).map(|i| (i * 7919) % 4096).collect();
        values.sort_by(slow_cmp);
        black_box(&values);
    }
}

#[inline(never)]
fn recurse(depth: u32) {
    if depth == 0 {
        sort_forever();
    }
    recurse(black_box(depth - 1));
    black_box(depth);
}

fn main() {
    recurse(black_box(4));
}
