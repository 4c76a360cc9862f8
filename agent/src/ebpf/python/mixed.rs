//! Mixed stacks: a thread's native frames with each frame of the interpreter loop
//! (`_PyEval_EvalFrameDefault`) replaced by the Python frames that call of the loop was running.
//!
//! Input: the native stack as the unwinder gives it (leaf first: the leaf's own address, then
//! return addresses), the Python stack as the kernel walk gives it (leaf first, entry frames
//! marked), and where the interpreter loop is mapped. Output: where each group of Python frames
//! goes ([`Placement`]), so that C extensions, the interpreter and Python code appear in the
//! order they called each other. Pure: no memory, maps or clock.
//!
//! Each C-level call of the interpreter loop runs a run of Python frames that ends (outwards) at
//! an entry frame; Python-to-Python calls stay inside one call of the loop. So, from the leaf,
//! the n-th loop frame of the native stack ran the n-th group of Python frames. The two must
//! agree in number, except where one stack is cut short: a native walk that stopped early leaves
//! the outer groups for above its root-most frame, a Python walk cut at its frame limit leaves
//! the outer loop frames native. Otherwise (a loop frame the unwinder missed, a sample taken
//! while the interpreter was between frames) the merge refuses rather than guess.

use std::ops::Range;

use smolder_agent_ebpf::PythonFrame;

/// Why two stacks could not be merged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MixError {
    /// The native stack's interpreter-loop frames and the Python stack's groups differ in
    /// number, and neither stack was cut short in the way that explains it.
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

/// Python frames standing for one native frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The native frame's depth (0: the leaf); the native stack's length for the frames that go
    /// above its root-most frame.
    pub depth: usize,
    /// The Python frames, as a range of the Python stack (innermost first).
    pub frames: Range<usize>,
}

/// How far each walk got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Walks {
    /// The native walk reached the stack's end.
    pub native_complete: bool,
    /// The Python walk reached the first frame (not cut at its frame limit).
    pub python_complete: bool,
}

/// The Python frames of `python` (leaf first) in groups, one per C-level call of the
/// interpreter loop: each group ends at an entry frame (a last group without one, from a stack
/// cut short, counts too).
pub fn groups(python: &[PythonFrame]) -> Vec<Range<usize>> {
    let mut groups = Vec::new();
    let mut start = 0;
    for (i, frame) in python.iter().enumerate() {
        if frame.is_entry() {
            groups.push(start..i + 1);
            start = i + 1;
        }
    }
    if start < python.len() {
        groups.push(start..python.len());
    }
    groups
}

/// Where the Python frames of `python` go in `native` (both leaf first): every native frame
/// inside `eval_loop` (`[start, end)` of `_PyEval_EvalFrameDefault`) is replaced by its group of
/// Python frames, in order from the leaf.
///
/// # Errors
///
/// [`MixError::Mismatch`] when the native stack's loop frames and the Python groups differ in
/// number, unless `walks` says which stack was cut short in the way that explains it.
pub fn place(
    native: &[u64],
    python: &[PythonFrame],
    eval_loop: (u64, u64),
    walks: Walks,
) -> Result<Vec<Placement>, MixError> {
    let groups = groups(python);
    // A caller's frame holds a return address, which may be the first byte after the call
    // (even past the function's end): look one byte before it.
    let loops: Vec<usize> = native
        .iter()
        .enumerate()
        .filter(|&(depth, &addr)| {
            let pc = if depth == 0 {
                addr
            } else {
                addr.saturating_sub(1)
            };
            (eval_loop.0..eval_loop.1).contains(&pc)
        })
        .map(|(depth, _)| depth)
        .collect();
    let explained = loops.len() == groups.len()
        || (loops.len() < groups.len() && !walks.native_complete)
        || (loops.len() > groups.len() && !walks.python_complete);
    if !explained {
        return Err(MixError::Mismatch {
            loops: loops.len(),
            groups: groups.len(),
        });
    }
    let mut placements: Vec<Placement> = loops
        .iter()
        .zip(&groups)
        .map(|(&depth, group)| Placement {
            depth,
            frames: group.clone(),
        })
        .collect();
    if let Some(first) = groups.get(loops.len()) {
        placements.push(Placement {
            depth: native.len(),
            frames: first.start..python.len(),
        });
    }
    Ok(placements)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use smolder_agent_ebpf::PYTHON_ENTRY;

    use super::*;

    const LOOP: (u64, u64) = (0x1000, 0x2000);
    const WHOLE: Walks = Walks {
        native_complete: true,
        python_complete: true,
    };

    /// One frame of a mixed stack, for reading the placements back.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum MixedFrame {
        Native(u64),
        Python(PythonFrame),
    }

    fn py(code: u64, entry: bool) -> PythonFrame {
        PythonFrame {
            code: code | if entry { PYTHON_ENTRY } else { 0 },
            instr: 0,
        }
    }

    /// The mixed stack, leaf first, as the symbolizer lays the placements out.
    fn mix(
        native: &[u64],
        python: &[PythonFrame],
        walks: Walks,
    ) -> Result<Vec<MixedFrame>, MixError> {
        let placements = place(native, python, LOOP, walks)?;
        let mut mixed = Vec::new();
        let mut next = placements.iter().peekable();
        for (depth, &addr) in native.iter().enumerate() {
            match next.next_if(|p| p.depth == depth) {
                Some(p) => mixed.extend(
                    python[p.frames.clone()]
                        .iter()
                        .map(|&f| MixedFrame::Python(f)),
                ),
                None => mixed.push(MixedFrame::Native(addr)),
            }
        }
        if let Some(p) = next.next_if(|p| p.depth == native.len()) {
            mixed.extend(
                python[p.frames.clone()]
                    .iter()
                    .map(|&f| MixedFrame::Python(f)),
            );
        }
        assert!(next.next().is_none());
        Ok(mixed)
    }

    #[test]
    fn each_loop_frame_takes_the_python_frames_it_ran() {
        // sorted(key=key) from sort_items from <module>: leaf first, the key function's own
        // loop call, sorted's C frames, then the outer loop call running sort_items and
        // <module>, then main.
        let native = [0x1100, 0x5000, 0x5100, 0x1200, 0x9000];
        let python = [py(0x10, true), py(0x20, false), py(0x30, true)];
        let mixed = mix(&native, &python, WHOLE).unwrap();
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
            mix(&native, &python, WHOLE).unwrap(),
            [
                MixedFrame::Native(0x5000),
                MixedFrame::Python(python[0]),
                MixedFrame::Native(0x9000)
            ]
        );
        // The leaf's address is exact.
        assert!(mix(&[0x2000, 0x9000], &python, WHOLE).is_err());
    }

    #[test]
    fn stacks_that_disagree_are_refused_unless_one_was_cut_short() {
        let python = [py(0x10, true), py(0x20, true), py(0x30, true)];
        assert_eq!(
            mix(&[0x1100, 0x9000], &python, WHOLE),
            Err(MixError::Mismatch {
                loops: 1,
                groups: 3
            })
        );
        // A native walk cut short: the outer groups go above its root-most frame.
        let cut = Walks {
            native_complete: false,
            ..WHOLE
        };
        assert_eq!(
            mix(&[0x5000, 0x1100, 0x5100], &python, cut).unwrap(),
            [
                MixedFrame::Native(0x5000),
                MixedFrame::Python(python[0]),
                MixedFrame::Native(0x5100),
                MixedFrame::Python(python[1]),
                MixedFrame::Python(python[2]),
            ]
        );
        // A Python walk cut at its limit: the outer loop frames stay native.
        let deep = Walks {
            python_complete: false,
            ..WHOLE
        };
        let few = [py(0x10, true)];
        assert_eq!(
            mix(&[0x1100, 0x5000, 0x1200], &few, deep).unwrap(),
            [
                MixedFrame::Python(few[0]),
                MixedFrame::Native(0x5000),
                MixedFrame::Native(0x1200),
            ]
        );
        assert!(mix(&[0x1100, 0x5000, 0x1200], &few, WHOLE).is_err());
        assert_eq!(groups(&[py(1 << 4, false)]).len(), 1);
        assert!(groups(&[]).is_empty());
    }

    proptest! {
        #[test]
        fn mixing_keeps_both_stacks_in_order(
            layout in proptest::collection::vec((0usize..4, 1usize..4), 0..6),
            leaf_in_loop: bool,
            cut in 0usize..8,
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
            // Sometimes the native walk stops early.
            let native_complete = cut == 0 || cut >= native.len();
            if !native_complete {
                native.truncate(cut);
            }
            let walks = Walks { native_complete, python_complete: true };
            let mixed = mix(&native, &python, walks).unwrap();
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
