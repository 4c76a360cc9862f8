//! The rule set a row can hold, and its 8-byte encoding.
//!
//! Input: nothing (plain types). Output: [`Rule`]s that the builder makes from call-frame
//! information and [`Rule::encode`]s into the rows the BPF unwinder binary-searches. The kind
//! numbers below are the contract with `agent-ebpf/src/unwind.h`, which repeats them; the two
//! must stay in step.
//!
//! On x86-64 one frame is recovered by three rules: the CFA (the caller's stack pointer before
//! the call), the return address (always at `CFA - 8` by the ABI, so not stored) and the caller's
//! `rbp`. Everything the BPF side cannot compute in a few instructions is an
//! [`Rule::Unsupported`] row with its [`Unsupported`] reason: the unwinder stops there rather than
//! guess.

use std::fmt;

/// `UNWIND_CFA_NO_FDE`: no FDE covers the address; the walk may fall back to frame pointers.
pub const CFA_NO_FDE: u8 = 0;
/// `UNWIND_CFA_RSP`: CFA = `rsp + cfa_off`.
pub const CFA_RSP: u8 = 1;
/// `UNWIND_CFA_RSP_X8`: CFA = `rsp + 8 * cfa_off`, for frames past 64 KiB (python3.11 has
/// functions with 65,600-byte frames).
pub const CFA_RSP_X8: u8 = 2;
/// `UNWIND_CFA_RBP`: CFA = `rbp + cfa_off`.
pub const CFA_RBP: u8 = 3;
/// `UNWIND_CFA_PLT1`: binutils' first PLT expression, CFA = `rsp + 8 + ((rip & 15) >= 11 ? 8 : 0)`.
pub const CFA_PLT1: u8 = 4;
/// `UNWIND_CFA_PLT2`: binutils' second PLT expression, the same with `>= 10`.
pub const CFA_PLT2: u8 = 5;
/// `UNWIND_CFA_DEREF_RSP`: CFA = `*(rsp + cfa_off) + fp_off` (the caller's `rbp` is unchanged).
pub const CFA_DEREF_RSP: u8 = 6;
/// `UNWIND_CFA_SIGNAL`: a signal trampoline (glibc `__restore_rt`): the interrupted registers
/// are in the `ucontext` at `rsp`, and the next frame is a leaf.
pub const CFA_SIGNAL: u8 = 7;
/// `UNWIND_CFA_END`: the return address is undefined: the stack ends here (`_start`, the child
/// side of `clone3`).
pub const CFA_END: u8 = 8;
/// `UNWIND_CFA_UNSUPPORTED`: a rule the unwinder does not compute; `cfa_off` holds the
/// [`Unsupported`] reason.
pub const CFA_UNSUPPORTED: u8 = 9;

/// `UNWIND_FP_SAME`: the caller's `rbp` is this frame's.
pub const FP_SAME: u8 = 0;
/// `UNWIND_FP_AT_CFA`: the caller's `rbp` is saved at `CFA + fp_off`.
pub const FP_AT_CFA: u8 = 1;
/// `UNWIND_FP_LOST`: the caller's `rbp` cannot be recovered (saved in another register or by an
/// expression); a later frame that needs it stops the walk.
pub const FP_LOST: u8 = 2;

/// How the CFA of a frame is computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cfa {
    /// `rsp + offset`; offsets past 65,535 must be multiples of 8 below 512 KiB
    /// ([`Cfa::fits`]).
    Rsp(u32),
    /// `rbp + offset`.
    Rbp(u16),
    /// A PLT stub, binutils' first expression (`(rip & 15) >= 11`).
    Plt1,
    /// A PLT stub, binutils' second expression (`(rip & 15) >= 10`).
    Plt2,
    /// `*(rsp + offset) + add`: a frame whose CFA was saved on the stack.
    DerefRsp {
        /// Where the saved value is, relative to `rsp`.
        offset: u16,
        /// What is added to the loaded value.
        add: i16,
    },
}

impl Cfa {
    /// Whether a row can hold this rule.
    pub fn fits(self) -> bool {
        match self {
            Cfa::Rsp(off) => off <= 0xffff || (off % 8 == 0 && off / 8 <= 0xffff),
            _ => true,
        }
    }
}

/// How the caller's `rbp` is recovered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fp {
    /// Unchanged by this frame (DWARF "same value" or "undefined" for a callee-saved register).
    Same,
    /// Saved at `CFA + offset`.
    AtCfa(i16),
    /// Not recoverable by the unwinder.
    Lost,
}

/// Why a row is [`Rule::Unsupported`]: counted per table so that what is missing is visible.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unsupported {
    /// The CFA is a register other than `rsp` or `rbp` plus an offset (hand-written assembly,
    /// stack realignment through a DRAP register).
    CfaRegister = 1,
    /// The CFA is a DWARF expression other than the PLT and `*(rsp+a)+b` forms.
    CfaExpression = 2,
    /// The CFA offset does not fit the row (negative, or past 65,535).
    CfaOffset = 3,
    /// The return address is not at `CFA - 8` (kept in a register, or an expression).
    ReturnAddress = 4,
}

impl Unsupported {
    /// Every reason, in code order.
    pub const ALL: [Unsupported; 4] = [
        Unsupported::CfaRegister,
        Unsupported::CfaExpression,
        Unsupported::CfaOffset,
        Unsupported::ReturnAddress,
    ];

    /// The reason's code in a row, if `code` is one.
    pub fn from_code(code: u16) -> Option<Unsupported> {
        Unsupported::ALL.into_iter().find(|r| *r as u16 == code)
    }

    /// A short lowercase name, used as a metric label value.
    pub fn name(self) -> &'static str {
        match self {
            Unsupported::CfaRegister => "cfa_register",
            Unsupported::CfaExpression => "cfa_expression",
            Unsupported::CfaOffset => "cfa_offset",
            Unsupported::ReturnAddress => "return_address",
        }
    }
}

/// What the unwinder does at an address: the decoded form of one row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rule {
    /// No FDE covers the address.
    NoFde,
    /// An ordinary frame: compute the CFA, read the return address at `CFA - 8`, recover `rbp`.
    Frame {
        /// The CFA rule.
        cfa: Cfa,
        /// The `rbp` rule.
        fp: Fp,
    },
    /// A signal trampoline.
    Signal,
    /// The end of the stack.
    End,
    /// A rule the unwinder does not compute.
    Unsupported(Unsupported),
}

/// A row whose kind bytes name no rule: only possible in bytes that were not written by
/// [`Rule::encode`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InvalidRow(pub u64);

impl fmt::Display for InvalidRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "row {:#018x} names no rule", self.0)
    }
}

impl Rule {
    /// The row for this rule (which must [fit](Cfa::fits)) at an address whose low 16 bits are `pc_low`: `u16 pc_low | u8
    /// cfa_kind | u8 fp_kind | u16 cfa_off | s16 fp_off`, little-endian, as the C struct lays it
    /// out.
    pub fn encode(self, pc_low: u16) -> u64 {
        let (cfa_kind, fp_kind, cfa_off, fp_off): (u8, u8, u16, i16) = match self {
            Rule::NoFde => (CFA_NO_FDE, FP_SAME, 0, 0),
            Rule::Signal => (CFA_SIGNAL, FP_SAME, 0, 0),
            Rule::End => (CFA_END, FP_SAME, 0, 0),
            Rule::Unsupported(reason) => (CFA_UNSUPPORTED, FP_SAME, reason as u16, 0),
            Rule::Frame { cfa, fp } => {
                let (fp_kind, fp_off) = match fp {
                    Fp::Same => (FP_SAME, 0),
                    Fp::AtCfa(off) => (FP_AT_CFA, off),
                    Fp::Lost => (FP_LOST, 0),
                };
                match cfa {
                    Cfa::Rsp(off) => match u16::try_from(off) {
                        Ok(off) => (CFA_RSP, fp_kind, off, fp_off),
                        Err(_) => (CFA_RSP_X8, fp_kind, (off / 8) as u16, fp_off),
                    },
                    Cfa::Rbp(off) => (CFA_RBP, fp_kind, off, fp_off),
                    Cfa::Plt1 => (CFA_PLT1, fp_kind, 0, fp_off),
                    Cfa::Plt2 => (CFA_PLT2, fp_kind, 0, fp_off),
                    // The add takes the rbp offset's place: these frames keep rbp unchanged.
                    Cfa::DerefRsp { offset, add } => (CFA_DEREF_RSP, FP_SAME, offset, add),
                }
            }
        };
        u64::from(pc_low)
            | u64::from(cfa_kind) << 16
            | u64::from(fp_kind) << 24
            | u64::from(cfa_off) << 32
            | u64::from(fp_off as u16) << 48
    }

    /// The rule a row holds and the row's `pc_low`.
    ///
    /// # Errors
    ///
    /// [`InvalidRow`] when a kind byte or an unsupported reason is unknown.
    pub fn decode(row: u64) -> Result<(u16, Rule), InvalidRow> {
        let pc_low = row as u16;
        let cfa_kind = (row >> 16) as u8;
        let fp_kind = (row >> 24) as u8;
        let cfa_off = (row >> 32) as u16;
        let fp_off = (row >> 48) as u16 as i16;
        let fp = match fp_kind {
            FP_SAME => Fp::Same,
            FP_AT_CFA => Fp::AtCfa(fp_off),
            FP_LOST => Fp::Lost,
            _ => return Err(InvalidRow(row)),
        };
        let rule = match cfa_kind {
            CFA_NO_FDE => Rule::NoFde,
            CFA_RSP => Rule::Frame {
                cfa: Cfa::Rsp(cfa_off.into()),
                fp,
            },
            CFA_RSP_X8 => Rule::Frame {
                cfa: Cfa::Rsp(u32::from(cfa_off) * 8),
                fp,
            },
            CFA_RBP => Rule::Frame {
                cfa: Cfa::Rbp(cfa_off),
                fp,
            },
            CFA_PLT1 => Rule::Frame { cfa: Cfa::Plt1, fp },
            CFA_PLT2 => Rule::Frame { cfa: Cfa::Plt2, fp },
            CFA_DEREF_RSP => Rule::Frame {
                cfa: Cfa::DerefRsp {
                    offset: cfa_off,
                    add: fp_off,
                },
                fp: Fp::Same,
            },
            CFA_SIGNAL => Rule::Signal,
            CFA_END => Rule::End,
            CFA_UNSUPPORTED => {
                Rule::Unsupported(Unsupported::from_code(cfa_off).ok_or(InvalidRow(row))?)
            }
            _ => return Err(InvalidRow(row)),
        };
        // Fields a rule does not use must be zero, so that one rule has one encoding and rows
        // compare equal exactly when their rules do.
        if rule.encode(pc_low) != row {
            return Err(InvalidRow(row));
        }
        Ok((pc_low, rule))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rule_round_trips() {
        let rules = [
            Rule::NoFde,
            Rule::Signal,
            Rule::End,
            Rule::Unsupported(Unsupported::CfaExpression),
            Rule::Frame {
                cfa: Cfa::Rsp(8),
                fp: Fp::Same,
            },
            Rule::Frame {
                cfa: Cfa::Rsp(65_600),
                fp: Fp::AtCfa(-32),
            },
            Rule::Frame {
                cfa: Cfa::Rbp(16),
                fp: Fp::AtCfa(-16),
            },
            Rule::Frame {
                cfa: Cfa::Plt1,
                fp: Fp::Lost,
            },
            Rule::Frame {
                cfa: Cfa::Plt2,
                fp: Fp::Same,
            },
            Rule::Frame {
                cfa: Cfa::DerefRsp { offset: 8, add: -8 },
                fp: Fp::Same,
            },
        ];
        for rule in rules {
            let row = rule.encode(0xbeef);
            assert_eq!(Rule::decode(row), Ok((0xbeef, rule)), "{row:#x}");
        }
    }

    #[test]
    fn the_layout_is_the_c_struct() {
        let row = Rule::Frame {
            cfa: Cfa::Rsp(0x1234),
            fp: Fp::AtCfa(-16),
        }
        .encode(0xabcd);
        assert_eq!(
            row.to_le_bytes(),
            [0xcd, 0xab, CFA_RSP, FP_AT_CFA, 0x34, 0x12, 0xf0, 0xff]
        );
    }

    #[test]
    fn stray_bits_are_rejected() {
        assert!(Rule::decode(Rule::End.encode(1) | 1 << 40).is_err());
        assert!(Rule::decode(u64::from(CFA_UNSUPPORTED) << 16 | 99 << 32).is_err());
        assert!(Rule::decode(10 << 16).is_err());
        // A large offset that fits the plain kind has one encoding only.
        assert!(Rule::decode(u64::from(CFA_RSP_X8) << 16 | 16 << 32).is_err());
    }
}
