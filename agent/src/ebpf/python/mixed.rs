//! Mixed stacks: a thread's native frames with each frame of the interpreter loop
//! (`_PyEval_EvalFrameDefault`) replaced by the Python frames that call of the loop was running.
//!
//! Input: the native stack as the unwinder gives it (leaf first: the leaf's own address, then
//! return addresses), the Python stack as the walk gives it (leaf first, entry frames marked),
//! and where the interpreter loop is mapped. Output: one stack, leaf first, in which C
//! extensions, the interpreter and Python code appear in the order they called each other.
//! Pure: no memory, maps or clock.
//!
//! Each C-level call of the interpreter loop runs a run of Python frames that ends (outwards) at
//! an entry frame; Python-to-Python calls stay inside one call of the loop. So, from the leaf,
//! the n-th loop frame of the native stack ran the n-th group of Python frames. The two must
//! agree in number; when they do not (a native stack cut short, a loop frame the unwinder
//! missed), the merge refuses rather than guess.

use smolder_agent_ebpf::PythonFrame;

/// One frame of a mixed stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MixedFrame {
    /// A native frame, by its address as the unwinder gave it.
    Native(u64),
    /// A Python frame.
    Python(PythonFrame),
}

/// Why two stacks could not be merged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MixError {
    /// The native stack's interpreter-loop frames and the Python stack's groups differ in
    /// number.
    #[error(
        "the native stack holds {loops} interpreter-loop frames for {groups} groups of Python frames"
    )]
    Mismatch {
        /// Interpreter-loop frames in the native stack.
        loops: usize,
        /// Groups of Python frames, each ending at an entry frame.
        groups: usize,
    },
}

/// The Python frames of `python` (leaf first) in groups, one per C-level call of the
/// interpreter loop: each group ends at an entry frame (a last group without one, from a stack
/// cut short, counts too).
pub fn groups(python: &[PythonFrame]) -> Vec<&[PythonFrame]> {
    let mut groups = Vec::new();
    let mut start = 0;
    for (i, frame) in python.iter().enumerate() {
        if frame.is_entry() {
            groups.push(&python[start..=i]);
            start = i + 1;
        }
    }
    if start < python.len() {
        groups.push(&python[start..]);
    }
    groups
}

/// Merges `native` and `python` (both leaf first) into one stack, leaf first: every native frame
/// inside `eval_loop` (`[start, end)` of `_PyEval_EvalFrameDefault`) is replaced by its group of
/// Python frames.
///
/// # Errors
///
/// [`MixError::Mismatch`] when the native stack's loop frames and the Python groups differ in
/// number.
pub fn mix(
    native: &[u64],
    python: &[PythonFrame],
    eval_loop: (u64, u64),
) -> Result<Vec<MixedFrame>, MixError> {
    let groups = groups(python);
    // A caller's frame holds a return address, which may be the first byte after the call
    // (even past the function's end): look one byte before it.
    let in_loop = |depth: usize, addr: u64| {
        let pc = if depth == 0 {
            addr
        } else {
            addr.saturating_sub(1)
        };
        (eval_loop.0..eval_loop.1).contains(&pc)
    };
    let loops = native
        .iter()
        .enumerate()
        .filter(|&(depth, &addr)| in_loop(depth, addr))
        .count();
    if loops != groups.len() {
        return Err(MixError::Mismatch {
            loops,
            groups: groups.len(),
        });
    }
    let mut groups = groups.into_iter();
    let mut mixed = Vec::with_capacity(native.len() + python.len());
    for (depth, &addr) in native.iter().enumerate() {
        match in_loop(depth, addr).then(|| groups.next()).flatten() {
            Some(group) => mixed.extend(group.iter().copied().map(MixedFrame::Python)),
            None => mixed.push(MixedFrame::Native(addr)),
        }
    }
    Ok(mixed)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use smolder_agent_ebpf::PYTHON_ENTRY;

    use super::*;

    const LOOP: (u64, u64) = (0x1000, 0x2000);

    fn py(code: u64, entry: bool) -> PythonFrame {
        PythonFrame {
            code: code | if entry { PYTHON_ENTRY } else { 0 },
            instr: 0,
        }
    }

    #[test]
    fn each_loop_frame_takes_the_python_frames_it_ran() {
        // sorted(key=key) from sort_items from <module>: leaf first, the key function's own
        // loop call, sorted's C frames, then the outer loop call running sort_items and
        // <module>, then main.
        let native = [0x1100, 0x5000, 0x5100, 0x1200, 0x9000];
        let python = [py(0x10, true), py(0x20, false), py(0x30, true)];
        let mixed = mix(&native, &python, LOOP).unwrap();
        assert_eq!(
            mixed,
            [
                MixedFrame::Python(python[0]),
                MixedFrame::Native(0x5000),
                MixedFrame::Native(0x5100),
                MixedFrame::Python(python[1]),
                MixedFrame::Python(python[2]),
                MixedFrame::Native(0x9000),
            ]
        );
    }

    #[test]
    fn return_addresses_are_looked_up_one_byte_before() {
        // The outer loop call's return address is the loop's end: the call was its last
        // instruction.
        let native = [0x5000, 0x2000, 0x9000];
        let python = [py(0x10, true)];
        assert_eq!(
            mix(&native, &python, LOOP).unwrap(),
            [
                MixedFrame::Native(0x5000),
                MixedFrame::Python(python[0]),
                MixedFrame::Native(0x9000)
            ]
        );
        // The leaf's address is exact.
        assert!(mix(&[0x2000, 0x9000], &python, LOOP).is_err());
    }

    #[test]
    fn stacks_that_disagree_are_refused() {
        let python = [py(0x10, true), py(0x20, true)];
        assert_eq!(
            mix(&[0x1100, 0x9000], &python, LOOP),
            Err(MixError::Mismatch {
                loops: 1,
                groups: 2
            })
        );
        assert_eq!(groups(&[py(1 << 4, false)]).len(), 1);
        assert!(groups(&[]).is_empty());
    }

    proptest! {
        #[test]
        fn mixing_keeps_both_stacks_in_order(
            layout in proptest::collection::vec((0usize..4, 1usize..4), 0..6),
            leaf_in_loop: bool,
        ) {
            // Per loop call: the native frames above it, and its Python group's length.
            let mut native = Vec::new();
            let mut python = Vec::new();
            let mut next = 0x10u64;
            for (group, &(natives, frames)) in layout.iter().enumerate() {
                if !(group == 0 && leaf_in_loop) {
                    native.extend((0..natives).map(|i| 0x5000 + 0x10 * (group * 8 + i) as u64));
                }
                native.push(0x1100 + group as u64);
                for i in 0..frames {
                    python.push(py(next, i + 1 == frames));
                    next += 0x10;
                }
            }
            native.push(0x9000);
            let mixed = mix(&native, &python, LOOP).unwrap();
            let pythons: Vec<PythonFrame> = mixed
                .iter()
                .filter_map(|f| match f { MixedFrame::Python(p) => Some(*p), _ => None })
                .collect();
            let natives: Vec<u64> = mixed
                .iter()
                .filter_map(|f| match f { MixedFrame::Native(a) => Some(*a), _ => None })
                .collect();
            prop_assert_eq!(pythons, python);
            let kept: Vec<u64> = native
                .iter()
                .enumerate()
                .filter(|&(depth, &a)| {
                    let pc = if depth == 0 { a } else { a - 1 };
                    !(LOOP.0..LOOP.1).contains(&pc)
                })
                .map(|(_, &a)| a)
                .collect();
            prop_assert_eq!(natives, kept);
        }
    }
}
