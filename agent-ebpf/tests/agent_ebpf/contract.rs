//! The BPF side reads rows and reports statuses with the numbers `smolder-unwind` writes and
//! its evaluator uses: a mismatch here would make the kernel misread every table.

use smolder_agent_ebpf::unwind::{self, CFA_KINDS, FP_KINDS, Status};
use smolder_unwind::Unsupported;
use smolder_unwind::eval::{self as eval, Status as EvalStatus};

#[test]
fn row_kinds_match() {
    let cfa = [
        smolder_unwind::CFA_NO_FDE,
        smolder_unwind::CFA_RSP,
        smolder_unwind::CFA_RSP_X8,
        smolder_unwind::CFA_RBP,
        smolder_unwind::CFA_PLT1,
        smolder_unwind::CFA_PLT2,
        smolder_unwind::CFA_DEREF_RSP,
        smolder_unwind::CFA_SIGNAL,
        smolder_unwind::CFA_END,
        smolder_unwind::CFA_UNSUPPORTED,
    ];
    assert_eq!(CFA_KINDS.map(|(_, kind)| kind), cfa);
    let fp = [
        smolder_unwind::FP_SAME,
        smolder_unwind::FP_AT_CFA,
        smolder_unwind::FP_LOST,
    ];
    assert_eq!(FP_KINDS.map(|(_, kind)| kind), fp);
    assert_eq!(unwind::PAGE_BITS, smolder_unwind::PAGE_BITS);
    assert_eq!(unwind::SEARCH_STEPS, smolder_unwind::SEARCH_STEPS);
}

#[test]
fn statuses_and_frame_checks_match_the_evaluator() {
    let pairs = [
        (Status::Complete, EvalStatus::Complete),
        (Status::Truncated, EvalStatus::Truncated),
        (Status::NoTable, EvalStatus::NoTable),
        (Status::BadFramePointer, EvalStatus::BadFramePointer),
        (
            Status::Unsupported,
            EvalStatus::Unsupported(Unsupported::CfaRegister),
        ),
        (Status::FpLost, EvalStatus::FpLost),
        (Status::ReadFault, EvalStatus::ReadFault),
        (Status::NotMovingUp, EvalStatus::NotMovingUp),
        (Status::FpEnd, EvalStatus::FpEnd),
    ];
    for (ours, theirs) in pairs {
        assert_eq!(ours as u16, theirs.code(), "{ours:?}");
        assert_eq!(Status::from_raw(theirs.code()), Some(ours));
    }
    assert_eq!(unwind::MAX_FP_FRAME, eval::MAX_FP_FRAME);
    assert_eq!(unwind::SIGNAL_GREGS, eval::SIGNAL_GREGS_OFFSET);
    assert_eq!(unwind::SIGNAL_RBP, eval::SIGNAL_REG_RBP);
    assert_eq!(unwind::SIGNAL_RSP, eval::SIGNAL_REG_RSP);
    assert_eq!(unwind::SIGNAL_RIP, eval::SIGNAL_REG_RIP);
}
