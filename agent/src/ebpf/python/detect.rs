//! Which processes run CPython, which release, and where its runtime state lives.
//!
//! Per binary ([`inspect`]): an x86-64 ELF file exporting `Py_Initialize` (its dynamic symbol
//! table, read in place from a mapping of the file) is a CPython interpreter, linked statically
//! (Debian's `/usr/bin/python3.11`) or as `libpython3.X.so` (`--enable-shared` builds,
//! virtualenvs, embedding programs). Its release is the exported `Py_Version` constant (3.11
//! and later), read from the file, never guessed from a name. 3.11
//! and 3.12 get the tables of [`Layout`]; 3.13 the `_Py_DebugOffsets` its `_PyRuntime`
//! initialiser holds, read from the file and checked. Anything else is an interpreter the walk
//! does not support ([`Unsupported`]): older (no `Py_Version`), newer, pre-releases of 3.11 and
//! 3.12, free-threaded builds, and processes linked against musl.
//!
//! Per process ([`Detector::process`]): the candidates are the main executable and the mapped
//! files named `libpython*`, opened through `/proc/PID/map_files` (which reaches into
//! containers and deleted files) or `/proc/PID/root`. Results are cached per binary (device and
//! inode), so a host running a thousand Pythons inspects each interpreter once.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use blazesym::Mmap;
use object::read::elf::ElfFile64;
use object::{Architecture, Endianness, Object, ObjectSegment, ObjectSymbol};

use super::PythonError;
use super::layout::{DEBUG_OFFSETS_WORDS, Layout};

/// A CPython release, as `PY_VERSION_HEX` writes it: `0x030b07f0` is 3.11.7 final.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PythonVersion(pub u32);

impl PythonVersion {
    /// The major version (3).
    pub fn major(self) -> u32 {
        self.0 >> 24
    }

    /// The minor version (11 for 3.11).
    pub fn minor(self) -> u32 {
        (self.0 >> 16) & 0xff
    }

    /// The micro version (7 for 3.11.7).
    pub fn micro(self) -> u32 {
        (self.0 >> 8) & 0xff
    }
}

impl fmt::Display for PythonVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major(), self.minor(), self.micro())?;
        let serial = self.0 & 0xf;
        match (self.0 >> 4) & 0xf {
            0xa => write!(f, "a{serial}"),
            0xb => write!(f, "b{serial}"),
            0xc => write!(f, "rc{serial}"),
            _ => Ok(()),
        }
    }
}

/// Why an interpreter is shown with native frames only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unsupported {
    /// Older than 3.11: no `Py_Version`, frames of another shape.
    Older,
    /// 3.14 or later: tagged frame references, not walked yet.
    Newer,
    /// A pre-release of 3.11 or 3.12, whose layout may differ from the final release's table.
    PreRelease,
    /// A free-threaded build (`3.13t`): other object headers, no GIL.
    FreeThreaded,
    /// Linked against musl: not tested.
    Musl,
    /// 3.13's `_Py_DebugOffsets` disagreed with the binary or itself.
    DebugOffsets,
}

impl Unsupported {
    /// The reason as a metric label value.
    pub fn reason(self) -> &'static str {
        match self {
            Unsupported::Older => "older",
            Unsupported::Newer => "newer",
            Unsupported::PreRelease => "pre_release",
            Unsupported::FreeThreaded => "free_threaded",
            Unsupported::Musl => "musl",
            Unsupported::DebugOffsets => "debug_offsets",
        }
    }
}

/// What [`inspect`] found in a CPython binary. Offsets are file offsets of the binary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interpreter {
    /// The release; `None` before 3.11, which has no `Py_Version`.
    pub version: Option<PythonVersion>,
    /// The layout the walk uses, or why there is none.
    pub layout: Result<Layout, Unsupported>,
    /// Where `_PyRuntime` starts (3.7 and later).
    pub runtime: Option<u64>,
    /// Where `PyCode_Type` starts: a code object's `ob_type` is its address.
    pub code_type: Option<u64>,
    /// Where `PyUnicode_Type` starts: a string's `ob_type` is its address.
    pub unicode_type: Option<u64>,
    /// Where `_PyEval_EvalFrameDefault`, the interpreter loop, starts, and its length: the
    /// native frames a mixed stack replaces by Python frames.
    pub eval_loop: Option<(u64, u64)>,
}

impl Interpreter {
    /// The release's minor version as a metric label value: `3.11`, `3.12`, `3.13`, or
    /// `older` / `newer` outside 3.11 to 3.13 (a bounded set).
    pub fn version_label(&self) -> &'static str {
        match self.version.map(|v| (v.major(), v.minor())) {
            None => "older",
            Some((3, 11)) => "3.11",
            Some((3, 12)) => "3.12",
            Some((3, 13)) => "3.13",
            Some((major, minor)) if (major, minor) < (3, 11) => "older",
            Some(_) => "newer",
        }
    }
}

/// The symbols detection reads: every CPython since 2.x exports `Py_Initialize`.
const SYMBOLS: [&str; 6] = [
    "Py_Initialize",
    "_PyRuntime",
    "Py_Version",
    "PyCode_Type",
    "PyUnicode_Type",
    "_PyEval_EvalFrameDefault",
];

/// The file offsets and sizes of [`SYMBOLS`] defined in the dynamic symbol table of `elf`
/// (exported symbols only: a program linked against libpython imports them undefined).
fn exported(elf: &ElfFile64<'_, Endianness>) -> [Option<(u64, u64)>; SYMBOLS.len()] {
    let mut found = [None; SYMBOLS.len()];
    for symbol in elf.dynamic_symbols() {
        if !symbol.is_definition() {
            continue;
        }
        let Some(index) = symbol
            .name_bytes()
            .ok()
            .and_then(|name| SYMBOLS.iter().position(|s| s.as_bytes() == name))
        else {
            continue;
        };
        let addr = symbol.address();
        found[index] = elf
            .segments()
            .find_map(|segment| {
                let (offset, size) = segment.file_range();
                let within = addr.checked_sub(segment.address())?;
                (within < size).then(|| offset + within)
            })
            .map(|offset| (offset, symbol.size()));
    }
    found
}

/// Inspects the binary at `path`: `None` when it is not an x86-64 CPython interpreter.
///
/// # Errors
///
/// [`PythonError::ReadBinary`] when it cannot be mapped, [`PythonError::Inspect`] when it is an
/// ELF file whose headers or symbols cannot be parsed.
pub fn inspect(path: &Path) -> Result<Option<Interpreter>, PythonError> {
    let map = Mmap::builder()
        .open(path)
        .map_err(|source| read_error(path, std::io::Error::other(source)))?;
    let bytes: &[u8] = &map;
    if !bytes.starts_with(b"\x7fELF") {
        return Ok(None);
    }
    let elf = ElfFile64::<Endianness>::parse(bytes).map_err(|source| PythonError::Inspect {
        path: path.to_path_buf(),
        source,
    })?;
    if elf.architecture() != Architecture::X86_64 {
        return Ok(None);
    }
    let [
        initialize,
        runtime,
        version_offset,
        code_type,
        unicode_type,
        eval_loop,
    ] = exported(&elf);
    if initialize.is_none() {
        return Ok(None);
    }
    let offset = |symbol: Option<(u64, u64)>| symbol.map(|(offset, _)| offset);
    let (runtime, version_offset, code_type, unicode_type) = (
        offset(runtime),
        offset(version_offset),
        offset(code_type),
        offset(unicode_type),
    );
    let older = |runtime| Interpreter {
        version: None,
        layout: Err(Unsupported::Older),
        runtime,
        code_type,
        unicode_type,
        eval_loop,
    };
    // Py_Version and _PyRuntime exist in every release since 3.11.
    let (Some(version_offset), Some(runtime_offset)) = (version_offset, runtime) else {
        return Ok(Some(older(runtime)));
    };
    let at = |offset: u64, len: usize| {
        usize::try_from(offset)
            .ok()
            .and_then(|start| bytes.get(start..start.checked_add(len)?))
            .ok_or_else(|| {
                read_error(
                    path,
                    std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "symbol past the end"),
                )
            })
    };
    // `const unsigned long Py_Version`; PY_VERSION_HEX fits the low 32 bits.
    let word: [u8; 8] = at(version_offset, 8)?.try_into().unwrap_or([0; 8]);
    let version = PythonVersion(u32::try_from(u64::from_le_bytes(word)).unwrap_or(0));
    let layout = match (version.major(), version.minor()) {
        (3, 11) | (3, 12) => Layout::from_table(version.0).ok_or(Unsupported::PreRelease),
        (3, 13) => {
            let words = at(runtime_offset, DEBUG_OFFSETS_WORDS * 8)?;
            match Layout::from_debug_offsets(words, version.0) {
                Ok(layout) => Ok(layout),
                Err(PythonError::FreeThreaded { .. }) => Err(Unsupported::FreeThreaded),
                Err(err) => {
                    tracing::warn!(path = %path.display(), error = %err, "refusing this CPython's debug offsets");
                    Err(Unsupported::DebugOffsets)
                }
            }
        }
        (major, minor) if (major, minor) < (3, 11) => Err(Unsupported::Older),
        _ => Err(Unsupported::Newer),
    };
    Ok(Some(Interpreter {
        version: Some(version),
        layout,
        runtime,
        code_type,
        unicode_type,
        eval_loop,
    }))
}

fn read_error(path: &Path, source: std::io::Error) -> PythonError {
    PythonError::ReadBinary {
        path: path.to_path_buf(),
        source,
    }
}

/// One file-backed line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FileMapping {
    start: u64,
    end: u64,
    offset: u64,
    key: (u64, u64),
    path: String,
}

fn parse_maps(text: &str) -> Vec<FileMapping> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (start, end) = fields.next()?.split_once('-')?;
            let _perms = fields.next()?;
            let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
            let (major, minor) = fields.next()?.split_once(':')?;
            let inode: u64 = fields.next()?.parse().ok()?;
            // The path is the rest of the line after the inode (it may hold spaces).
            let mut rest = line;
            for _ in 0..5 {
                rest = rest.trim_start().split_once(' ')?.1;
            }
            let path = rest.trim_start();
            if inode == 0 || !path.starts_with('/') {
                return None;
            }
            Some(FileMapping {
                start: u64::from_str_radix(start, 16).ok()?,
                end: u64::from_str_radix(end, 16).ok()?,
                offset,
                key: (
                    (u64::from_str_radix(major, 16).ok()? << 32)
                        | u64::from_str_radix(minor, 16).ok()?,
                    inode,
                ),
                path: path.strip_suffix(" (deleted)").unwrap_or(path).to_owned(),
            })
        })
        .collect()
}

/// The run-time address of file offset `offset` of the file `key`, through the mapping that
/// maps it.
fn address_of(mappings: &[FileMapping], key: (u64, u64), offset: u64) -> Option<u64> {
    mappings
        .iter()
        .filter(|m| m.key == key)
        .find(|m| m.offset <= offset && offset - m.offset < m.end - m.start)
        .map(|m| m.start + (offset - m.offset))
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// A CPython interpreter found in a process, with its state's addresses in that process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessInterpreter {
    /// The binary holding the interpreter, as the process maps it.
    pub path: PathBuf,
    /// What the binary is.
    pub interpreter: Arc<Interpreter>,
    /// The layout to walk with and the addresses of `_PyRuntime`, `PyCode_Type` and
    /// `PyUnicode_Type`; or why the process is shown with native frames only.
    pub target: Result<Target, Unsupported>,
}

/// What a walk of one supported process starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    /// The release's layout.
    pub layout: Layout,
    /// The release.
    pub version: PythonVersion,
    /// The address of `_PyRuntime`.
    pub runtime: u64,
    /// The address of `PyCode_Type`.
    pub code_type: u64,
    /// The address of `PyUnicode_Type`.
    pub unicode_type: u64,
    /// Where `_PyEval_EvalFrameDefault` is mapped: its first address and the one past its end.
    pub eval_loop: Option<(u64, u64)>,
}

/// Binaries inspected at most this many at once in the cache; past it the cache starts over.
/// A host has far fewer distinct executables.
const MAX_CACHED_BINARIES: usize = 4096;

/// Finds CPython in processes, inspecting each binary once.
#[derive(Debug, Default)]
pub struct Detector {
    binaries: HashMap<(u64, u64), Option<Arc<Interpreter>>>,
}

impl Detector {
    /// Looks for CPython in process `pid` under `proc` (normally `/proc`): `None` when the
    /// process runs none.
    ///
    /// # Errors
    ///
    /// [`PythonError::Maps`] when its memory map cannot be read (it has exited), and what
    /// [`inspect`] returns for a candidate binary.
    pub fn process(
        &mut self,
        proc: &Path,
        pid: u32,
    ) -> Result<Option<ProcessInterpreter>, PythonError> {
        let dir = proc.join(pid.to_string());
        let text = std::fs::read_to_string(dir.join("maps"))
            .map_err(|source| PythonError::Maps { pid, source })?;
        let mappings = parse_maps(&text);
        let exe = std::fs::read_link(dir.join("exe")).ok().map(|p| {
            let p = p.to_string_lossy().into_owned();
            p.strip_suffix(" (deleted)").map(str::to_owned).unwrap_or(p)
        });
        let musl = mappings.iter().any(|m| {
            let name = file_name(&m.path);
            name.starts_with("ld-musl-") || name.starts_with("libc.musl-")
        });
        let mut tried = Vec::new();
        for mapping in &mappings {
            let candidate = exe.as_deref() == Some(mapping.path.as_str())
                || file_name(&mapping.path).starts_with("libpython");
            if !candidate || tried.contains(&mapping.key) {
                continue;
            }
            tried.push(mapping.key);
            let Some(interpreter) = self.binary(&dir, mapping)? else {
                continue;
            };
            let target = match (&interpreter.layout, musl) {
                (Err(unsupported), _) => Err(*unsupported),
                (Ok(_), true) => Err(Unsupported::Musl),
                (Ok(layout), false) => {
                    let at = |offset: Option<u64>| {
                        offset.and_then(|offset| address_of(&mappings, mapping.key, offset))
                    };
                    match (
                        at(interpreter.runtime),
                        at(interpreter.code_type),
                        at(interpreter.unicode_type),
                        interpreter.version,
                    ) {
                        (Some(runtime), Some(code_type), Some(unicode_type), Some(version)) => {
                            let eval_loop = interpreter.eval_loop.and_then(|(offset, size)| {
                                let start = at(Some(offset))?;
                                Some((start, start.checked_add(size)?))
                            });
                            Ok(Target {
                                layout: *layout,
                                version,
                                runtime,
                                code_type,
                                unicode_type,
                                eval_loop,
                            })
                        }
                        _ => {
                            return Err(PythonError::Unmapped {
                                pid,
                                path: PathBuf::from(&mapping.path),
                            });
                        }
                    }
                }
            };
            return Ok(Some(ProcessInterpreter {
                path: PathBuf::from(&mapping.path),
                interpreter,
                target,
            }));
        }
        Ok(None)
    }

    /// The cached inspection of `mapping`'s binary, inspecting it on first sight.
    fn binary(
        &mut self,
        dir: &Path,
        mapping: &FileMapping,
    ) -> Result<Option<Arc<Interpreter>>, PythonError> {
        if let Some(known) = self.binaries.get(&mapping.key) {
            return Ok(known.clone());
        }
        // map_files reaches deleted binaries and those of other mount namespaces; root the
        // rest (it needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE).
        let through_map_files = dir
            .join("map_files")
            .join(format!("{:x}-{:x}", mapping.start, mapping.end));
        let path = if File::open(&through_map_files).is_ok() {
            through_map_files
        } else {
            dir.join("root").join(mapping.path.trim_start_matches('/'))
        };
        let found = inspect(&path)?.map(Arc::new);
        if self.binaries.len() >= MAX_CACHED_BINARIES {
            self.binaries.clear();
        }
        self.binaries.insert(mapping.key, found.clone());
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
00400000-00420000 r--p 00000000 fd:01 100    /usr/bin/python3.11
00420000-00700000 r-xp 00020000 fd:01 100    /usr/bin/python3.11
00a50000-00a60000 rw-p 00650000 fd:01 100    /usr/bin/python3.11
7f0000000000-7f0000010000 r-xp 00000000 00:00 0
7f0000100000-7f0000200000 r-xp 00001000 fd:01 7      /opt/my app/lib/libpython3.12.so.1.0 (deleted)
7ffd00000000-7ffd00001000 r-xp 00000000 00:00 0      [vdso]
";

    #[test]
    fn maps_keep_file_mappings_with_their_paths() {
        let mappings = parse_maps(MAPS);
        assert_eq!(mappings.len(), 4);
        assert_eq!(mappings[3].path, "/opt/my app/lib/libpython3.12.so.1.0");
        assert_eq!(mappings[3].key, ((0xfd << 32) | 1, 7));
        assert_eq!(
            address_of(&mappings, ((0xfd << 32) | 1, 100), 0x65b740),
            Some(0xa5b740)
        );
        assert_eq!(
            address_of(&mappings, ((0xfd << 32) | 1, 100), 0x660000),
            None
        );
        assert_eq!(address_of(&mappings, ((0xfd << 32) | 1, 7), 0x800), None);
    }

    #[test]
    fn versions_print_as_python_does() {
        assert_eq!(PythonVersion(0x030b07f0).to_string(), "3.11.7");
        assert_eq!(PythonVersion(0x030d00c1).to_string(), "3.13.0rc1");
        assert_eq!(PythonVersion(0x030e00a3).to_string(), "3.14.0a3");
        let label = |version| {
            Interpreter {
                version,
                layout: Err(Unsupported::Older),
                runtime: None,
                code_type: None,
                unicode_type: None,
                eval_loop: None,
            }
            .version_label()
        };
        assert_eq!(label(None), "older");
        assert_eq!(label(Some(PythonVersion(0x030a0df0))), "older");
        assert_eq!(label(Some(PythonVersion(0x030c01f0))), "3.12");
        assert_eq!(label(Some(PythonVersion(0x030e00f0))), "newer");
    }
}
