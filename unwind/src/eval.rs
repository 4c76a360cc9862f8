//! A userspace unwinder over the same rows the BPF unwinder uses: the test oracle that tells a
//! wrong table from a wrong BPF walk.
//!
//! Input: registers, a [`Memory`] to read the stack from, and [`Tables`] that map an address to
//! an executable's table and load bias. Output: one frame up ([`step`]) or a whole walk
//! ([`unwind`]) ending in a [`Status`]. It follows the BPF rules step by step: the return address
//! of every frame but a leaf is looked up at `pc - 1` (its call instruction); where no table or
//! no FDE applies, one frame-pointer step with the same sanity checks (aligned, inside the
//! 8 MiB above `rsp`, moving up); after a signal frame the interrupted frame is a leaf.

use crate::rule::{Cfa, Fp, Rule, Unsupported};
use crate::table::UnwindTable;

/// Where the interrupted registers are in a signal frame: `rsp` points at the `ucontext` of
/// `struct rt_sigframe` when `__restore_rt` runs, and its `uc_mcontext.gregs` start 40 bytes in.
pub const SIGNAL_GREGS_OFFSET: u64 = 40;
/// Index of `rbp` in `gregs` (`REG_RBP`).
pub const SIGNAL_REG_RBP: u64 = 10;
/// Index of `rsp` in `gregs` (`REG_RSP`).
pub const SIGNAL_REG_RSP: u64 = 15;
/// Index of `rip` in `gregs` (`REG_RIP`).
pub const SIGNAL_REG_RIP: u64 = 16;
/// The largest frame a frame-pointer step accepts: `rbp` must lie within this many bytes above
/// `rsp` (the default stack limit of a main thread).
pub const MAX_FP_FRAME: u64 = 8 << 20;

/// The registers an unwinder needs. `rbp` is `None` once a frame could not recover it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registers {
    /// Instruction pointer.
    pub rip: u64,
    /// Stack pointer.
    pub rsp: u64,
    /// Frame pointer, if known.
    pub rbp: Option<u64>,
}

/// Reads the unwound process's memory.
pub trait Memory {
    /// The 8 bytes at `address`, little-endian, or `None` when unreadable.
    fn read_u64(&self, address: u64) -> Option<u64>;
}

/// Finds the table governing an address.
pub trait Tables {
    /// The table of the executable mapped at `address` and its load bias (runtime address minus
    /// ELF virtual address), or `None` when no table applies (anonymous or JIT code, an
    /// executable without one).
    fn find(&self, address: u64) -> Option<(&UnwindTable, u64)>;
}

/// Why a walk ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// An end-of-stack row, or a zero return address where a row said the return address is:
    /// the whole stack.
    Complete,
    /// The frame limit was reached before the end.
    Truncated,
    /// A frame-pointer step taken because no table covers the address (a process whose tables
    /// are not loaded, anonymous or JIT code) failed its checks.
    NoTable,
    /// A frame-pointer step taken because the table has no FDE for the address failed its
    /// checks.
    BadFramePointer,
    /// A row the unwinder does not compute.
    Unsupported(Unsupported),
    /// A frame needed `rbp`, which an earlier frame could not recover.
    FpLost,
    /// The stack could not be read.
    ReadFault,
    /// The computed CFA was not above the stack pointer.
    NotMovingUp,
    /// A frame-pointer step met a zero frame pointer or a zero return address: the end of the
    /// chain, which is the stack's root only if every frame walked keeps a frame pointer (code
    /// built without them keeps the zero `_start` and `clone3` put in `rbp`).
    FpEnd,
}

impl Status {
    /// The status's number in a BPF sample (`enum smolder_unwind_status` in
    /// `agent-ebpf/src/unwind.h`).
    pub fn code(self) -> u16 {
        match self {
            Status::Complete => 0,
            Status::Truncated => 1,
            Status::NoTable => 2,
            Status::BadFramePointer => 3,
            Status::Unsupported(_) => 4,
            Status::FpLost => 5,
            Status::ReadFault => 6,
            Status::NotMovingUp => 7,
            Status::FpEnd => 9,
        }
    }
}

/// One step's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The caller's registers; `leaf` when the caller was interrupted (after a signal frame)
    /// rather than making a call.
    Caller {
        /// The caller's registers.
        regs: Registers,
        /// Whether the caller's `rip` is exact (no `- 1` for the lookup).
        leaf: bool,
    },
    /// The walk ends here.
    End(Status),
}

/// One frame up from `regs`, with `table` and `bias` governing `regs.rip` (`None`: a
/// frame-pointer step). `leaf` says whether `regs.rip` is exact (the first frame, or after a
/// signal frame) rather than a return address.
pub fn step(
    table: Option<(&UnwindTable, u64)>,
    regs: &Registers,
    leaf: bool,
    mem: &dyn Memory,
) -> Step {
    let rule = match table {
        Some((table, bias)) => {
            let pc = if leaf {
                regs.rip
            } else {
                regs.rip.wrapping_sub(1)
            };
            table.lookup(pc.wrapping_sub(bias))
        }
        None => return frame_pointer_step(regs, mem, Status::NoTable),
    };
    match rule {
        Rule::NoFde => frame_pointer_step(regs, mem, Status::BadFramePointer),
        Rule::End => Step::End(Status::Complete),
        Rule::Unsupported(reason) => Step::End(Status::Unsupported(reason)),
        Rule::Signal => signal_step(regs, mem),
        Rule::Frame { cfa, fp } => frame_step(regs, cfa, fp, mem),
    }
}

fn frame_step(regs: &Registers, cfa: Cfa, fp: Fp, mem: &dyn Memory) -> Step {
    let cfa = match cfa {
        Cfa::Rsp(off) => regs.rsp.wrapping_add(off.into()),
        Cfa::Rbp(off) => match regs.rbp {
            Some(rbp) => rbp.wrapping_add(off.into()),
            None => return Step::End(Status::FpLost),
        },
        Cfa::Plt1 | Cfa::Plt2 => {
            let threshold = if cfa == Cfa::Plt1 { 11 } else { 10 };
            regs.rsp
                .wrapping_add(if regs.rip & 15 >= threshold { 16 } else { 8 })
        }
        Cfa::DerefRsp { offset, add } => match mem.read_u64(regs.rsp.wrapping_add(offset.into())) {
            Some(value) => value.wrapping_add_signed(add.into()),
            None => return Step::End(Status::ReadFault),
        },
    };
    if cfa <= regs.rsp {
        return Step::End(Status::NotMovingUp);
    }
    let Some(rip) = mem.read_u64(cfa.wrapping_sub(8)) else {
        return Step::End(Status::ReadFault);
    };
    let rbp = match fp {
        Fp::Same => regs.rbp,
        Fp::AtCfa(off) => match mem.read_u64(cfa.wrapping_add_signed(off.into())) {
            Some(rbp) => Some(rbp),
            None => return Step::End(Status::ReadFault),
        },
        Fp::Lost => None,
    };
    if rip == 0 {
        return Step::End(Status::Complete);
    }
    Step::Caller {
        regs: Registers { rip, rsp: cfa, rbp },
        leaf: false,
    }
}

/// One frame-pointer step; `failure` is the status when its checks fail.
fn frame_pointer_step(regs: &Registers, mem: &dyn Memory, failure: Status) -> Step {
    let Some(rbp) = regs.rbp else {
        return Step::End(Status::FpLost);
    };
    if rbp == 0 {
        return Step::End(Status::FpEnd);
    }
    if rbp % 8 != 0 || rbp < regs.rsp || rbp - regs.rsp >= MAX_FP_FRAME {
        return Step::End(failure);
    }
    let (Some(caller_rbp), Some(rip)) = (mem.read_u64(rbp), mem.read_u64(rbp.wrapping_add(8)))
    else {
        return Step::End(Status::ReadFault);
    };
    if rip == 0 {
        return Step::End(Status::FpEnd);
    }
    Step::Caller {
        regs: Registers {
            rip,
            rsp: rbp.wrapping_add(16),
            rbp: Some(caller_rbp),
        },
        leaf: false,
    }
}

fn signal_step(regs: &Registers, mem: &dyn Memory) -> Step {
    let gregs = regs.rsp.wrapping_add(SIGNAL_GREGS_OFFSET);
    let read = |index: u64| mem.read_u64(gregs.wrapping_add(8 * index));
    let (Some(rip), Some(rsp), Some(rbp)) = (
        read(SIGNAL_REG_RIP),
        read(SIGNAL_REG_RSP),
        read(SIGNAL_REG_RBP),
    ) else {
        return Step::End(Status::ReadFault);
    };
    if rip == 0 {
        return Step::End(Status::Complete);
    }
    Step::Caller {
        regs: Registers {
            rip,
            rsp,
            rbp: Some(rbp),
        },
        leaf: true,
    }
}

/// A whole walk: the instruction pointers, leaf first, and why it ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Walk {
    /// Instruction pointers, leaf first (return addresses as read, not minus one).
    pub frames: Vec<u64>,
    /// Why the walk ended.
    pub status: Status,
}

/// Unwinds from `regs` (a leaf) for at most `max_frames` frames.
pub fn unwind(tables: &dyn Tables, regs: Registers, mem: &dyn Memory, max_frames: usize) -> Walk {
    let mut frames = Vec::new();
    let mut regs = regs;
    let mut leaf = true;
    while frames.len() < max_frames {
        frames.push(regs.rip);
        match step(tables.find(regs.rip), &regs, leaf, mem) {
            Step::Caller {
                regs: caller,
                leaf: caller_leaf,
            } => {
                regs = caller;
                leaf = caller_leaf;
            }
            Step::End(status) => return Walk { frames, status },
        }
    }
    Walk {
        frames,
        status: Status::Truncated,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::elf::ExeId;
    use crate::table::{Limits, Stats};

    struct Stack(HashMap<u64, u64>);

    impl Memory for Stack {
        fn read_u64(&self, address: u64) -> Option<u64> {
            self.0.get(&address).copied()
        }
    }

    struct One(UnwindTable, u64);

    impl Tables for One {
        fn find(&self, address: u64) -> Option<(&UnwindTable, u64)> {
            (0x1000..0x9000)
                .contains(&address)
                .then_some((&self.0, self.1))
        }
    }

    #[test]
    fn rows_then_frame_pointers_then_the_end() {
        // Code at 0x1000.. (bias 0): leaf at 0x1010 with CFA rsp+16, caller at 0x2000 with CFA
        // rbp+16 and rbp saved at CFA-16, then an address no FDE covers (frame-pointer step),
        // then _start with an undefined return address.
        let rows = [
            (
                0x1000,
                Rule::Frame {
                    cfa: Cfa::Rsp(16),
                    fp: Fp::Same,
                },
            ),
            (0x1100, Rule::NoFde),
            (
                0x2000,
                Rule::Frame {
                    cfa: Cfa::Rbp(16),
                    fp: Fp::AtCfa(-16),
                },
            ),
            (0x2100, Rule::NoFde),
            (0x4000, Rule::End),
            (0x4010, Rule::NoFde),
        ];
        let table = UnwindTable::from_rows(
            ExeId::BuildId(vec![1], [0; 16]),
            &rows,
            Stats::default(),
            &Limits::default(),
        )
        .unwrap();
        let mem = Stack(HashMap::from([
            (0x7f08, 0x2005), // leaf's return address at CFA-8 (CFA = 0x7f00 + 16)
            (0x7f80, 0x7fc0), // caller's saved rbp, at CFA-16 (CFA = 0x7f80 + 16)
            (0x7f88, 0x3004), // caller's return address
            (0x7fc0, 0),      // the fp step's saved rbp
            (0x7fc8, 0x4001), // the fp step's return address
        ]));
        let walk = unwind(
            &One(table, 0),
            Registers {
                rip: 0x1010,
                rsp: 0x7f00,
                rbp: Some(0x7f80),
            },
            &mem,
            128,
        );
        assert_eq!(
            walk,
            Walk {
                frames: vec![0x1010, 0x2005, 0x3004, 0x4001],
                status: Status::Complete
            }
        );
    }

    proptest::proptest! {
        /// Any registers over any memory end in a status, never a panic, within the limit.
        #[test]
        fn arbitrary_stacks_never_panic(
            rip in proptest::prelude::any::<u64>(),
            rsp in proptest::prelude::any::<u64>(),
            rbp in proptest::prelude::any::<Option<u64>>(),
            words in proptest::collection::vec(proptest::prelude::any::<u64>(), 0..64),
        ) {
            let rows = [
                (0x1000, Rule::Frame { cfa: Cfa::Rsp(16), fp: Fp::AtCfa(-16) }),
                (0x1100, Rule::Frame { cfa: Cfa::Rbp(16), fp: Fp::Same }),
                (0x1200, Rule::Frame { cfa: Cfa::Plt1, fp: Fp::Same }),
                (0x1300, Rule::Frame { cfa: Cfa::DerefRsp { offset: 8, add: -8 }, fp: Fp::Same }),
                (0x1400, Rule::Signal),
                (0x1500, Rule::NoFde),
                (0x1600, Rule::Frame { cfa: Cfa::Rsp(65_600), fp: Fp::Lost }),
                (0x1700, Rule::End),
            ];
            let table = UnwindTable::from_rows(ExeId::BuildId(vec![1], [0; 16]), &rows, Stats::default(), &Limits::default()).unwrap();
            // The words lie from rsp up.
            let stack: HashMap<u64, u64> = words
                .iter()
                .enumerate()
                .map(|(i, &w)| (rsp.wrapping_add(8 * i as u64), w))
                .collect();
            let walk = unwind(&One(table, 0), Registers { rip, rsp, rbp }, &Stack(stack), 32);
            proptest::prop_assert!(walk.frames.len() <= 32);
        }
    }

    #[test]
    fn truncated_and_not_moving_up() {
        let rows = [
            (
                0x1000,
                Rule::Frame {
                    cfa: Cfa::Rsp(0),
                    fp: Fp::Same,
                },
            ),
            (0x8000, Rule::NoFde),
        ];
        let table = UnwindTable::from_rows(
            ExeId::BuildId(vec![1], [0; 16]),
            &rows,
            Stats::default(),
            &Limits::default(),
        )
        .unwrap();
        let regs = Registers {
            rip: 0x1010,
            rsp: 0x7f00,
            rbp: None,
        };
        let walk = unwind(&One(table.clone(), 0), regs, &Stack(HashMap::new()), 128);
        assert_eq!(walk.status, Status::NotMovingUp);
        let walk = unwind(&One(table, 0), regs, &Stack(HashMap::new()), 0);
        assert_eq!(walk.status, Status::Truncated);
    }
}
