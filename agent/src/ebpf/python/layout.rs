//! Where CPython keeps what a stack walk reads: the offsets of the fields of `_PyRuntime`,
//! `PyInterpreterState`, `PyThreadState`, `_PyInterpreterFrame`, `PyCodeObject` and the string
//! objects, per supported release.
//!
//! CPython 3.13 publishes most of them itself, in the `_Py_DebugOffsets` struct at the start of
//! `_PyRuntime` ([`Layout::from_debug_offsets`] parses and checks it). 3.11 and 3.12 publish
//! nothing, so their layouts are tables here ([`Layout::V3_11`], [`Layout::V3_12`]). Each value
//! was derived with `offsetof()`/`sizeof()` compiled against the internal headers
//! (`Py_BUILD_CORE`, `internal/pycore_*.h`) of the releases on the project's machines: Debian's
//! 3.11.2 (`/usr/include/python3.11`), pyenv's 3.11.7 and 3.12.1 (identical within a minor
//! release for every field used), and checked for 3.13.0 against what its `_Py_DebugOffsets`
//! says. `agent/tests/agent/python.rs` repeats both checks against the headers and walks live
//! interpreters of each release.
//!
//! Every final 3.11.x and 3.12.x takes its minor release's table, though the headers of three
//! micro releases were compared, because CPython does not change these layouts within a minor
//! release: its ABI is fixed from the x.y.0 final on (the devguide's rule: no ABI change in
//! maintenance releases; extensions built against 3.11.0 load in every 3.11.x), which covers
//! the public structs read here (`PyThreadState`, `PyCodeObject`, the string objects), and
//! the internal ones the walk reads (`_PyRuntimeState`'s interpreter list,
//! `PyInterpreterState.threads`, `_PyCFrame`, `_PyInterpreterFrame`) are the ones every
//! out-of-process profiler and debugger reads with one table per minor release (py-spy,
//! Pyroscope's and OpenTelemetry's eBPF profilers), which is why 3.13 began publishing them
//! (`_Py_DebugOffsets`) rather than changing that practice. Pre-releases are refused: layouts
//! do change up to the final. Were a micro release to move a field all the same, what the
//! walk reads would fail the checks made on it (the code object's type at every name read:
//! `read_failures_total{reason="not_code"}`; the instruction pointer inside the code:
//! `stale_code`; a thread state not found: native stacks), showing as
//! `[unknown python code]` and native stacks, not as wrong names.
//!
//! Nothing here reads memory: input is bytes, output offsets.

use super::PythonError;

/// How a thread state reaches the frame its thread runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameAnchor {
    /// 3.13: `PyThreadState.current_frame` at this offset.
    Direct(u64),
    /// 3.11 and 3.12: `PyThreadState.cframe` (a `_PyCFrame` on the C stack of the innermost
    /// `_PyEval_EvalFrameDefault` call) at `cframe`, whose `current_frame` is at `current_frame`.
    CFrame {
        /// Offset of `cframe` in `PyThreadState`.
        cframe: u64,
        /// Offset of `current_frame` in `_PyCFrame`.
        current_frame: u64,
    },
}

/// How a frame says it is the first one a C-level call of the interpreter loop runs (where, in a
/// mixed stack, native frames sit between it and its caller).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryMarker {
    /// 3.11: the `bool is_entry` at this offset of `_PyInterpreterFrame`.
    Flag(u64),
    /// 3.12 and later: each interpreter-loop call pushes a shim frame owned by the C stack
    /// (`owner == FRAME_OWNED_BY_CSTACK`, this value) below its first frame. Shims are not
    /// Python code and are skipped.
    ShimOwner(u8),
}

/// The offsets (bytes) a walk of a CPython process needs, for one release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// `_PyRuntime.interpreters.head`: the newest interpreter, the head of their list.
    pub runtime_interpreters_head: u64,
    /// `PyInterpreterState.next`.
    pub interp_next: u64,
    /// `PyInterpreterState.threads.head`: the newest thread state of the interpreter.
    pub interp_threads_head: u64,
    /// `PyThreadState.next`.
    pub tstate_next: u64,
    /// `PyThreadState.interp`: the interpreter the state belongs to.
    pub tstate_interp: u64,
    /// `PyThreadState.thread_id`: the `pthread_t` of the thread.
    pub tstate_thread_id: u64,
    /// `PyThreadState.native_thread_id`: the kernel's thread id, as `gettid()` in the process's
    /// PID namespace returns it.
    pub tstate_native_thread_id: u64,
    /// How the thread state reaches the current frame.
    pub tstate_frame: FrameAnchor,
    /// `_PyInterpreterFrame.previous`: the caller's frame.
    pub frame_previous: u64,
    /// `_PyInterpreterFrame.f_code` (3.11, 3.12) or `f_executable` (3.13).
    pub frame_code: u64,
    /// `_PyInterpreterFrame.prev_instr` (3.11, 3.12: the last instruction started) or
    /// `instr_ptr` (3.13: the instruction running or next).
    pub frame_instr: u64,
    /// `_PyInterpreterFrame.owner` (a `char`).
    pub frame_owner: u64,
    /// How entry frames are marked.
    pub frame_entry: EntryMarker,
    /// `PyObject.ob_type`.
    pub object_type: u64,
    /// `PyVarObject.ob_size` of a code object: its length in 2-byte code units.
    pub code_units: u64,
    /// `PyCodeObject.co_filename`.
    pub code_filename: u64,
    /// `PyCodeObject.co_name`.
    pub code_name: u64,
    /// `PyCodeObject.co_qualname`.
    pub code_qualname: u64,
    /// `PyCodeObject.co_firstlineno` (an `int`).
    pub code_first_line: u64,
    /// `PyCodeObject.co_code_adaptive`: where the bytecode starts.
    pub code_adaptive: u64,
    /// `PyASCIIObject.length`: characters in a string.
    pub unicode_length: u64,
    /// `PyASCIIObject.state`: the bit field holding `kind`, `compact` and `ascii`.
    pub unicode_state: u64,
    /// `sizeof(PyASCIIObject)`: where the characters of a compact ASCII string start.
    pub unicode_ascii_size: u64,
    /// `sizeof(PyCompactUnicodeObject)`: where those of other compact strings start.
    pub unicode_compact_size: u64,
}

/// The bits of `PyASCIIObject.state` a reader needs, the same in 3.11, 3.12 and 3.13
/// (`interned:2, kind:3, compact:1, ascii:1`, then `ready:1` in 3.11 or
/// `statically_allocated:1` later): `kind` is bits 2..5.
pub(super) const UNICODE_KIND_SHIFT: u32 = 2;
/// `compact` is bit 5 of `PyASCIIObject.state`.
pub(super) const UNICODE_COMPACT_BIT: u32 = 5;
/// `ascii` is bit 6 of `PyASCIIObject.state`.
pub(super) const UNICODE_ASCII_BIT: u32 = 6;

/// `_Py_DebugOffsets.cookie` in 3.13: `"xdebugpy"`.
pub(super) const DEBUG_COOKIE: &[u8; 8] = b"xdebugpy";

/// How many leading 8-byte words of 3.13's `_Py_DebugOffsets` [`Layout::from_debug_offsets`]
/// reads: everything up to and including `unicode_object` (3.13's
/// `internal/pycore_runtime.h`: cookie, version, free_threaded, then sections of 3, 13, 9, 6,
/// 10, 2, 4, 3, 3, 3, 2, 3, 3 and 4 words).
pub(super) const DEBUG_OFFSETS_WORDS: usize =
    3 + 3 + 13 + 9 + 6 + 10 + 2 + 4 + 3 + 3 + 3 + 2 + 3 + 3 + 4;

/// Word indexes into 3.13's `_Py_DebugOffsets`, named after its fields.
mod word {
    pub(super) const VERSION: usize = 1;
    pub(super) const FREE_THREADED: usize = 2;
    const RUNTIME: usize = 3;
    pub(super) const RUNTIME_SIZE: usize = RUNTIME;
    pub(super) const RUNTIME_INTERPRETERS_HEAD: usize = RUNTIME + 2;
    const INTERP: usize = RUNTIME + 3;
    pub(super) const INTERP_SIZE: usize = INTERP;
    pub(super) const INTERP_NEXT: usize = INTERP + 2;
    pub(super) const INTERP_THREADS_HEAD: usize = INTERP + 3;
    const TSTATE: usize = INTERP + 13;
    pub(super) const TSTATE_SIZE: usize = TSTATE;
    pub(super) const TSTATE_NEXT: usize = TSTATE + 2;
    pub(super) const TSTATE_INTERP: usize = TSTATE + 3;
    pub(super) const TSTATE_CURRENT_FRAME: usize = TSTATE + 4;
    pub(super) const TSTATE_THREAD_ID: usize = TSTATE + 5;
    pub(super) const TSTATE_NATIVE_THREAD_ID: usize = TSTATE + 6;
    const FRAME: usize = TSTATE + 9;
    pub(super) const FRAME_SIZE: usize = FRAME;
    pub(super) const FRAME_PREVIOUS: usize = FRAME + 1;
    pub(super) const FRAME_EXECUTABLE: usize = FRAME + 2;
    pub(super) const FRAME_INSTR_PTR: usize = FRAME + 3;
    pub(super) const FRAME_OWNER: usize = FRAME + 5;
    const CODE: usize = FRAME + 6;
    pub(super) const CODE_SIZE: usize = CODE;
    pub(super) const CODE_FILENAME: usize = CODE + 1;
    pub(super) const CODE_NAME: usize = CODE + 2;
    pub(super) const CODE_QUALNAME: usize = CODE + 3;
    pub(super) const CODE_FIRST_LINE: usize = CODE + 5;
    pub(super) const CODE_ADAPTIVE: usize = CODE + 9;
    const OBJECT: usize = CODE + 10;
    pub(super) const OBJECT_SIZE: usize = OBJECT;
    pub(super) const OBJECT_TYPE: usize = OBJECT + 1;
    const TYPE: usize = OBJECT + 2;
    const TUPLE: usize = TYPE + 4;
    pub(super) const TUPLE_SIZE: usize = TUPLE;
    pub(super) const VAR_OBJECT_SIZE: usize = TUPLE + 2;
    const LIST: usize = TUPLE + 3;
    const DICT: usize = LIST + 3;
    const FLOAT: usize = DICT + 3;
    const LONG: usize = FLOAT + 2;
    const BYTES: usize = LONG + 3;
    const UNICODE: usize = BYTES + 3;
    pub(super) const UNICODE_STATE: usize = UNICODE + 1;
    pub(super) const UNICODE_LENGTH: usize = UNICODE + 2;
    pub(super) const UNICODE_ASCII_SIZE: usize = UNICODE + 3;
    pub(super) const END: usize = UNICODE + 4;
}

const _: () = assert!(word::END == DEBUG_OFFSETS_WORDS);

/// A struct larger than this is not one of CPython's (3.13's `_PyRuntimeState` is 283 KB,
/// `PyInterpreterState` 195 KB): a `_Py_DebugOffsets` claiming more is corrupt.
const MAX_STRUCT_SIZE: u64 = 4 << 20;

/// The walk reads thread states, frames, code objects and strings from their start up to their
/// last field it needs, per object; in 3.13 that is at most 168 bytes. A layout asking for more
/// than this is refused, so a corrupt one cannot make each read large.
const MAX_HEADER_READ: u64 = 1024;

impl Layout {
    /// CPython 3.11 (final releases), from the headers of 3.11.2 and 3.11.7.
    pub const V3_11: Layout = Layout {
        runtime_interpreters_head: 40,
        interp_next: 0,
        interp_threads_head: 16,
        tstate_next: 8,
        tstate_interp: 16,
        tstate_thread_id: 152,
        tstate_native_thread_id: 160,
        tstate_frame: FrameAnchor::CFrame {
            cframe: 56,
            // After `uint8_t use_tracing`, padded to 8.
            current_frame: 8,
        },
        frame_previous: 48,
        frame_code: 32,
        frame_instr: 56,
        frame_owner: 69,
        frame_entry: EntryMarker::Flag(68),
        object_type: 8,
        code_units: 16,
        code_filename: 112,
        code_name: 120,
        code_qualname: 128,
        code_first_line: 72,
        code_adaptive: 184,
        unicode_length: 16,
        unicode_state: 32,
        // 3.11 still has `wchar_t *wstr` in PyASCIIObject and `wstr_length` in the compact one.
        unicode_ascii_size: 48,
        unicode_compact_size: 72,
    };

    /// CPython 3.12 (final releases), from the headers of 3.12.1.
    pub const V3_12: Layout = Layout {
        runtime_interpreters_head: 40,
        interp_next: 0,
        interp_threads_head: 72,
        tstate_next: 8,
        tstate_interp: 16,
        tstate_thread_id: 136,
        tstate_native_thread_id: 144,
        tstate_frame: FrameAnchor::CFrame {
            cframe: 56,
            current_frame: 0,
        },
        frame_previous: 8,
        frame_code: 0,
        frame_instr: 56,
        frame_owner: 70,
        // `FRAME_OWNED_BY_CSTACK` in 3.12's `internal/pycore_frame.h`.
        frame_entry: EntryMarker::ShimOwner(3),
        object_type: 8,
        code_units: 16,
        code_filename: 112,
        code_name: 120,
        code_qualname: 128,
        code_first_line: 68,
        code_adaptive: 192,
        unicode_length: 16,
        unicode_state: 32,
        unicode_ascii_size: 40,
        unicode_compact_size: 56,
    };

    /// The layout 3.13's `_Py_DebugOffsets` describes, given its first 71 little-endian words
    /// (`bytes` at least that long), for a binary whose `Py_Version` is `version`.
    ///
    /// # Errors
    ///
    /// [`PythonError::DebugOffsets`] when the cookie or version differ from the binary's, a size
    /// or offset is out of bounds, or the build is free-threaded.
    pub fn from_debug_offsets(bytes: &[u8], version: u32) -> Result<Layout, PythonError> {
        let bad = |what: &'static str| PythonError::DebugOffsets { version, what };
        if bytes.len() < DEBUG_OFFSETS_WORDS * 8 {
            return Err(bad("too short"));
        }
        if &bytes[..8] != DEBUG_COOKIE {
            return Err(bad("the cookie is not xdebugpy"));
        }
        let w = |index: usize| {
            let mut word = [0u8; 8];
            word.copy_from_slice(&bytes[index * 8..index * 8 + 8]);
            u64::from_le_bytes(word)
        };
        if w(word::VERSION) != u64::from(version) {
            return Err(bad("its version differs from Py_Version"));
        }
        if w(word::FREE_THREADED) != 0 {
            return Err(PythonError::FreeThreaded { version });
        }
        // Each field must lie inside the struct whose size the same section gives.
        let field = |size: usize, offset: usize, width: u64| -> Result<u64, PythonError> {
            let (size, offset) = (w(size), w(offset));
            if size == 0 || size > MAX_STRUCT_SIZE {
                return Err(bad("a struct size is out of range"));
            }
            if offset.checked_add(width).is_none_or(|end| end > size) {
                return Err(bad("a field lies outside its struct"));
            }
            Ok(offset)
        };
        // Fields read as part of an object's header must also lie near its start.
        let near = |size: usize, offset: usize, width: u64| -> Result<u64, PythonError> {
            let offset = field(size, offset, width)?;
            if offset + width > MAX_HEADER_READ {
                return Err(bad("a field lies too far into its struct"));
            }
            Ok(offset)
        };
        let code = |offset| near(word::CODE_SIZE, offset, 8);
        let tstate = |offset| near(word::TSTATE_SIZE, offset, 8);
        let frame = |offset, width| near(word::FRAME_SIZE, offset, width);
        let unicode_ascii_size = w(word::UNICODE_ASCII_SIZE);
        // 3.13's `_unicode_object` section has no size of its own beyond PyUnicodeObject's;
        // the state and length must lie within PyASCIIObject.
        let unicode_state = w(word::UNICODE_STATE);
        let unicode_length = w(word::UNICODE_LENGTH);
        if unicode_ascii_size > 256
            || unicode_state + 4 > unicode_ascii_size
            || unicode_length + 8 > unicode_ascii_size
        {
            return Err(bad("the string offsets are out of range"));
        }
        Ok(Layout {
            runtime_interpreters_head: field(
                word::RUNTIME_SIZE,
                word::RUNTIME_INTERPRETERS_HEAD,
                8,
            )?,
            interp_next: field(word::INTERP_SIZE, word::INTERP_NEXT, 8)?,
            interp_threads_head: field(word::INTERP_SIZE, word::INTERP_THREADS_HEAD, 8)?,
            tstate_next: tstate(word::TSTATE_NEXT)?,
            tstate_interp: tstate(word::TSTATE_INTERP)?,
            tstate_thread_id: tstate(word::TSTATE_THREAD_ID)?,
            tstate_native_thread_id: tstate(word::TSTATE_NATIVE_THREAD_ID)?,
            tstate_frame: FrameAnchor::Direct(tstate(word::TSTATE_CURRENT_FRAME)?),
            frame_previous: frame(word::FRAME_PREVIOUS, 8)?,
            frame_code: frame(word::FRAME_EXECUTABLE, 8)?,
            frame_instr: frame(word::FRAME_INSTR_PTR, 8)?,
            frame_owner: frame(word::FRAME_OWNER, 1)?,
            // `FRAME_OWNED_BY_CSTACK` in 3.13's `internal/pycore_frame.h`; not published.
            frame_entry: EntryMarker::ShimOwner(3),
            object_type: near(word::OBJECT_SIZE, word::OBJECT_TYPE, 8)?,
            // Every PyVarObject keeps ob_size at the same place; 3.13 publishes it for tuples.
            code_units: near(word::TUPLE_SIZE, word::VAR_OBJECT_SIZE, 8)?,
            code_filename: code(word::CODE_FILENAME)?,
            code_name: code(word::CODE_NAME)?,
            code_qualname: code(word::CODE_QUALNAME)?,
            code_first_line: near(word::CODE_SIZE, word::CODE_FIRST_LINE, 4)?,
            // co_code_adaptive is a flexible array member: it may start at the struct's end.
            code_adaptive: field(word::CODE_SIZE, word::CODE_ADAPTIVE, 0)?,
            unicode_length,
            unicode_state,
            unicode_ascii_size,
            // PyCompactUnicodeObject adds `Py_ssize_t utf8_length` and `char *utf8` to
            // PyASCIIObject in 3.12 and 3.13.
            unicode_compact_size: unicode_ascii_size + 16,
        })
    }

    /// The table for `version` (`PY_VERSION_HEX`) when it is a final 3.11 or 3.12 release.
    pub fn from_table(version: u32) -> Option<Layout> {
        // Pre-releases (level 0xA alpha, 0xB beta, 0xC candidate) may differ from the finals
        // the tables were taken from.
        let final_release = (version >> 4) & 0xf == 0xf;
        match (version >> 16, final_release) {
            (0x030b, true) => Some(Layout::V3_11),
            (0x030c, true) => Some(Layout::V3_12),
            _ => None,
        }
    }

    /// The largest offset read from a code object's header, plus the bytes read there: how much
    /// of a code object one read must cover.
    pub fn code_header_len(&self) -> usize {
        let end = [
            self.object_type + 8,
            self.code_units + 8,
            self.code_filename + 8,
            self.code_name + 8,
            self.code_qualname + 8,
            self.code_first_line + 4,
        ]
        .into_iter()
        .max()
        .unwrap_or(0);
        usize::try_from(end).unwrap_or(usize::MAX)
    }

    /// The bytes of a frame one read must cover to see its code, caller, instruction and owner.
    pub fn frame_header_len(&self) -> usize {
        let entry = match self.frame_entry {
            EntryMarker::Flag(offset) => offset + 1,
            EntryMarker::ShimOwner(_) => 0,
        };
        let end = [
            self.frame_previous + 8,
            self.frame_code + 8,
            self.frame_instr + 8,
            self.frame_owner + 1,
            entry,
        ]
        .into_iter()
        .max()
        .unwrap_or(0);
        usize::try_from(end).unwrap_or(usize::MAX)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// 3.13.0's `_Py_DebugOffsets` as pyenv's x86-64 build of it holds it in
    /// `libpython3.13.so.1.0`, up to `unicode_object`, cookie and version aside.
    #[rustfmt::skip]
    const WORDS_3_13_0: [u64; DEBUG_OFFSETS_WORDS - 2] = [
        0, // free_threaded
        283320, 608, 632, // runtime_state
        194968, 7272, 7264, 7344, 7400, 7656, 7640, 7648, 16, 7752, 0, 7768, 7760, // interpreter
        304, 0, 8, 16, 72, 152, 160, 232, 32, // thread_state
        80, 8, 0, 56, 72, 70, // interpreter_frame
        208, 112, 120, 128, 136, 68, 52, 96, 104, 200, // code_object
        16, 8, // pyobject
        416, 24, 88, 168, // type_object
        32, 24, 16, // tuple_object
        40, 24, 16, // list_object
        48, 32, 40, // dict_object
        24, 16, // float_object
        32, 16, 24, // long_object
        40, 16, 32, // bytes_object
        64, 32, 16, 40, // unicode_object
    ];

    fn debug_offsets_3_13_0() -> Vec<u8> {
        let mut bytes = DEBUG_COOKIE.to_vec();
        bytes.extend_from_slice(&0x030d00f0u64.to_le_bytes());
        bytes.extend(WORDS_3_13_0.iter().flat_map(|w| w.to_le_bytes()));
        bytes
    }

    #[test]
    fn debug_offsets_of_3_13_give_the_walk_its_offsets() {
        let layout = Layout::from_debug_offsets(&debug_offsets_3_13_0(), 0x030d00f0).unwrap();
        assert_eq!(layout.runtime_interpreters_head, 632);
        assert_eq!(layout.interp_threads_head, 7344);
        assert_eq!(layout.tstate_frame, FrameAnchor::Direct(72));
        assert_eq!(layout.tstate_native_thread_id, 160);
        assert_eq!(layout.frame_owner, 70);
        assert_eq!(layout.code_adaptive, 200);
        assert_eq!(layout.code_first_line, 68);
        assert_eq!(layout.unicode_compact_size, 56);
        assert_eq!(layout.frame_header_len(), 71);
        assert_eq!(layout.code_header_len(), 136);
    }

    #[test]
    fn debug_offsets_that_disagree_with_the_binary_are_refused() {
        let good = debug_offsets_3_13_0();
        let version = 0x030d00f0;
        let mut bad_cookie = good.clone();
        bad_cookie[0] = b'y';
        assert!(matches!(
            Layout::from_debug_offsets(&bad_cookie, version),
            Err(PythonError::DebugOffsets { .. })
        ));
        assert!(matches!(
            Layout::from_debug_offsets(&good, 0x030d01f0),
            Err(PythonError::DebugOffsets { .. })
        ));
        let mut free_threaded = good.clone();
        free_threaded[16] = 1;
        assert!(matches!(
            Layout::from_debug_offsets(&free_threaded, version),
            Err(PythonError::FreeThreaded { .. })
        ));
        // current_frame beyond the thread state's size.
        let mut outside = good.clone();
        let index = 3 + 3 + 13 + 4;
        outside[index * 8..index * 8 + 8].copy_from_slice(&400u64.to_le_bytes());
        assert!(matches!(
            Layout::from_debug_offsets(&outside, version),
            Err(PythonError::DebugOffsets { .. })
        ));
        assert!(Layout::from_debug_offsets(&good[..100], version).is_err());
    }

    #[test]
    fn tables_cover_final_3_11_and_3_12_only() {
        assert_eq!(Layout::from_table(0x030b02f0), Some(Layout::V3_11));
        assert_eq!(Layout::from_table(0x030c01f0), Some(Layout::V3_12));
        assert_eq!(Layout::from_table(0x030c00b1), None);
        assert_eq!(Layout::from_table(0x030d00f0), None);
        assert_eq!(Layout::from_table(0x030a0df0), None);
        assert_eq!(Layout::V3_11.frame_header_len(), 70);
        assert_eq!(Layout::V3_12.frame_header_len(), 71);
    }

    proptest! {
        /// Whatever a binary holds, parsing gives an error or offsets whose reads stay small.
        #[test]
        fn any_debug_offsets_give_bounded_reads_or_an_error(
            words in proptest::collection::vec(
                prop_oneof![0u64..512, any::<u64>()],
                DEBUG_OFFSETS_WORDS - 2..DEBUG_OFFSETS_WORDS + 2,
            ),
        ) {
            let mut bytes = DEBUG_COOKIE.to_vec();
            bytes.extend_from_slice(&0x030d00f0u64.to_le_bytes());
            bytes.extend(words.iter().flat_map(|w| w.to_le_bytes()));
            if let Ok(layout) = Layout::from_debug_offsets(&bytes, 0x030d00f0) {
                prop_assert!(layout.frame_header_len() as u64 <= MAX_HEADER_READ);
                prop_assert!(layout.code_header_len() as u64 <= MAX_HEADER_READ);
                prop_assert!(layout.unicode_compact_size <= 256 + 16);
            }
        }
    }
}
