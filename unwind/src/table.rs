//! The compact table: rows sorted by address behind a directory of 4 KiB pages, in exactly the
//! layout the BPF unwinder's inner array holds.
//!
//! Input: rows from the builder ([`crate::build`]) or entries read back from the cache. Output: an
//! [`UnwindTable`] whose [`entries`](UnwindTable::entries) are copied as they are into a BPF
//! array, and whose [`lookup`](UnwindTable::lookup) finds a row the way the BPF code does. Every
//! table is validated when made, so a table from disk can be handed to the kernel as safely as a
//! fresh one.
//!
//! Layout, one `u64` per entry (little-endian C structs, see `agent-ebpf/src/unwind.h`):
//!
//! ```text
//! [0]                    header   u32 first_page | u32 n_pages      (page = address >> 12)
//! [1 ..= n_pages]        pages    u32 lo | u32 hi                   (row indexes, hi exclusive)
//! [1 + n_pages ..]       rows     u16 pc_low | u8 cfa_kind | u8 fp_kind | u16 cfa_off | s16 fp_off
//! ```
//!
//! A page holds fewer than 4,096 rows, so the search inside it takes at most 12 steps. An
//! address before the first row of its page is governed by the row before (the previous page's
//! last row): rows only mark where a rule starts. Addresses before the first page or after the
//! last have no FDE.

use crate::elf::{CfiKind, ExeId};
use crate::error::UnwindError;
use crate::rule::{Cfa, Fp, Rule, Unsupported};

/// Bits of an address inside one page of the directory. Small pages keep the BPF search short:
/// each of its steps is a helper call, the dearest part of a frame on hosts whose kernels
/// mitigate return-stack attacks.
pub const PAGE_BITS: u32 = 12;
/// The most rows one page can hold (the BPF search does at most 12 steps).
pub const MAX_ROWS_PER_PAGE: u32 = (1 << PAGE_BITS) - 1;
/// Steps of the binary search inside a page, for [`MAX_ROWS_PER_PAGE`] rows.
pub const SEARCH_STEPS: u32 = PAGE_BITS;

/// Caps on a table, checked before anything of that size is allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Rows in one table. Default 8,000,000 (64 MiB): the largest executable measured on
    /// Debian, `librustc_driver`, has 1.15M rows (`unwinding-offcpu-python.md` §1.4).
    pub max_rows: u32,
    /// Pages of the directory, i.e. the span of code in 4 KiB units. Default 1,048,576 (4 GiB
    /// of code, an 8 MiB directory).
    pub max_pages: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_rows: 8_000_000,
            max_pages: 1 << 20,
        }
    }
}

/// What the builder found, per table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Where the rows came from; `None` only for tables not built by this crate.
    pub cfi: Option<CfiKind>,
    /// FDEs read.
    pub fdes: u64,
    /// FDEs left out: empty, overlapping an earlier one, or failing to parse.
    pub fdes_skipped: u64,
    /// FDEs of signal trampolines (CIE augmentation `S`).
    pub signal_fdes: u64,
    /// Rows the call-frame information describes, before compaction.
    pub cfi_rows: u64,
    /// Rows in the table (with end-of-FDE markers, after compaction).
    pub rows: u64,
    /// CFI rows whose caller `rbp` cannot be recovered ([`Fp::Lost`](crate::Fp::Lost)).
    pub fp_lost: u64,
    /// CFI rows the unwinder does not compute, per [`Unsupported`] reason (indexed by
    /// `reason as usize - 1`).
    pub unsupported: [u64; 4],
}

impl Stats {
    /// CFI rows unsupported for `reason`.
    pub fn unsupported(&self, reason: Unsupported) -> u64 {
        self.unsupported[reason as usize - 1]
    }

    pub(crate) fn count_unsupported(&mut self, reason: Unsupported) {
        self.unsupported[reason as usize - 1] += 1;
    }
}

/// One executable's unwind table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnwindTable {
    id: ExeId,
    entries: Vec<u64>,
    stats: Stats,
}

impl UnwindTable {
    /// Makes a table from rows at strictly increasing addresses (ELF virtual addresses), as
    /// [`build`](crate::build) produces them; `stats.rows` is set to the row count.
    ///
    /// # Errors
    ///
    /// [`UnwindError::NoCfi`] for no rows, [`UnwindError::Malformed`] for addresses out of
    /// order or rules a row cannot hold, [`UnwindError::TooLarge`] past `limits` or past 4,095
    /// rows in one 4 KiB page.
    pub fn from_rows(
        id: ExeId,
        rows: &[(u64, Rule)],
        mut stats: Stats,
        limits: &Limits,
    ) -> Result<UnwindTable, UnwindError> {
        let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
            return Err(UnwindError::NoCfi);
        };
        if let Some(i) = rows.windows(2).position(|w| w[0].0 >= w[1].0) {
            return Err(UnwindError::Malformed {
                reason: format!(
                    "row {}: address {:#x} not above the previous row's",
                    i + 1,
                    rows[i + 1].0
                ),
            });
        }
        if let Some((pc, rule)) = rows.iter().find(|(_, rule)| {
            matches!(rule, Rule::Frame { cfa, .. } if !cfa.fits())
                || matches!(rule, Rule::Frame { cfa: Cfa::DerefRsp { .. }, fp } if *fp != Fp::Same)
        }) {
            return Err(UnwindError::Malformed {
                reason: format!("{pc:#x}: a row cannot hold {rule:?}"),
            });
        }
        check_limit("rows", rows.len() as u64, u64::from(limits.max_rows))?;
        let first_page = first.0 >> PAGE_BITS;
        let last_page = last.0 >> PAGE_BITS;
        check_limit("highest page", last_page, u64::from(u32::MAX))?;
        let n_pages = last_page - first_page + 1;
        check_limit("pages", n_pages, u64::from(limits.max_pages))?;

        let mut entries = Vec::with_capacity(1 + n_pages as usize + rows.len());
        entries.push(first_page | n_pages << 32);
        let mut index = 0usize;
        for page in first_page..=last_page {
            let lo = index;
            while index < rows.len() && rows[index].0 >> PAGE_BITS == page {
                index += 1;
            }
            check_limit(
                "rows in one 4 KiB page",
                (index - lo) as u64,
                MAX_ROWS_PER_PAGE.into(),
            )?;
            entries.push(lo as u64 | (index as u64) << 32);
        }
        entries.extend(rows.iter().map(|&(pc, rule)| rule.encode(page_offset(pc))));
        stats.rows = rows.len() as u64;
        let table = UnwindTable { id, entries, stats };
        table.validate()?;
        Ok(table)
    }

    /// Makes a table from its entries, validating every invariant the BPF side relies on.
    ///
    /// # Errors
    ///
    /// [`UnwindError::Malformed`] naming the first broken invariant.
    pub fn from_entries(
        id: ExeId,
        entries: Vec<u64>,
        stats: Stats,
    ) -> Result<UnwindTable, UnwindError> {
        let table = UnwindTable { id, entries, stats };
        table.validate()?;
        Ok(table)
    }

    /// The executable's identity.
    pub fn id(&self) -> &ExeId {
        &self.id
    }

    /// Header, page directory and rows, as the BPF inner array holds them.
    pub fn entries(&self) -> &[u64] {
        &self.entries
    }

    /// What the builder found.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The first page (address >> 12) the directory covers.
    pub fn first_page(&self) -> u32 {
        self.entries[0] as u32
    }

    /// Pages in the directory.
    pub fn n_pages(&self) -> u32 {
        (self.entries[0] >> 32) as u32
    }

    /// Rows in the table.
    pub fn n_rows(&self) -> usize {
        self.entries.len() - 1 - self.n_pages() as usize
    }

    /// Bytes the table takes in a BPF array.
    pub fn size_bytes(&self) -> usize {
        self.entries.len() * 8
    }

    /// The rule at an ELF virtual address, found as the BPF unwinder finds it: page directory,
    /// then at most [`SEARCH_STEPS`] steps of binary search.
    pub fn lookup(&self, address: u64) -> Rule {
        self.lookup_index(address)
            .map(|i| self.row(i).1)
            .unwrap_or(Rule::NoFde)
    }

    /// The index of the row governing `address`, if any.
    fn lookup_index(&self, address: u64) -> Option<usize> {
        let page = address >> PAGE_BITS;
        let first_page = u64::from(self.first_page());
        if page < first_page {
            return None;
        }
        let offset = page - first_page;
        if offset >= u64::from(self.n_pages()) {
            // Past the last page: the builder's last row is an end-of-FDE marker.
            return None;
        }
        let offset = offset as usize;
        let dir = self.entries[1 + offset];
        let (mut lo, mut hi) = ((dir as u32) as usize, (dir >> 32) as usize);
        let low = page_offset(address);
        // The first row whose pc_low is above the address; the row before it governs.
        for _ in 0..SEARCH_STEPS {
            if lo >= hi {
                break;
            }
            let mid = lo + (hi - lo) / 2;
            if self.row(mid).0 <= low {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo.checked_sub(1)
    }

    /// Row `index`: its `pc_low` and rule. Valid tables only hold valid rows.
    fn row(&self, index: usize) -> (u16, Rule) {
        let raw = self.entries[1 + self.n_pages() as usize + index];
        Rule::decode(raw).expect("validated tables hold valid rows")
    }

    /// Every row with its full address, in address order.
    pub fn rows(&self) -> impl Iterator<Item = (u64, Rule)> + '_ {
        let first_page = u64::from(self.first_page());
        (0..self.n_pages() as usize).flat_map(move |page| {
            let dir = self.entries[1 + page];
            let (lo, hi) = ((dir as u32) as usize, (dir >> 32) as usize);
            (lo..hi).map(move |i| {
                let (low, rule) = self.row(i);
                (
                    (first_page + page as u64) << PAGE_BITS | u64::from(low),
                    rule,
                )
            })
        })
    }

    /// Checks the invariants of the layout.
    fn validate(&self) -> Result<(), UnwindError> {
        let malformed = |reason: String| Err(UnwindError::Malformed { reason });
        let Some(&header) = self.entries.first() else {
            return malformed("no header".into());
        };
        let (first_page, n_pages) = (header as u32, (header >> 32) as u32);
        if n_pages == 0 {
            return malformed("no pages".into());
        }
        if u64::from(first_page) + u64::from(n_pages) > 1 << 32 {
            return malformed(format!("pages {first_page}+{n_pages} overflow"));
        }
        let rows_start = 1 + n_pages as usize;
        if self.entries.len() <= rows_start {
            return malformed(format!(
                "{} entries, fewer than a header, {n_pages} pages and a row",
                self.entries.len()
            ));
        }
        let n_rows = self.entries.len() - rows_start;
        let mut expected_lo = 0usize;
        for page in 0..n_pages as usize {
            let dir = self.entries[1 + page];
            let (lo, hi) = ((dir as u32) as usize, (dir >> 32) as usize);
            if lo != expected_lo || hi < lo || hi > n_rows {
                return malformed(format!(
                    "page {page}: rows {lo}..{hi} (expected from {expected_lo}, {n_rows} rows)"
                ));
            }
            if hi - lo > MAX_ROWS_PER_PAGE as usize {
                return malformed(format!("page {page}: {} rows", hi - lo));
            }
            let mut previous = None;
            for i in lo..hi {
                let raw = self.entries[rows_start + i];
                let (low, _) = Rule::decode(raw).map_err(|err| UnwindError::Malformed {
                    reason: format!("row {i}: {err}"),
                })?;
                if u32::from(low) >> PAGE_BITS != 0 {
                    return malformed(format!("row {i}: offset {low:#x} outside its page"));
                }
                if previous.is_some_and(|p| p >= low) {
                    return malformed(format!("row {i}: address not above the previous row's"));
                }
                previous = Some(low);
            }
            expected_lo = hi;
        }
        if expected_lo != n_rows {
            return malformed(format!("pages cover {expected_lo} of {n_rows} rows"));
        }
        Ok(())
    }
}

/// An address's offset inside its page, as a row's `pc_low` holds it.
fn page_offset(address: u64) -> u16 {
    (address & ((1 << PAGE_BITS) - 1)) as u16
}

pub(crate) fn check_limit(what: &'static str, value: u64, limit: u64) -> Result<(), UnwindError> {
    if value > limit {
        return Err(UnwindError::TooLarge { what, value, limit });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> ExeId {
        ExeId::BuildId(vec![1, 2, 3], [0; 16])
    }

    const A: Rule = Rule::Frame {
        cfa: Cfa::Rsp(8),
        fp: Fp::Same,
    };
    const B: Rule = Rule::Frame {
        cfa: Cfa::Rsp(16),
        fp: Fp::Same,
    };

    #[test]
    fn lookup_across_pages() {
        let rows = [
            (0x1_0010, A),
            (0x1_0020, B),
            (0x3_0000, Rule::NoFde),
            (0x3_0100, A),
            (0x3_0200, Rule::NoFde),
        ];
        let table =
            UnwindTable::from_rows(id(), &rows, Stats::default(), &Limits::default()).unwrap();
        assert_eq!(table.first_page(), 0x10);
        assert_eq!(table.n_pages(), 0x21);
        assert_eq!(table.lookup(0x1_000f), Rule::NoFde);
        assert_eq!(table.lookup(0x1_0010), A);
        assert_eq!(table.lookup(0x1_001f), A);
        assert_eq!(table.lookup(0x1_0020), B);
        // Pages 0x11 to 0x2f hold no row: the last row of page 0x10 governs them.
        assert_eq!(table.lookup(0x2_1234), B);
        assert_eq!(table.lookup(0x3_0000), Rule::NoFde);
        assert_eq!(table.lookup(0x3_0150), A);
        assert_eq!(table.lookup(0x3_0200), Rule::NoFde);
        assert_eq!(table.lookup(0x9_0000), Rule::NoFde);
        assert_eq!(table.lookup(0), Rule::NoFde);
        assert_eq!(table.rows().collect::<Vec<_>>(), rows);
    }

    #[test]
    fn a_full_page_needs_at_most_twelve_steps() {
        let rows: Vec<(u64, Rule)> = (0..MAX_ROWS_PER_PAGE as u64)
            .map(|i| (0x5_0000 + i, if i % 2 == 0 { A } else { B }))
            .collect();
        let table =
            UnwindTable::from_rows(id(), &rows, Stats::default(), &Limits::default()).unwrap();
        for (pc, rule) in rows.iter().step_by(97).chain(rows.last()) {
            assert_eq!(table.lookup(*pc), *rule, "{pc:#x}");
        }
        let mut too_many = rows.clone();
        too_many.push((0x5_0fff, A));
        assert!(matches!(
            UnwindTable::from_rows(id(), &too_many, Stats::default(), &Limits::default()),
            Err(UnwindError::TooLarge { .. })
        ));
    }

    #[test]
    fn broken_layouts_are_rejected() {
        let rows = [(0x1_0010, A), (0x2_0020, B)];
        let table =
            UnwindTable::from_rows(id(), &rows, Stats::default(), &Limits::default()).unwrap();
        let good = table.entries().to_vec();
        let mut bad = vec![];
        bad.push(vec![]);
        let mut e = good.clone();
        e[0] = 1; // zero pages
        bad.push(e);
        let mut e = good.clone();
        e[1] = 1 << 32 | 1; // page 0 does not start at row 0
        bad.push(e);
        let mut e = good.clone();
        e[3] = A.encode(0x10) | 1 << 63; // stray bits
        bad.push(e);
        let mut e = good.clone();
        e.pop(); // a row missing
        bad.push(e);
        for entries in bad {
            assert!(
                UnwindTable::from_entries(id(), entries.clone(), Stats::default()).is_err(),
                "{entries:x?}"
            );
        }
        assert!(UnwindTable::from_entries(id(), good, Stats::default()).is_ok());
    }
}
