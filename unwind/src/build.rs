//! From call-frame information to rows: gimli runs each FDE's CFA program, and every row it
//! yields is converted into one [`Rule`] of the small set the BPF unwinder computes.
//!
//! Input: an [`Elf`] (and optionally its separate debug file). Output: an [`UnwindTable`] with its
//! [`Stats`]. Rows are sorted by address; an end-of-FDE marker ([`Rule::NoFde`]) follows each
//! FDE unless the next one starts there; a row repeating the rule before it is dropped.
//!
//! Conversion (x86-64 DWARF registers: 6 = `rbp`, 7 = `rsp`, 16 = return address):
//!
//! | call-frame information | rule |
//! |---|---|
//! | CIE augmentation `S` (glibc `__restore_rt`) | [`Rule::Signal`] for the whole FDE |
//! | return address undefined (`_start`, `clone3`'s child) | [`Rule::End`] |
//! | return address other than at `CFA - 8` | [`Unsupported::ReturnAddress`] |
//! | CFA = `rsp + n` (n < 64 KiB, or a multiple of 8 < 512 KiB) / `rbp + n` (n < 64 KiB) | [`Cfa::Rsp`] / [`Cfa::Rbp`] |
//! | CFA = another register + n | [`Unsupported::CfaRegister`] |
//! | binutils' two PLT expressions, byte for byte | [`Cfa::Plt1`], [`Cfa::Plt2`] |
//! | `DW_OP_breg7 a; DW_OP_deref [; DW_OP_plus_uconst b]` | [`Cfa::DerefRsp`] |
//! | any other CFA expression | [`Unsupported::CfaExpression`] |
//! | `rbp` same value / not mentioned / saved at `CFA + n` | [`Fp::Same`] / [`Fp::AtCfa`] |
//! | `rbp` in a register or an expression | [`Fp::Lost`] |
//!
//! Go binaries carry no `.eh_frame` for Go code but always keep frame pointers: their Go text
//! (`runtime.text` to `runtime.etext`, else `.text`) gets one frame-pointer row (CFA = `rbp +
//! 16`, `rbp` at `CFA - 16`) and end-of-stack rows over `runtime.goexit`, `runtime.mstart` and
//! `runtime.rt0_go`, where goroutine and thread stacks begin, and `runtime.mcall` and
//! `runtime.morestack`, where the scheduler's begins. A Go function sampled before its
//! prologue saved `rbp` loses its caller's frame, as with any frame-pointer walk; `.eh_frame`
//! rows (cgo's C code) are kept outside the Go text.

use std::collections::HashMap;

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, CommonInformationEntry, DebugFrame, EhFrame, EndianSlice,
    LittleEndian, RegisterRule, UnwindContext, UnwindSection, UnwindTableRow, X86_64,
};

use crate::elf::{Cfi, CfiKind, Elf};
use crate::error::UnwindError;
use crate::rule::{Cfa, Fp, Rule, Unsupported};
use crate::table::{Limits, Stats, UnwindTable, check_limit};

type Slice<'a> = EndianSlice<'a, LittleEndian>;

/// binutils' PLT CFA expression for the 16-byte PLT entries of `ld`'s first layout:
/// `DW_OP_breg7 8; DW_OP_breg16 0; DW_OP_lit15; DW_OP_and; DW_OP_lit11; DW_OP_ge;
/// DW_OP_lit3; DW_OP_shl; DW_OP_plus`.
const PLT1: [u8; 11] = [
    0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22,
];
/// The same with `DW_OP_lit10` (`.plt.sec` / IBT layouts).
const PLT2: [u8; 11] = [
    0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3a, 0x2a, 0x33, 0x24, 0x22,
];

/// Functions where Go stacks begin, as the Go runtime's own traceback says (`topofstack`):
/// goroutines at `goexit`, threads at `mstart` and `rt0_go`, and the scheduler's stack (`g0`)
/// at `mcall` and `morestack`, which switch to it from a goroutine's (a preemption, a stack
/// growth) and leave no frame pointer to follow back.
const GO_STACK_ROOTS: [&str; 10] = [
    "runtime.goexit.abi0",
    "runtime.goexit",
    "runtime.mstart.abi0",
    "runtime.mstart",
    "runtime.rt0_go.abi0",
    "runtime.rt0_go",
    "runtime.mcall",
    "runtime.mcall.abi0",
    "runtime.morestack.abi0",
    "runtime.morestack",
];

/// Every symbol a Go binary's table is built from: its text's bounds and its stack roots.
pub(crate) const GO_SYMBOLS: [&str; 12] = [
    "runtime.text",
    "runtime.etext",
    GO_STACK_ROOTS[0],
    GO_STACK_ROOTS[1],
    GO_STACK_ROOTS[2],
    GO_STACK_ROOTS[3],
    GO_STACK_ROOTS[4],
    GO_STACK_ROOTS[5],
    GO_STACK_ROOTS[6],
    GO_STACK_ROOTS[7],
    GO_STACK_ROOTS[8],
    GO_STACK_ROOTS[9],
];

/// Builds the unwind table of an ELF file; `debug` is its separate debug file.
///
/// Rows come from `.eh_frame`, then from the FDEs of `.debug_frame` (the file's own, then the
/// debug file's) over code `.eh_frame` does not cover: code built with
/// `-fno-asynchronous-unwind-tables` has only `.debug_frame`, next to the C runtime's `.eh_frame`.
///
/// # Errors
///
/// [`UnwindError::NoCfi`] when neither file has call-frame information,
/// [`UnwindError::Cfi`] when its framing does not parse, [`UnwindError::TooLarge`] past
/// `limits`, [`UnwindError::Compressed`] for a `.debug_frame` that does not decompress.
pub fn build(
    elf: &Elf<'_>,
    debug: Option<&Elf<'_>>,
    limits: &Limits,
) -> Result<UnwindTable, UnwindError> {
    let mut stats = Stats::default();
    let mut spans = Vec::new();
    let mut raw = Vec::new();
    let mut sources = vec![elf.eh_frame(), elf.debug_frame()?];
    if let Some(debug) = debug {
        sources.push(debug.debug_frame()?);
    }
    for (i, cfi) in sources.iter().enumerate() {
        let Some(cfi) = cfi else { continue };
        let secondary = i > 0;
        let before = spans.len();
        read_cfi(elf, cfi, limits, &mut stats, &mut spans, &mut raw)?;
        for span in &mut spans[before..] {
            span.secondary = secondary;
        }
        if stats.cfi.is_none() && spans.len() > before {
            stats.cfi = Some(cfi.kind);
        }
    }
    let go = elf.is_go().then(|| go_span(elf, &mut raw)).flatten();
    if let Some(go) = go {
        stats.cfi = Some(CfiKind::GoFramePointers);
        // Go's text is Go's: FDEs inside it (there should be none) give way.
        spans.retain(|s: &Span| s.end <= go.start || s.start >= go.end);
        spans.push(go);
    }
    if spans.is_empty() {
        return Err(UnwindError::NoCfi);
    }
    let rows = assemble(spans, &raw, &mut stats);
    UnwindTable::from_rows(elf.id(), &rows, stats, limits)
}

/// One FDE (or the synthesized Go range): its address range and its rows in `raw`.
struct Span {
    start: u64,
    end: u64,
    rows: std::ops::Range<usize>,
    /// From `.debug_frame`: gives way to `.eh_frame` where both describe the same code.
    secondary: bool,
}

fn read_cfi(
    elf: &Elf<'_>,
    cfi: &Cfi<'_>,
    limits: &Limits,
    stats: &mut Stats,
    spans: &mut Vec<Span>,
    raw: &mut Vec<(u64, Rule)>,
) -> Result<(), UnwindError> {
    let data = EndianSlice::new(&cfi.data, LittleEndian);
    match cfi.kind {
        CfiKind::DebugFrame => {
            let mut section = DebugFrame::from(data);
            section.set_address_size(8);
            read_section(
                &section,
                &BaseAddresses::default(),
                limits,
                stats,
                spans,
                raw,
            )
        }
        _ => {
            let mut section = EhFrame::from(data);
            section.set_address_size(8);
            let mut bases = BaseAddresses::default().set_eh_frame(cfi.address);
            if let Some((text, _)) = elf.text() {
                bases = bases.set_text(text);
            }
            read_section(&section, &bases, limits, stats, spans, raw)
        }
    }
}

fn read_section<'a, S: UnwindSection<Slice<'a>>>(
    section: &S,
    bases: &BaseAddresses,
    limits: &Limits,
    stats: &mut Stats,
    spans: &mut Vec<Span>,
    raw: &mut Vec<(u64, Rule)>,
) -> Result<(), UnwindError> {
    let mut ctx = Box::new(UnwindContext::<usize>::new());
    // CIEs are few and shared by many FDEs: parse each once.
    let mut cies: HashMap<usize, CommonInformationEntry<Slice<'a>>> = HashMap::new();
    let mut entries = section.entries(bases);
    loop {
        let entry = entries
            .next()
            .map_err(|source| UnwindError::Cfi { source })?;
        let Some(entry) = entry else { break };
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        stats.fdes += 1;
        let fde = partial.parse(|section, bases, offset| {
            let key = gimli::UnwindOffset::into(offset);
            if let Some(cie) = cies.get(&key) {
                return Ok(cie.clone());
            }
            let cie = section.cie_from_offset(bases, offset)?;
            cies.insert(key, cie.clone());
            Ok(cie)
        });
        let Ok(fde) = fde else {
            stats.fdes_skipped += 1;
            continue;
        };
        if fde.len() == 0 {
            stats.fdes_skipped += 1;
            continue;
        }
        let signal = fde.is_signal_trampoline();
        stats.signal_fdes += u64::from(signal);
        let first = raw.len();
        let ok = (|| -> gimli::Result<()> {
            let mut table = fde.rows(section, bases, &mut ctx)?;
            while let Some(row) = table.next_row()? {
                stats.cfi_rows += 1;
                let rule = if signal {
                    Rule::Signal
                } else {
                    convert(row, section, stats)
                };
                raw.push((row.start_address(), rule));
            }
            Ok(())
        })();
        if ok.is_err() {
            raw.truncate(first);
            stats.fdes_skipped += 1;
            continue;
        }
        spans.push(Span {
            start: fde.initial_address(),
            end: fde.end_address(),
            rows: first..raw.len(),
            secondary: false,
        });
        // The table's own row limit, checked as the rows are read rather than once they are
        // all in memory (a few tens of bytes each before compaction): a binary past it costs
        // no more than the limit's worth.
        check_limit("rows", raw.len() as u64, u64::from(limits.max_rows))?;
    }
    Ok(())
}

/// One CFI row as a rule.
fn convert<'a, S: UnwindSection<Slice<'a>>>(
    row: &UnwindTableRow<usize>,
    section: &S,
    stats: &mut Stats,
) -> Rule {
    match row.register(X86_64::RA) {
        Some(RegisterRule::Offset(-8)) => {}
        Some(RegisterRule::Undefined) => return Rule::End,
        _ => return unsupported(stats, Unsupported::ReturnAddress),
    }
    let cfa = match *row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            if register != X86_64::RSP && register != X86_64::RBP {
                return unsupported(stats, Unsupported::CfaRegister);
            }
            let cfa = match (register == X86_64::RSP, u32::try_from(offset)) {
                (true, Ok(offset)) => Cfa::Rsp(offset),
                (false, Ok(offset)) if offset <= 0xffff => Cfa::Rbp(offset as u16),
                _ => return unsupported(stats, Unsupported::CfaOffset),
            };
            if !cfa.fits() {
                return unsupported(stats, Unsupported::CfaOffset);
            }
            cfa
        }
        CfaRule::Expression(expr) => {
            let Some(cfa) = expr
                .get(section)
                .ok()
                .and_then(|e| cfa_expression(e.0.slice()))
            else {
                return unsupported(stats, Unsupported::CfaExpression);
            };
            cfa
        }
    };
    let fp = match row.register(X86_64::RBP) {
        None | Some(RegisterRule::SameValue | RegisterRule::Undefined) => Fp::Same,
        Some(RegisterRule::Offset(offset)) => match i16::try_from(offset) {
            Ok(offset) => Fp::AtCfa(offset),
            Err(_) => Fp::Lost,
        },
        Some(_) => Fp::Lost,
    };
    if fp == Fp::Lost {
        stats.fp_lost += 1;
    }
    if matches!(cfa, Cfa::DerefRsp { .. }) && fp != Fp::Same {
        // The row has room for the add or the rbp offset, not both.
        return unsupported(stats, Unsupported::CfaExpression);
    }
    Rule::Frame { cfa, fp }
}

fn unsupported(stats: &mut Stats, reason: Unsupported) -> Rule {
    stats.count_unsupported(reason);
    Rule::Unsupported(reason)
}

/// The CFA expressions with a rule of their own.
fn cfa_expression(bytes: &[u8]) -> Option<Cfa> {
    if bytes == PLT1 {
        return Some(Cfa::Plt1);
    }
    if bytes == PLT2 {
        return Some(Cfa::Plt2);
    }
    // DW_OP_breg7 (rsp) <sleb offset>; DW_OP_deref [; DW_OP_plus_uconst <uleb add>]
    let mut input = EndianSlice::new(bytes, LittleEndian);
    use gimli::Reader as _;
    if input.read_u8().ok()? != gimli::constants::DW_OP_breg7.0 {
        return None;
    }
    let offset = u16::try_from(input.read_sleb128().ok()?).ok()?;
    if input.read_u8().ok()? != gimli::constants::DW_OP_deref.0 {
        return None;
    }
    let add = if input.is_empty() {
        0
    } else {
        if input.read_u8().ok()? != gimli::constants::DW_OP_plus_uconst.0 {
            return None;
        }
        i16::try_from(input.read_uleb128().ok()?).ok()?
    };
    input.is_empty().then_some(Cfa::DerefRsp { offset, add })
}

/// The synthesized span of a Go binary's text: frame-pointer rows, with end-of-stack rows over
/// the functions where stacks begin.
fn go_span(elf: &Elf<'_>, raw: &mut Vec<(u64, Rule)>) -> Option<Span> {
    let (start, end) = match (elf.symbol("runtime.text"), elf.symbol("runtime.etext")) {
        (Some((start, _)), Some((end, _))) if start < end => (start, end),
        _ => elf.text()?,
    };
    let fp = Rule::Frame {
        cfa: Cfa::Rbp(16),
        fp: Fp::AtCfa(-16),
    };
    let mut roots: Vec<(u64, u64)> = GO_STACK_ROOTS
        .iter()
        .filter_map(|name| elf.symbol(name))
        .filter(|&(addr, size)| addr >= start && addr.saturating_add(size) <= end && size > 0)
        .collect();
    roots.sort_unstable();
    roots.dedup();
    let first = raw.len();
    raw.push((start, fp));
    for (addr, size) in roots {
        raw.push((addr, Rule::End));
        raw.push((addr + size, fp));
    }
    Some(Span {
        start,
        end,
        rows: first..raw.len(),
        secondary: false,
    })
}

/// Sorts the spans and lays their rows out with end-of-FDE markers, deduplicated and compacted.
fn assemble(mut spans: Vec<Span>, raw: &[(u64, Rule)], stats: &mut Stats) -> Vec<(u64, Rule)> {
    if spans.iter().any(|s| s.secondary) {
        let mut primary: Vec<(u64, u64)> = spans
            .iter()
            .filter(|s| !s.secondary)
            .map(|s| (s.start, s.end))
            .collect();
        primary.sort_unstable();
        spans.retain(|s| !s.secondary || !overlaps(&primary, s.start, s.end));
    }
    spans.sort_by_key(|s| (s.start, s.end));
    let mut rows: Vec<(u64, Rule)> = Vec::with_capacity(raw.len() + spans.len());
    let mut open_end: Option<u64> = None;
    for span in spans {
        if let Some(end) = open_end {
            if span.start < end {
                stats.fdes_skipped += 1;
                continue;
            }
            push(&mut rows, end, Rule::NoFde);
        }
        for &(pc, rule) in &raw[span.rows] {
            if pc >= span.start && pc < span.end {
                push(&mut rows, pc, rule);
            }
        }
        open_end = Some(span.end);
    }
    if let Some(end) = open_end {
        push(&mut rows, end, Rule::NoFde);
    }
    rows
}

/// Whether `[start, end)` overlaps a range of `sorted` (sorted, non-overlapping ranges).
fn overlaps(sorted: &[(u64, u64)], start: u64, end: u64) -> bool {
    let i = sorted.partition_point(|r| r.1 <= start);
    sorted.get(i).is_some_and(|r| r.0 < end)
}

/// Appends a row: a row at the same address as the last one replaces it; a row repeating the
/// rule before it is dropped.
fn push(rows: &mut Vec<(u64, Rule)>, pc: u64, rule: Rule) {
    if rows.last().is_some_and(|last| last.0 == pc) {
        rows.pop();
    }
    if rows.last().is_some_and(|last| last.1 == rule) {
        return;
    }
    rows.push((pc, rule));
}
