//! Unwind tables for Smolder's BPF unwinder, built from an ELF file's call-frame information.
//!
//! Stacks of code built without frame pointers (Debian's packages, `gcc -O2`, Rust release
//! builds) can only be walked with the call-frame information compilers leave in `.eh_frame`
//! (or `.debug_frame`). BPF cannot run DWARF's CFA programs, so this crate runs them in user
//! space and flattens the result into one [`UnwindTable`] per executable: rows sorted by address,
//! each holding one [`Rule`] of a small set (CFA = `rsp`/`rbp` + offset, the PLT expressions,
//! `*(rsp+a)+b`, signal frame, end of stack), behind a directory of 4 KiB pages so the BPF side
//! finds a row in at most 12 binary-search steps.
//!
//! - [`Elf`] parses an x86-64 ELF file from bytes (a mapped file, a separate debug file, the
//!   vDSO copied out of memory), names it by [`ExeId`] (GNU build id, else SHA-256 of its
//!   bytes), finds its call-frame information (also without section headers, through
//!   `PT_GNU_EH_FRAME`) and turns a mapping into a load bias.
//! - [`build`] converts every FDE row into a [`Rule`], counting in [`Stats`] what it cannot
//!   express ([`Unsupported`], per reason) rather than guessing, and lays the rows out as an
//!   [`UnwindTable`] whose [`entries`](UnwindTable::entries) are exactly the BPF inner array.
//! - [`cache`] stores tables on disk keyed by [`ExeId`] (magic, version, checksum; reading never
//!   panics and caps sizes before allocating).
//! - [`eval`] walks a stack over the same rows in user space, the oracle for tests of the BPF
//!   walk.
//!
//! ```
//! # fn main() -> Result<(), smolder_unwind::UnwindError> {
//! let bytes = std::fs::read("/proc/self/exe").expect("our own executable");
//! let elf = smolder_unwind::Elf::parse(&bytes)?;
//! let table = smolder_unwind::build(&elf, None, &smolder_unwind::Limits::default())?;
//! assert!(table.stats().fdes > 0);
//! let bytes = smolder_unwind::cache::encode(&table);
//! assert_eq!(smolder_unwind::cache::decode(&bytes, &smolder_unwind::Limits::default())?, table);
//! # Ok(())
//! # }
//! ```
//!
//! This crate reads bytes and writes bytes: it depends on no runtime, no aya and no unsafe code,
//! so the agent's loader (which maps files and fills BPF maps) and the fuzzer can both use it.

mod build;
pub mod cache;
mod elf;
mod error;
pub mod eval;
mod rule;
mod table;

pub use build::build;
pub use elf::{CfiKind, Elf, ExeId, Layout, LoadSegment, MAX_BUILD_ID};
pub use error::UnwindError;
pub use rule::{
    CFA_DEREF_RSP, CFA_END, CFA_NO_FDE, CFA_PLT1, CFA_PLT2, CFA_RBP, CFA_RSP, CFA_RSP_X8,
    CFA_SIGNAL, CFA_UNSUPPORTED, Cfa, FP_AT_CFA, FP_LOST, FP_SAME, Fp, InvalidRow, Rule,
    Unsupported,
};
pub use table::{Limits, MAX_ROWS_PER_PAGE, PAGE_BITS, SEARCH_STEPS, Stats, UnwindTable};
