//! ELF inputs other than a plain shared library: a file without section headers, code with only
//! `.debug_frame` (in the file and in a separate debug file), the vDSO read out of our own
//! memory, a Go binary.

use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::Path;
use std::process::Command;

use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
use smolder_unwind::{Cfa, CfiKind, Elf, ExeId, Fp, Limits, Rule, UnwindError, UnwindTable};

use crate::util::{gcc, table_of};

fn build(bytes: &[u8], debug: Option<&[u8]>) -> Result<UnwindTable, UnwindError> {
    let elf = Elf::parse(bytes)?;
    let debug = debug.map(Elf::parse).transpose()?;
    smolder_unwind::build(&elf, debug.as_ref(), &Limits::default())
}

fn section_offset(bytes: &[u8], name: &str) -> usize {
    let file = object::File::parse(bytes).unwrap();
    let (offset, _) = file.section_by_name(name).unwrap().file_range().unwrap();
    usize::try_from(offset).unwrap()
}

fn symbol(bytes: &[u8], name: &str) -> u64 {
    let file = object::File::parse(bytes).unwrap();
    file.symbols()
        .find(|s| s.name() == Ok(name))
        .unwrap_or_else(|| panic!("no symbol {name}"))
        .address()
}

#[test]
fn sectionless_elf_finds_eh_frame_through_its_program_headers() {
    let path = Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6");
    let mut bytes = std::fs::read(path).unwrap();
    let table = build(&bytes, None).unwrap();
    // e_shoff (0x28, 8 bytes), e_shnum (0x3c) and e_shstrndx (0x3e) = 0: no section headers.
    bytes[0x28..0x30].fill(0);
    bytes[0x3c..0x40].fill(0);
    let sectionless = build(&bytes, None).unwrap();
    let (ExeId::BuildId(id, _), ExeId::BuildId(sectionless_id, _)) = (table.id(), sectionless.id())
    else {
        panic!("the build id note is in PT_NOTE");
    };
    assert_eq!(sectionless_id, id);
    assert_eq!(sectionless.entries(), table.entries());
}

#[test]
fn a_file_with_anothers_build_id_but_other_cfi_has_another_identity() {
    let path = Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6");
    let bytes = std::fs::read(path).unwrap();
    let real = Elf::parse(&bytes).unwrap();
    let eh_frame = section_offset(&bytes, ".eh_frame");
    // A user's copy of libc with its build id and one byte of `.eh_frame` changed: its table
    // must not be the one every process mapping the real libc gets.
    let mut forged = bytes.clone();
    forged[eh_frame + 64] ^= 0xff;
    let forged = Elf::parse(&forged).unwrap();
    assert_eq!(forged.build_id(), real.build_id());
    assert_ne!(forged.id(), real.id());
    // Also when only the layout differs: a segment's address moved.
    let mut moved = bytes.clone();
    let phoff = usize::try_from(u64::from_le_bytes(moved[0x20..0x28].try_into().unwrap())).unwrap();
    let phentsize = usize::from(u16::from_le_bytes([moved[0x36], moved[0x37]]));
    let load = (0..usize::from(u16::from_le_bytes([moved[0x38], moved[0x39]])))
        .map(|i| phoff + i * phentsize)
        .find(|&ph| moved[ph..ph + 4] == 1u32.to_le_bytes())
        .unwrap();
    moved[load + 0x10] ^= 0x10; // p_vaddr
    assert_ne!(Elf::parse(&moved).unwrap().id(), real.id());
    // The same bytes: the same identity.
    assert_eq!(Elf::parse(&bytes).unwrap().id(), real.id());
}

#[test]
fn debug_frame_in_the_file_and_in_a_separate_debug_file() {
    let dir = tempfile::tempdir().unwrap();
    let source = "__attribute__((noinline)) int work(int x) { volatile int y = x; return y * 3; }\n\
                  int main(int argc, char **argv) { (void)argv; return work(argc) + 1; }\n";
    // No unwind tables of its own: only .debug_frame, next to the C runtime's .eh_frame.
    let binary = gcc(
        dir.path(),
        "debugframe",
        source,
        &[
            "-O2",
            "-g",
            "-fno-asynchronous-unwind-tables",
            "-fno-unwind-tables",
        ],
    );
    let bytes = std::fs::read(&binary).unwrap();
    let work = symbol(&bytes, "work");
    let full = build(&bytes, None).unwrap();
    assert_eq!(
        full.lookup(work),
        Rule::Frame {
            cfa: Cfa::Rsp(8),
            fp: Fp::Same
        }
    );
    assert_eq!(
        full.stats().cfi,
        Some(CfiKind::EhFrame),
        "crt1's _start has .eh_frame"
    );

    // Split the debug information off, as Debian's -dbgsym packages do (compressed sections).
    let debug = dir.path().join("debugframe.debug");
    let run = |args: &[&str]| {
        let status = Command::new(args[0]).args(&args[1..]).status().unwrap();
        assert!(status.success(), "{args:?}");
    };
    let (bin, dbg) = (binary.to_str().unwrap(), debug.to_str().unwrap());
    run(&[
        "objcopy",
        "--only-keep-debug",
        "--compress-debug-sections=zlib",
        bin,
        dbg,
    ]);
    run(&["strip", "--strip-debug", bin]);
    let stripped = std::fs::read(&binary).unwrap();
    let debug_bytes = std::fs::read(&debug).unwrap();
    assert_eq!(build(&stripped, None).unwrap().lookup(work), Rule::NoFde);
    let with_debug = build(&stripped, Some(&debug_bytes)).unwrap();
    assert_eq!(with_debug.lookup(work), full.lookup(work));
    assert_eq!(with_debug.entries(), full.entries());
}

#[test]
fn vdso_from_our_own_memory() {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let line = maps
        .lines()
        .find(|l| l.ends_with("[vdso]"))
        .expect("a vDSO mapping");
    let (start, end) = line
        .split_whitespace()
        .next()
        .unwrap()
        .split_once('-')
        .unwrap();
    let start = u64::from_str_radix(start, 16).unwrap();
    let end = u64::from_str_radix(end, 16).unwrap();
    let mut mem = std::fs::File::open("/proc/self/mem").unwrap();
    mem.seek(SeekFrom::Start(start)).unwrap();
    let mut bytes = vec![0; (end - start) as usize];
    mem.read_exact(&mut bytes).unwrap();
    let table = build(&bytes, None).unwrap();
    assert!(matches!(table.id(), ExeId::BuildId(..)));
    assert!(table.stats().fdes > 0, "{:?}", table.stats());
    assert_eq!(table.stats().unsupported, [0; 4]);
}

#[test]
fn go_binaries_get_frame_pointer_rows_and_stop_at_goexit() {
    if Command::new("go").arg("version").output().is_err() {
        panic!("go is missing: apt-get install golang-go (scripts/test installs it)");
    }
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("main.go");
    std::fs::write(&source, "package main\n\nfunc main() { println(\"hi\") }\n").unwrap();
    let binary = dir.path().join("gobin");
    let output = Command::new("go")
        .args(["build", "-o"])
        .arg(&binary)
        .arg(&source)
        .env("GO111MODULE", "off")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let bytes = std::fs::read(&binary).unwrap();
    let table = build(&bytes, None).unwrap();
    assert_eq!(table.stats().cfi, Some(CfiKind::GoFramePointers));
    let fp = Rule::Frame {
        cfa: Cfa::Rbp(16),
        fp: Fp::AtCfa(-16),
    };
    assert_eq!(table.lookup(symbol(&bytes, "main.main") + 4), fp);
    assert_eq!(
        table.lookup(symbol(&bytes, "runtime.goexit.abi0") + 1),
        Rule::End
    );
    assert_eq!(
        table.lookup(symbol(&bytes, "runtime.mstart.abi0")),
        Rule::End
    );
    // The scheduler's stack begins where a goroutine switches to it.
    for root in ["runtime.mcall", "runtime.morestack.abi0"] {
        assert_eq!(table.lookup(symbol(&bytes, root) + 1), Rule::End, "{root}");
    }
}

#[test]
fn files_without_call_frame_information_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let binary = gcc(
        dir.path(),
        "nocfi",
        "int main(void) { return 0; }\n",
        &[
            "-O2",
            "-nostartfiles",
            "-fno-asynchronous-unwind-tables",
            "-e",
            "main",
            "-static",
        ],
    );
    let bytes = std::fs::read(&binary).unwrap();
    assert!(matches!(build(&bytes, None), Err(UnwindError::NoCfi)));
    assert!(matches!(
        build(b"not an elf", None),
        Err(UnwindError::Elf { .. })
    ));
    // Our own executable is Rust: .eh_frame, a build id.
    let ours = table_of(Path::new("/proc/self/exe"));
    assert!(ours.stats().fdes > 100);
}

#[test]
fn a_table_past_the_row_limit_is_refused_as_it_is_read() {
    let bytes = std::fs::read("/usr/lib/x86_64-linux-gnu/libc.so.6").unwrap();
    let elf = Elf::parse(&bytes).unwrap();
    let rows = smolder_unwind::build(&elf, None, &Limits::default())
        .unwrap()
        .entries()
        .len();
    // A tenth of libc's rows: the read stops there, not once every row is in memory.
    let limits = Limits {
        max_rows: (rows / 10) as u32,
        ..Limits::default()
    };
    match smolder_unwind::build(&elf, None, &limits) {
        Err(UnwindError::TooLarge { what, value, limit }) => {
            assert_eq!((what, limit), ("rows", u64::from(limits.max_rows)));
            assert!(value < rows as u64 / 5, "{value} rows read of {rows}");
        }
        other => panic!("{other:?}"),
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Mangled ELF files (ld.so with bytes overwritten in its headers or call-frame
    /// information) give a table or an error, never a panic; a table that comes out is valid.
    #[test]
    fn mangled_elf_files_never_panic(
        edits in proptest::collection::vec((0.0f64..1.0, proptest::prelude::any::<u8>()), 1..16),
        in_headers in proptest::prelude::any::<bool>(),
    ) {
        let mut bytes = std::fs::read("/lib64/ld-linux-x86-64.so.2").unwrap();
        let file = object::File::parse(&bytes[..]).unwrap();
        let eh = object::ObjectSection::file_range(&object::Object::section_by_name(&file, ".eh_frame").unwrap()).unwrap();
        for (at, value) in edits {
            let (start, len) = if in_headers { (0, 0x40) } else { (eh.0 as usize, eh.1 as usize) };
            let i = start + ((len as f64 * at) as usize).min(len - 1);
            bytes[i] = value;
        }
        if let Ok(table) = build(&bytes, None) {
            let encoded = smolder_unwind::cache::encode(&table);
            proptest::prop_assert_eq!(smolder_unwind::cache::decode(&encoded, &Limits::default()).unwrap(), table);
        }
    }
}

#[test]
fn layout_maps_file_offsets_to_addresses_and_stripped_files_have_no_symbol_table() {
    let bytes = std::fs::read("/usr/lib/x86_64-linux-gnu/libc.so.6").unwrap();
    let elf = Elf::parse(&bytes).unwrap();
    // Debian strips libc to its dynamic symbols; libc6-dbg's debug file has the rest.
    assert!(!elf.has_symbol_table());
    let layout = elf.layout();
    let file = object::File::parse(&bytes[..]).unwrap();
    let text = file
        .dynamic_symbols()
        .find(|s| s.name() == Ok("qsort"))
        .unwrap()
        .address();
    // A text address's file offset, through the segment that holds it, and back.
    let segment = layout
        .segments
        .iter()
        .find(|s| text >= s.vaddr && text < s.vaddr + s.file_size)
        .unwrap();
    let offset = text - segment.vaddr + segment.offset;
    assert_eq!(layout.virtual_address(offset), Some(text));
    // Mapped at 0x7f00_0000_0000 from the segment's page: the bias takes the address back.
    let start = 0x7f00_0000_0000 + (segment.offset & !4095);
    let bias = layout.bias(start, segment.offset & !4095).unwrap();
    assert_eq!(elf.bias(start, segment.offset & !4095), Some(bias));
    assert_eq!(
        layout.virtual_address(offset),
        Some(start + (offset - (segment.offset & !4095)) - bias)
    );
    assert_eq!(layout.virtual_address(bytes.len() as u64 + 1), None);
    let own = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    assert!(Elf::parse(&own).unwrap().has_symbol_table());
}

#[test]
fn a_mapping_belongs_to_the_segment_that_starts_in_its_first_page() {
    // lld's layout: read-only data and text share a file page, with address deltas 0 and
    // 0x1000 (a Rust release binary's program headers).
    let layout = smolder_unwind::Layout {
        segments: vec![
            smolder_unwind::LoadSegment {
                offset: 0,
                vaddr: 0,
                file_size: 0x12ab0,
                flags: 4,
            },
            smolder_unwind::LoadSegment {
                offset: 0x12ab0,
                vaddr: 0x13ab0,
                file_size: 0x3e470,
                flags: 5,
            },
        ],
    };
    let start = 0x5580_0000_0000 + 0x13000;
    // The text mapping: file offset 0x12000, the page where the text segment starts.
    let bias = layout.bias(start, 0x12000).unwrap();
    assert_eq!(0x14960 + bias, start + 0x1960, "slow_cmp at vaddr 0x14960");
    // The read-only mapping at offset 0 is the first segment's.
    assert_eq!(layout.bias(0x5580_0000_0000, 0), Some(0x5580_0000_0000));
    // A mapping split inside the text segment is still the text segment's.
    assert_eq!(layout.bias(start + 0x10000, 0x22000), Some(bias));
}

/// A minimal x86-64 ELF file with only program headers: `(offset, vaddr, size, flags)` per
/// `PT_LOAD`.
fn elf_with_segments(segments: &[(u64, u64, u64, u32)]) -> Vec<u8> {
    let phoff = 64u64;
    let mut out = Vec::new();
    out.extend_from_slice(b"\x7fELF\x02\x01\x01\x00");
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(&3u16.to_le_bytes()); // ET_DYN
    out.extend_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes()); // e_entry
    out.extend_from_slice(&phoff.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes()); // e_shoff
    out.extend_from_slice(&0u32.to_le_bytes()); // e_flags
    out.extend_from_slice(&64u16.to_le_bytes()); // e_ehsize
    out.extend_from_slice(&56u16.to_le_bytes()); // e_phentsize
    out.extend_from_slice(&u16::try_from(segments.len()).unwrap().to_le_bytes());
    out.extend_from_slice(&64u16.to_le_bytes()); // e_shentsize
    out.extend_from_slice(&[0; 4]); // e_shnum, e_shstrndx
    for &(offset, vaddr, size, flags) in segments {
        out.extend_from_slice(&1u32.to_le_bytes()); // PT_LOAD
        out.extend_from_slice(&flags.to_le_bytes());
        for field in [offset, vaddr, vaddr, size, size, 0x1000] {
            out.extend_from_slice(&field.to_le_bytes());
        }
    }
    out.resize(0x2000, 0);
    out
}

#[test]
fn two_small_segments_in_one_page_take_the_executable_ones_bias() {
    // lld's small-binary layout: read-only data R at offset 0 (0x5a0 bytes, address delta 0),
    // text RX right after it in the same file page, at address 0x15a0 (delta 0x1000).
    let bytes = elf_with_segments(&[(0, 0, 0x5a0, 4), (0x5a0, 0x15a0, 0x100, 5)]);
    let elf = Elf::parse(&bytes).unwrap();
    let layout = elf.layout();
    assert!(layout.segments[1].is_executable() && !layout.segments[0].is_executable());
    // The kernel maps the text from file page 0 at load address + 0x1000.
    let base = 0x7f00_0000_0000;
    let bias = elf.bias(base + 0x1000, 0).unwrap();
    assert_eq!(bias, base, "text at vaddr 0x15a0 runs at base + 0x15a0");
    assert_eq!(0x15a0 + bias, base + 0x15a0);
}
