//! Code objects to frame names, read from the process's memory: `qualname (path:first_line)`.
//!
//! One name per function, not per line, so that flame graphs merge a function's samples across
//! samples and processes. A [`NameCache`] keeps the names of one process by code object address,
//! with what identifies the object (its type, name and file pointers, first line and length):
//! [`NameCache::resolve`] hands a name out again only after the object at that address still
//! has them, so an object freed and replaced by another at the same address is read afresh.
//! Names checked within the current window are trusted without another read
//! ([`NameCache::checked`]); once the process has exited, the last name known stands
//! ([`NameCache::cached`]).

use std::collections::HashMap;
use std::sync::Arc;

use super::PythonError;
use super::detect::Target;
use super::layout::{UNICODE_ASCII_BIT, UNICODE_COMPACT_BIT, UNICODE_KIND_SHIFT};
use super::memory::{Memory, u32_at, u64_at};

/// Characters of a qualified name kept; longer ones are cut and end with `…`.
pub(super) const MAX_NAME_CHARS: u64 = 256;
/// Characters of a file name kept.
pub(super) const MAX_PATH_CHARS: u64 = 1024;
/// Names one process's cache holds; past it the names not checked in the current window go
/// (all of them if every one was).
const MAX_CACHED_NAMES: usize = 16384;

/// What a code object says of itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeInfo {
    /// `co_qualname`: `Class.method`, `outer.<locals>.inner`, `<module>`.
    pub qualname: String,
    /// `co_filename`: the source file as the interpreter was given it.
    pub filename: String,
    /// `co_firstlineno`: the line of the `def` (or of the first decorator).
    pub first_line: i32,
    /// The bytecode's length in 2-byte code units.
    pub units: u64,
}

impl CodeInfo {
    /// The frame name: `qualname (filename:first_line)`.
    pub fn frame_name(&self) -> String {
        format!("{} ({}:{})", self.qualname, self.filename, self.first_line)
    }
}

/// What identifies a code object at an address: when any of it changes, the object was
/// replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fingerprint {
    qualname: u64,
    filename: u64,
    first_line: u32,
    units: u64,
}

/// Reads the header of the code object at `addr`, checking that it is one.
fn read_header(memory: &Memory, target: &Target, addr: u64) -> Result<Fingerprint, PythonError> {
    let layout = &target.layout;
    let mut header = vec![0u8; layout.code_header_len()];
    memory.read(addr, &mut header)?;
    if u64_at(&header, layout.object_type) != target.code_type {
        return Err(PythonError::NotCode {
            pid: memory.pid(),
            addr,
        });
    }
    Ok(Fingerprint {
        qualname: u64_at(&header, layout.code_qualname),
        filename: u64_at(&header, layout.code_filename),
        first_line: u32_at(&header, layout.code_first_line),
        units: u64_at(&header, layout.code_units),
    })
}

/// Reads the code object at `addr`.
///
/// # Errors
///
/// [`PythonError::Read`] when it cannot be read, [`PythonError::NotCode`] when it is not a code
/// object, [`PythonError::NotString`] when its names are not strings the reader knows.
pub fn read_code(memory: &Memory, target: &Target, addr: u64) -> Result<CodeInfo, PythonError> {
    let header = read_header(memory, target, addr)?;
    info_from(memory, target, &header)
}

fn info_from(
    memory: &Memory,
    target: &Target,
    header: &Fingerprint,
) -> Result<CodeInfo, PythonError> {
    Ok(CodeInfo {
        qualname: read_string(memory, target, header.qualname, MAX_NAME_CHARS)?,
        filename: read_string(memory, target, header.filename, MAX_PATH_CHARS)?,
        first_line: header.first_line as i32,
        units: header.units,
    })
}

/// Where a string's characters are and how to read them, from its header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct StringShape {
    /// Offset of the characters from the object's start.
    data: u64,
    /// Bytes per character: 1, 2 or 4.
    kind: u64,
    /// Characters to read (at most the cap).
    kept: u64,
    /// Whether the string is longer than what is read.
    cut: bool,
}

/// The shape of the string whose header (`unicode_compact_size` bytes) is `header`, keeping at
/// most `max_chars` characters; or what makes it unreadable.
fn string_shape(
    target: &Target,
    header: &[u8],
    max_chars: u64,
) -> Result<StringShape, &'static str> {
    let layout = &target.layout;
    if u64_at(header, layout.object_type) != target.unicode_type {
        return Err("its type is not str");
    }
    let state = u32_at(header, layout.unicode_state);
    if (state >> UNICODE_COMPACT_BIT) & 1 == 0 {
        return Err("it is not compact");
    }
    let ascii = (state >> UNICODE_ASCII_BIT) & 1 == 1;
    let kind = u64::from((state >> UNICODE_KIND_SHIFT) & 7);
    if !matches!(kind, 1 | 2 | 4) || (ascii && kind != 1) {
        return Err("its kind is not 1, 2 or 4 bytes");
    }
    let length = u64_at(header, layout.unicode_length);
    if length > i64::MAX as u64 {
        return Err("its length is negative");
    }
    let kept = length.min(max_chars);
    Ok(StringShape {
        data: if ascii {
            layout.unicode_ascii_size
        } else {
            layout.unicode_compact_size
        },
        kind,
        kept,
        cut: kept < length,
    })
}

/// The text of `bytes`, characters of `kind` bytes (1: Latin-1, 2: UCS-2, 4: UCS-4); invalid
/// code points become U+FFFD, and `cut` adds `…`.
fn decode(kind: u64, bytes: &[u8], cut: bool) -> String {
    let mut text: String = match kind {
        1 => bytes.iter().map(|&b| char::from(b)).collect(),
        2 => char::decode_utf16(
            bytes
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]])),
        )
        .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
        .collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|c| {
                char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .unwrap_or(char::REPLACEMENT_CHARACTER)
            })
            .collect(),
    };
    if cut {
        text.push('…');
    }
    text
}

/// Reads the `str` at `addr`, keeping at most `max_chars` characters (a longer string is cut and
/// ends with `…`).
///
/// # Errors
///
/// [`PythonError::Read`] when it cannot be read, [`PythonError::NotString`] when it is not a
/// compact `str` (code objects' names always are).
pub fn read_string(
    memory: &Memory,
    target: &Target,
    addr: u64,
    max_chars: u64,
) -> Result<String, PythonError> {
    let header_len = usize::try_from(target.layout.unicode_compact_size).unwrap_or(usize::MAX);
    let mut header = vec![0u8; header_len];
    memory.read(addr, &mut header)?;
    let shape =
        string_shape(target, &header, max_chars).map_err(|what| PythonError::NotString {
            pid: memory.pid(),
            addr,
            what,
        })?;
    // At most max_chars (1024) x 4 bytes: capped before allocating.
    let mut bytes = vec![0u8; usize::try_from(shape.kept * shape.kind).unwrap_or(0)];
    if !bytes.is_empty() {
        memory.read(addr + shape.data, &mut bytes)?;
    }
    Ok(decode(shape.kind, &bytes, shape.cut))
}

#[derive(Debug)]
struct Cached {
    fingerprint: Fingerprint,
    name: CodeName,
    /// The window in which the object was last found to be this one.
    checked: u64,
}

/// The names of one process's code objects, by address.
#[derive(Debug, Default)]
pub struct NameCache {
    names: HashMap<u64, Cached>,
    /// The current window; names checked in it are trusted without another read.
    window: u64,
    /// Names dropped for the per-process bound since [`NameCache::take_evicted`] last ran.
    evicted: usize,
}

/// A frame's name and the length of its code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeName {
    /// `qualname (filename:first_line)`.
    pub name: Arc<str>,
    /// The bytecode's length in 2-byte code units, to check an instruction pointer against.
    pub units: u64,
}

impl NameCache {
    /// The name of the code object at `addr`, checked against the object now there: one read
    /// of its header when it is known, its strings too when it is new or was replaced.
    ///
    /// # Errors
    ///
    /// As [`read_code`].
    pub fn resolve(
        &mut self,
        memory: &Memory,
        target: &Target,
        addr: u64,
    ) -> Result<CodeName, PythonError> {
        let fingerprint = read_header(memory, target, addr)?;
        if let Some(cached) = self.names.get_mut(&addr)
            && cached.fingerprint == fingerprint
        {
            cached.checked = self.window;
            return Ok(cached.name.clone());
        }
        let info = info_from(memory, target, &fingerprint)?;
        let name = CodeName {
            name: Arc::from(info.frame_name()),
            units: info.units,
        };
        if self.names.len() >= MAX_CACHED_NAMES {
            self.evicted += self.evict_stale();
            if self.names.len() >= MAX_CACHED_NAMES {
                self.evicted += self.clear();
            }
        }
        self.names.insert(
            addr,
            Cached {
                fingerprint,
                name: name.clone(),
                checked: self.window,
            },
        );
        Ok(name)
    }

    /// The name of `addr` if [`NameCache::resolve`] checked it in the current window.
    pub fn checked(&self, addr: u64) -> Option<CodeName> {
        self.names
            .get(&addr)
            .filter(|cached| cached.checked == self.window)
            .map(|cached| cached.name.clone())
    }

    /// The name last resolved for `addr`, in any window: for naming samples after the process
    /// has exited.
    pub fn cached(&self, addr: u64) -> Option<CodeName> {
        self.names.get(&addr).map(|cached| cached.name.clone())
    }

    /// Starts a new window: names must be checked again before [`NameCache::checked`] returns
    /// them.
    pub fn next_window(&mut self) {
        self.window += 1;
    }

    /// How many names are cached.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether no name is cached.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Drops the names not checked in the current window (those the window's samples do not
    /// need); returns how many.
    pub fn evict_stale(&mut self) -> usize {
        let before = self.names.len();
        let window = self.window;
        self.names.retain(|_, cached| cached.checked == window);
        before - self.names.len()
    }

    /// Drops every name; returns how many.
    pub fn clear(&mut self) -> usize {
        let dropped = self.names.len();
        self.names = HashMap::new();
        dropped
    }

    /// Names the cache dropped on its own (its per-process bound) since the last call.
    pub fn take_evicted(&mut self) -> usize {
        std::mem::take(&mut self.evicted)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::ebpf::python::detect::PythonVersion;
    use crate::ebpf::python::layout::Layout;

    const UNICODE_TYPE: u64 = 0x7700_0000;

    fn target() -> Target {
        Target {
            layout: Layout::V3_12,
            version: PythonVersion(0x030c01f0),
            runtime: 0,
            code_type: 0x7600_0000,
            unicode_type: UNICODE_TYPE,
            eval_loop: None,
        }
    }

    /// A 3.12 string object: header, then the characters.
    fn string(kind: u32, ascii: bool, length: u64, data: &[u8]) -> Vec<u8> {
        let layout = Layout::V3_12;
        let mut object = vec![0u8; layout.unicode_compact_size as usize];
        object[8..16].copy_from_slice(&UNICODE_TYPE.to_le_bytes());
        object[16..24].copy_from_slice(&length.to_le_bytes());
        let state = (kind << UNICODE_KIND_SHIFT)
            | (1 << UNICODE_COMPACT_BIT)
            | (u32::from(ascii) << UNICODE_ASCII_BIT);
        object[32..36].copy_from_slice(&state.to_le_bytes());
        if ascii {
            object.truncate(layout.unicode_ascii_size as usize);
        }
        object.extend_from_slice(data);
        object
    }

    fn read(object: &[u8], max_chars: u64) -> Result<String, PythonError> {
        let memory = Memory::open(std::path::Path::new("/proc"), std::process::id()).unwrap();
        read_string(&memory, &target(), object.as_ptr() as u64, max_chars)
    }

    #[test]
    fn strings_of_each_kind_are_read_and_long_ones_cut() {
        assert_eq!(read(&string(1, true, 5, b"serve"), 256).unwrap(), "serve");
        assert_eq!(read(&string(1, false, 1, &[0xe9]), 256).unwrap(), "é");
        let ucs2: Vec<u8> = "Grüße→".encode_utf16().flat_map(u16::to_le_bytes).collect();
        assert_eq!(read(&string(2, false, 6, &ucs2), 256).unwrap(), "Grüße→");
        let ucs4: Vec<u8> = "f🐍"
            .chars()
            .flat_map(|c| (c as u32).to_le_bytes())
            .collect();
        assert_eq!(read(&string(4, false, 2, &ucs4), 256).unwrap(), "f🐍");
        assert_eq!(read(&string(1, true, 5, b"serve"), 3).unwrap(), "ser…");
        assert_eq!(read(&string(1, true, 0, b""), 3).unwrap(), "");
    }

    #[test]
    fn what_is_not_a_compact_string_is_refused() {
        let mut other_type = string(1, true, 5, b"serve");
        other_type[8] ^= 1;
        let mut legacy = string(1, true, 5, b"serve");
        legacy[32] &= !(1 << UNICODE_COMPACT_BIT);
        for object in [
            other_type,
            legacy,
            string(3, false, 1, b"abc"),
            string(2, true, 1, b"ab"),
        ] {
            assert!(matches!(
                read(&object, 256),
                Err(PythonError::NotString { .. })
            ));
        }
        // A length beyond any memory: only the cap is read (whatever lies there), never the
        // claimed length allocated.
        let mut huge = string(4, false, i64::MAX as u64, b"");
        huge.extend_from_slice(&[0x41, 0, 0, 0].repeat(4));
        assert_eq!(read(&huge, 4).unwrap(), "AAAA…");
    }

    /// A code object of the test process's own memory: header, qualname and filename strings.
    struct FakeCode {
        header: Vec<u8>,
        _strings: [Vec<u8>; 2],
    }

    fn fake_code(first_line: u32) -> FakeCode {
        let layout = Layout::V3_12;
        let qualname = string(1, true, 1, b"f");
        let filename = string(1, true, 4, b"a.py");
        let mut header = vec![0u8; layout.code_header_len()];
        let put = |header: &mut Vec<u8>, at: u64, value: u64| {
            let at = at as usize;
            header[at..at + 8].copy_from_slice(&value.to_le_bytes());
        };
        put(&mut header, layout.object_type, target().code_type);
        put(&mut header, layout.code_qualname, qualname.as_ptr() as u64);
        put(&mut header, layout.code_filename, filename.as_ptr() as u64);
        let at = layout.code_first_line as usize;
        header[at..at + 4].copy_from_slice(&first_line.to_le_bytes());
        FakeCode {
            header,
            _strings: [qualname, filename],
        }
    }

    #[test]
    fn the_cache_drops_stale_names_first_and_counts_what_it_drops() {
        let memory = Memory::open(std::path::Path::new("/proc"), std::process::id()).unwrap();
        let codes: Vec<FakeCode> = (1..=3).map(fake_code).collect();
        let addr = |i: usize| codes[i].header.as_ptr() as u64;
        let mut cache = NameCache::default();
        for i in 0..2 {
            assert_eq!(
                &*cache.resolve(&memory, &target(), addr(i)).unwrap().name,
                &*format!("f (a.py:{})", i + 1)
            );
        }
        cache.next_window();
        cache.resolve(&memory, &target(), addr(2)).unwrap();
        // The first two were checked in the last window only.
        assert_eq!(cache.evict_stale(), 2);
        assert_eq!(cache.len(), 1);
        assert!(cache.checked(addr(2)).is_some());
        assert_eq!(cache.clear(), 1);
        assert!(cache.is_empty());
        assert_eq!(cache.take_evicted(), 0);
    }

    proptest! {
        #[test]
        fn any_header_gives_a_bounded_shape_or_a_reason(
            header in proptest::collection::vec(any::<u8>(), 0..80),
            max_chars in 0u64..2048,
        ) {
            if let Ok(shape) = string_shape(&target(), &header, max_chars) {
                prop_assert!(shape.kept <= max_chars);
                prop_assert!(matches!(shape.kind, 1 | 2 | 4));
            }
        }

        #[test]
        fn any_bytes_decode_to_at_most_one_char_per_unit(
            kind in prop_oneof![Just(1u64), Just(2), Just(4)],
            bytes in proptest::collection::vec(any::<u8>(), 0..64),
            cut: bool,
        ) {
            let text = decode(kind, &bytes, cut);
            prop_assert!(text.chars().count() as u64 <= bytes.len() as u64 / kind + u64::from(cut));
        }
    }
}
