//! The ELF around the call-frame information: where `.eh_frame` or `.debug_frame` is, what the
//! executable is called (its [`ExeId`]), how it is laid out in memory.
//!
//! Input: the bytes of an ELF file (a mapped file, a debug file, the vDSO copied out of memory).
//! Output: an [`Elf`] that finds the CFI sections (also in a sectionless ELF, through
//! `PT_GNU_EH_FRAME`), names the executable, and turns a mapping into a load bias. Owns nothing
//! but borrowed bytes and, for a compressed `.debug_frame`, the decompressed copy.

use std::borrow::Cow;
use std::fmt;
use std::io::Read as _;
use std::sync::OnceLock;

use object::elf;
use object::read::elf::{ElfFile64, FileHeader as _, ProgramHeader as _};
use object::{Endianness, Object as _, ObjectSection as _, ObjectSymbol as _};
use sha2::{Digest as _, Sha256};

use crate::error::UnwindError;

/// The longest build id kept; GNU ld writes 20 bytes (SHA-1), some linkers 16 or 32.
pub const MAX_BUILD_ID: usize = 64;

/// Largest `.debug_frame` decompressed, so that a hostile size field allocates nothing.
const MAX_DECOMPRESSED: u64 = 256 << 20;

/// Bytes of a [`ExeId::BuildId`]'s source digest.
pub(crate) const SOURCE_DIGEST: usize = 16;

/// The identity of an executable: the table built from one file is valid for every file with
/// the same identity.
///
/// A build id alone is not enough: anyone can write a file with libc's build id and garbage
/// call-frame information, and the table built from it would serve every process mapping the
/// real libc (and be cached on disk). So the build id goes with a digest of everything a table
/// is built from.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ExeId {
    /// The GNU build id note (1 to [`MAX_BUILD_ID`] bytes) and the first [`SOURCE_DIGEST`]
    /// bytes of the SHA-256 of what the table is built from: the CFI sections' bytes and
    /// addresses, the `PT_LOAD` segments, `.text`, and a Go binary's symbols the builder reads.
    BuildId(Vec<u8>, [u8; SOURCE_DIGEST]),
    /// SHA-256 of the whole file, for files without a build id.
    ContentHash([u8; 32]),
}

impl fmt::Display for ExeId {
    /// Lowercase hex, the build id then `-` and the source digest; content hashes prefixed
    /// `sha256-`: usable as a file name.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = |f: &mut fmt::Formatter<'_>, bytes: &[u8]| {
            bytes.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
        };
        match self {
            ExeId::BuildId(id, source) => {
                hex(f, id)?;
                f.write_str("-")?;
                hex(f, source)
            }
            ExeId::ContentHash(hash) => {
                f.write_str("sha256-")?;
                hex(f, hash)
            }
        }
    }
}

/// Which call-frame information a table was built from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CfiKind {
    /// `.eh_frame` (found by section name or through `PT_GNU_EH_FRAME`).
    EhFrame,
    /// `.debug_frame` (of the file itself or of its separate debug file).
    DebugFrame,
    /// A Go binary: frame-pointer rows synthesized over its text, with end-of-stack rows for the
    /// goroutine and thread entry functions.
    GoFramePointers,
}

impl CfiKind {
    /// The kind's code in the cache format.
    pub(crate) fn code(self) -> u64 {
        match self {
            CfiKind::EhFrame => 1,
            CfiKind::DebugFrame => 2,
            CfiKind::GoFramePointers => 3,
        }
    }

    /// The kind with this cache code.
    pub(crate) fn from_code(code: u64) -> Option<CfiKind> {
        [
            CfiKind::EhFrame,
            CfiKind::DebugFrame,
            CfiKind::GoFramePointers,
        ]
        .into_iter()
        .find(|k| k.code() == code)
    }
}

/// One `PT_LOAD` segment: where its bytes are in the file and in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadSegment {
    /// `p_offset`.
    pub offset: u64,
    /// `p_vaddr`.
    pub vaddr: u64,
    /// `p_filesz`.
    pub file_size: u64,
    /// `p_flags` (`PF_X` = 1, `PF_W` = 2, `PF_R` = 4).
    pub flags: u32,
}

impl LoadSegment {
    /// Whether the segment is executable (`PF_X`).
    pub fn is_executable(&self) -> bool {
        self.flags & elf::PF_X != 0
    }
}

/// The loadable segments of an ELF file, which turn a mapping into a load bias.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    /// The `PT_LOAD` segments, in file order.
    pub segments: Vec<LoadSegment>,
}

impl Layout {
    /// The load bias of a mapping that starts at `start` with file offset `offset`; see
    /// [`Elf::bias`].
    ///
    /// The mapping belongs to the segment that starts in its first page: the kernel maps each
    /// segment from the page holding its first byte. Linkers that do not pad segments to pages
    /// (lld, `-z noseparate-code`) put the end of one segment and the start of the next in one
    /// page, and the two can have different address deltas, so containment alone is ambiguous;
    /// it decides only for a mapping that starts inside a segment (one split by `mprotect`),
    /// where the latest segment starting at or before the offset is the one. Two small segments
    /// can even start in the same page (lld: read-only data of 0x5a0 bytes at offset 0, text at
    /// offset 0x5a0); the mappings asked about are executable ones (the unwinder and the
    /// symbolizer keep no other), so the executable segment (`PF_X`) is preferred.
    pub fn bias(&self, start: u64, offset: u64) -> Option<u64> {
        // A mapping starts page-aligned, at or before the segment's first byte.
        const PAGE: u64 = 4096;
        let contains = |segment: &&LoadSegment| {
            segment
                .offset
                .checked_add(segment.file_size)
                .is_some_and(|end| offset >= segment.offset & !(PAGE - 1) && offset < end)
        };
        let starting_here = || {
            self.segments
                .iter()
                .filter(contains)
                .filter(|segment| segment.offset & !(PAGE - 1) == offset)
        };
        let segment = starting_here()
            .find(|segment| segment.is_executable())
            .or_else(|| starting_here().next())
            .or_else(|| {
                self.segments
                    .iter()
                    .filter(contains)
                    .filter(|segment| segment.offset & !(PAGE - 1) <= offset)
                    .max_by_key(|segment| segment.offset)
            })?;
        Some(
            start
                .wrapping_sub(offset)
                .wrapping_sub(segment.vaddr.wrapping_sub(segment.offset)),
        )
    }

    /// The virtual address of a file offset, through the loadable segment holding it.
    pub fn virtual_address(&self, offset: u64) -> Option<u64> {
        self.segments.iter().find_map(|segment| {
            let end = segment.offset.checked_add(segment.file_size)?;
            (offset >= segment.offset && offset < end)
                .then(|| offset - segment.offset + segment.vaddr)
        })
    }
}

/// Call-frame information found in a file: the section bytes and the virtual address they
/// would be loaded at (pc-relative pointers in `.eh_frame` are relative to it).
pub(crate) struct Cfi<'data> {
    pub(crate) kind: CfiKind,
    pub(crate) data: Cow<'data, [u8]>,
    pub(crate) address: u64,
}

/// A parsed x86-64 ELF file.
pub struct Elf<'data> {
    data: &'data [u8],
    file: ElfFile64<'data, Endianness>,
    /// [`Elf::id`], computed once: it hashes the call-frame information.
    id: OnceLock<ExeId>,
}

impl<'data> Elf<'data> {
    /// Parses an ELF file.
    ///
    /// # Errors
    ///
    /// [`UnwindError::Elf`] when the bytes are not a 64-bit little-endian ELF file for x86-64.
    pub fn parse(data: &'data [u8]) -> Result<Elf<'data>, UnwindError> {
        let file = ElfFile64::<Endianness>::parse(data).map_err(|err| UnwindError::Elf {
            reason: err.to_string(),
        })?;
        let endian = file.endian();
        let header = file.elf_header();
        if endian != Endianness::Little || header.e_machine(endian) != elf::EM_X86_64 {
            return Err(UnwindError::Elf {
                reason: format!(
                    "machine {} ({:?}), only little-endian x86-64 is supported",
                    header.e_machine(endian),
                    endian
                ),
            });
        }
        Ok(Elf {
            data,
            file,
            id: OnceLock::new(),
        })
    }

    /// The file's identity: its GNU build id with the digest of its table's sources, else the
    /// SHA-256 of its bytes.
    pub fn id(&self) -> ExeId {
        self.id
            .get_or_init(|| match self.build_id() {
                Some(id) => ExeId::BuildId(id.to_vec(), self.source_digest()),
                None => ExeId::ContentHash(Sha256::digest(self.data).into()),
            })
            .clone()
    }

    /// The digest of what [`crate::build`] reads of this file (see [`ExeId::BuildId`]); each
    /// part length-prefixed, so that no two files' parts run together alike.
    fn source_digest(&self) -> [u8; SOURCE_DIGEST] {
        let mut hash = Sha256::new();
        let mut part = |tag: &[u8], address: u64, bytes: &[u8]| {
            hash.update(tag);
            hash.update(address.to_le_bytes());
            hash.update((bytes.len() as u64).to_le_bytes());
            hash.update(bytes);
        };
        if let Some(cfi) = self.eh_frame() {
            part(b"eh_frame", cfi.address, &cfi.data);
        }
        if let Some(section) = self.file.section_by_name(".debug_frame") {
            part(
                b"debug_frame",
                section.address(),
                section.data().unwrap_or_default(),
            );
        }
        let endian = self.file.endian();
        for ph in self.file.elf_program_headers() {
            if ph.p_type(endian) == elf::PT_LOAD {
                let fields = [
                    ph.p_offset(endian),
                    ph.p_vaddr(endian),
                    ph.p_filesz(endian),
                    u64::from(ph.p_flags(endian)),
                ];
                part(b"load", 0, &fields.map(u64::to_le_bytes).concat());
            }
        }
        if let Some((start, end)) = self.text() {
            part(b"text", start, &end.to_le_bytes());
        }
        if self.is_go() {
            for name in crate::build::GO_SYMBOLS {
                let (address, size) = self.symbol(name).unwrap_or_default();
                part(name.as_bytes(), address, &size.to_le_bytes());
            }
        }
        let digest = hash.finalize();
        let mut out = [0; SOURCE_DIGEST];
        out.copy_from_slice(&digest[..SOURCE_DIGEST]);
        out
    }

    /// The GNU build id, if the file has one of a sane length.
    pub fn build_id(&self) -> Option<&'data [u8]> {
        let id = self.file.build_id().ok().flatten()?;
        (!id.is_empty() && id.len() <= MAX_BUILD_ID).then_some(id)
    }

    /// The `.gnu_debuglink` file name and CRC, where gdb looks for a separate debug file.
    pub fn debug_link(&self) -> Option<(&'data [u8], u32)> {
        self.file.gnu_debuglink().ok().flatten()
    }

    /// Whether a Go toolchain linked the file (it has Go's build id note or build info).
    pub fn is_go(&self) -> bool {
        self.section_data(".note.go.buildid").is_some()
            || self.section_data(".go.buildinfo").is_some()
    }

    /// The address and size of a function symbol (`.symtab`, then `.dynsym`); the first match.
    pub fn symbol(&self, name: &str) -> Option<(u64, u64)> {
        self.file
            .symbols()
            .chain(self.file.dynamic_symbols())
            .find(|sym| sym.name_bytes().ok() == Some(name.as_bytes()) && sym.address() != 0)
            .map(|sym| (sym.address(), sym.size()))
    }

    /// Whether the file has a symbol table (`.symtab`) with function symbols: unstripped, or a
    /// separate debug file. A stripped file has at most `.dynsym`, its exported functions.
    pub fn has_symbol_table(&self) -> bool {
        self.file
            .symbols()
            .any(|sym| sym.kind() == object::SymbolKind::Text && sym.address() != 0)
    }

    /// The `[start, end)` virtual addresses of the `.text` section.
    pub fn text(&self) -> Option<(u64, u64)> {
        let text = self.file.section_by_name(".text")?;
        Some((text.address(), text.address().checked_add(text.size())?))
    }

    /// The load bias of a mapping: what to subtract from a runtime address in a mapping of this
    /// file that starts at `start` with file offset `offset` (as `/proc/PID/maps` gives them) to
    /// get the ELF virtual address the table uses. `None` when no loadable segment holds
    /// `offset`.
    pub fn bias(&self, start: u64, offset: u64) -> Option<u64> {
        self.layout().bias(start, offset)
    }

    /// The file's loadable segments: what [`Elf::bias`] needs, kept without the file.
    pub fn layout(&self) -> Layout {
        let endian = self.file.endian();
        let segments = self
            .file
            .elf_program_headers()
            .iter()
            .filter(|ph| ph.p_type(endian) == elf::PT_LOAD)
            .map(|ph| LoadSegment {
                offset: ph.p_offset(endian),
                vaddr: ph.p_vaddr(endian),
                file_size: ph.p_filesz(endian),
                flags: ph.p_flags(endian),
            })
            .collect();
        Layout { segments }
    }

    fn section_data(&self, name: &str) -> Option<(u64, &'data [u8])> {
        let section = self.file.section_by_name(name)?;
        if section.kind() == object::SectionKind::UninitializedData {
            return None;
        }
        let data = section.data().ok()?;
        (!data.is_empty()).then_some((section.address(), data))
    }

    /// `.eh_frame`, by section or else through `PT_GNU_EH_FRAME`, if it has any entry.
    pub(crate) fn eh_frame(&self) -> Option<Cfi<'data>> {
        let (address, data) = match self.section_data(".eh_frame") {
            Some(found) => found,
            None => self.eh_frame_from_segments()?,
        };
        // A lone terminator (4 zero bytes) is as good as none: debug files keep the header.
        (data.len() > 4).then_some(Cfi {
            kind: CfiKind::EhFrame,
            data: Cow::Borrowed(data),
            address,
        })
    }

    /// `.eh_frame` of a file without section headers: `PT_GNU_EH_FRAME` holds `.eh_frame_hdr`,
    /// whose first pointer is `.eh_frame`'s address; the section runs to the end of the loadable
    /// segment holding it (its zero terminator ends the parse earlier).
    fn eh_frame_from_segments(&self) -> Option<(u64, &'data [u8])> {
        let endian = self.file.endian();
        let headers = self.file.elf_program_headers();
        let hdr = headers
            .iter()
            .find(|ph| ph.p_type(endian) == elf::PT_GNU_EH_FRAME)?;
        let hdr_data = hdr.data(endian, self.data).ok()?;
        let hdr_address = hdr.p_vaddr(endian);
        let bases = gimli::BaseAddresses::default().set_eh_frame_hdr(hdr_address);
        let parsed = gimli::EhFrameHdr::new(hdr_data, gimli::LittleEndian)
            .parse(&bases, 8)
            .ok()?;
        let gimli::Pointer::Direct(address) = parsed.eh_frame_ptr() else {
            return None;
        };
        headers.iter().find_map(|ph| {
            let (vaddr, filesz) = (ph.p_vaddr(endian), ph.p_filesz(endian));
            if ph.p_type(endian) != elf::PT_LOAD || address < vaddr || address >= vaddr + filesz {
                return None;
            }
            let segment = ph.data(endian, self.data).ok()?;
            let start = usize::try_from(address - vaddr).ok()?;
            Some((address, segment.get(start..)?))
        })
    }

    /// `.debug_frame`, decompressed.
    ///
    /// # Errors
    ///
    /// [`UnwindError::Compressed`] when it is compressed in a format other than zlib or does not
    /// decompress.
    pub(crate) fn debug_frame(&self) -> Result<Option<Cfi<'data>>, UnwindError> {
        let Some(section) = self.file.section_by_name(".debug_frame") else {
            return Ok(None);
        };
        if section.kind() == object::SectionKind::UninitializedData {
            return Ok(None);
        }
        let compressed = section
            .compressed_data()
            .map_err(|err| UnwindError::Compressed {
                reason: err.to_string(),
            })?;
        let data = match compressed.format {
            object::CompressionFormat::None => Cow::Borrowed(compressed.data),
            object::CompressionFormat::Zlib => {
                if compressed.uncompressed_size > MAX_DECOMPRESSED {
                    return Err(UnwindError::Compressed {
                        reason: format!(
                            "{} bytes decompressed, more than the cap of {MAX_DECOMPRESSED}",
                            compressed.uncompressed_size
                        ),
                    });
                }
                let mut out = Vec::with_capacity(compressed.uncompressed_size as usize);
                flate2::read::ZlibDecoder::new(compressed.data)
                    .take(compressed.uncompressed_size)
                    .read_to_end(&mut out)
                    .map_err(|err| UnwindError::Compressed {
                        reason: err.to_string(),
                    })?;
                Cow::Owned(out)
            }
            other => {
                return Err(UnwindError::Compressed {
                    reason: format!("{other:?} compression is not supported (only zlib)"),
                });
            }
        };
        if data.is_empty() {
            return Ok(None);
        }
        Ok(Some(Cfi {
            kind: CfiKind::DebugFrame,
            data,
            address: section.address(),
        }))
    }
}
