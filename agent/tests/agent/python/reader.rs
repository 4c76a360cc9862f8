//! The user-space reader against live interpreters: each script blocks in C (`time.sleep`) once
//! it has reported its stacks, so that they hold still while the reader walks them.

use super::*;

/// `serve → handler → Handler.handle → recurse ×6 → leaf`, blocked in the leaf.
const CALL_TREE: &str = r#"
class Handler:
    def handle(self, depth):
        return recurse(depth)

def recurse(n):
    if n == 0:
        return leaf()
    return recurse(n - 1)

def leaf():
    report("leaf")
    block()

def handler():
    return Handler().handle(5)

def serve():
    return handler()

serve()
"#;

/// Three threads in three functions, the main thread in a fourth.
const THREADS: &str = r#"
def worker_a():
    report("a")
    block()

def worker_b():
    report("b")
    block()

def worker_c():
    report("c")
    block()

def main_thread():
    for target in (worker_a, worker_b, worker_c):
        threading.Thread(target=target, daemon=True).start()
    report("main")
    block()

main_thread()
"#;

/// `sorted` (C) calls the Python `key`, which blocks on its second item.
const CALLBACK: &str = r#"
def key(item):
    if item == 2:
        report("key")
        block()
    return item

def sort_items():
    return sorted([3, 1, 2], key=key)

sort_items()
"#;

#[test]
fn the_reader_walks_a_known_call_tree_with_files_and_first_lines() {
    let _host = crate::util::exclusive();
    let dir = tempfile::tempdir().unwrap();
    for (label, python) in interpreters() {
        let mut script = Script::start(&python, dir.path(), "call_tree", CALL_TREE);
        let report = script.reports(1).pop().unwrap();
        let (found, mut process) = attach(script.pid());
        let target = found.target.unwrap();
        assert_eq!(target.version.0, report.hexversion, "{label}: version");
        let expected = expected_names(&report);
        let stack = stack_of(&mut process, report.tid, &expected);
        let names = names(&stack);
        assert_eq!(names[1..], expected[..], "{label}: frames");
        let file = script.path.display().to_string();
        let block_line = PRELUDE
            .lines()
            .position(|line| line == "def block():")
            .unwrap()
            + 1;
        assert_eq!(
            names[0],
            format!("block ({file}:{block_line})"),
            "{label}: leaf"
        );
        // serve → handler → Handler.handle → recurse x6 → leaf, as the script wrote them.
        let qualnames: Vec<&str> = report.frames.iter().map(|f| f.0.as_str()).collect();
        assert_eq!(
            qualnames,
            [
                "leaf",
                "recurse",
                "recurse",
                "recurse",
                "recurse",
                "recurse",
                "recurse",
                "Handler.handle",
                "handler",
                "serve",
                "<module>"
            ],
            "{label}"
        );
        for frame in &stack.frames {
            let units = process.name(frame.raw.code).unwrap().units;
            assert!(
                process.instruction_in_code(frame.raw.code, units, frame.raw.instr),
                "{label}: {} points outside its code",
                frame.name
            );
        }
    }
}

#[test]
fn the_reader_finds_every_thread_with_its_own_function() {
    let _host = crate::util::exclusive();
    let dir = tempfile::tempdir().unwrap();
    for (label, python) in interpreters() {
        let mut script = Script::start(&python, dir.path(), "threads", THREADS);
        let reports = script.reports(4);
        let (_, mut process) = attach(script.pid());
        let mut leaves = HashMap::new();
        for report in &reports {
            let expected = expected_names(report);
            let stack = stack_of(&mut process, report.tid, &expected);
            assert_eq!(
                names(&stack)[1..],
                expected[..],
                "{label}: thread {}",
                report.tag
            );
            leaves.insert(report.tag.clone(), report.frames[0].0.clone());
        }
        assert_eq!(leaves["a"], "worker_a", "{label}");
        assert_eq!(leaves["b"], "worker_b", "{label}");
        assert_eq!(leaves["c"], "worker_c", "{label}");
        assert_eq!(leaves["main"], "main_thread", "{label}");
        let threads = process.threads().unwrap();
        assert_eq!(threads.len(), 4, "{label}: one thread state per thread");
        assert!(
            threads.iter().all(|t| t.interp == threads[0].interp),
            "{label}: one interpreter"
        );
    }
}

#[test]
fn the_reader_marks_the_python_callback_of_a_c_function_as_an_entry_frame() {
    let _host = crate::util::exclusive();
    let dir = tempfile::tempdir().unwrap();
    for (label, python) in interpreters() {
        let mut script = Script::start(&python, dir.path(), "callback", CALLBACK);
        let report = script.reports(1).pop().unwrap();
        let (_, mut process) = attach(script.pid());
        let expected = expected_names(&report);
        let stack = stack_of(&mut process, report.tid, &expected);
        assert_eq!(names(&stack)[1..], expected[..], "{label}");
        let entries: Vec<(&str, bool)> = stack.frames[1..]
            .iter()
            .zip(&report.frames)
            .map(|(frame, reported)| (reported.0.as_str(), frame.raw.entry))
            .collect();
        // sorted() runs key in a C-level call of the interpreter loop; <module> is the first
        // frame of the outermost one.
        assert_eq!(
            entries,
            [("key", true), ("sort_items", false), ("<module>", true)],
            "{label}"
        );
    }
}

#[test]
fn a_virtualenv_runs_the_interpreter_it_was_made_from() {
    let _host = crate::util::exclusive();
    let dir = tempfile::tempdir().unwrap();
    let venv = virtualenv(dir.path(), 12);
    let mut script = Script::start(&venv, dir.path(), "venv", CALL_TREE);
    let report = script.reports(1).pop().unwrap();
    let (found, mut process) = attach(script.pid());
    assert!(
        found
            .path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("libpython3.12.so"),
        "{}",
        found.path.display()
    );
    let expected = expected_names(&report);
    let stack = stack_of(&mut process, report.tid, &expected);
    assert_eq!(names(&stack)[1..], expected[..]);
}

#[test]
fn older_interpreters_are_detected_and_left_unsupported() {
    let _host = crate::util::exclusive();
    let root = pyenv_root().join("versions");
    let dir = tempfile::tempdir().unwrap();
    let mut seen = Vec::new();
    for entry in std::fs::read_dir(&root).unwrap().flatten() {
        let name = entry.file_name().into_string().unwrap();
        let Some(minor) = name
            .split('.')
            .nth(1)
            .and_then(|m| m.parse::<u32>().ok())
            .filter(|_| name.chars().all(|c| c.is_ascii_digit() || c == '.'))
        else {
            continue;
        };
        let major = name.split('.').next().unwrap();
        if (major, minor) >= ("3", 11) {
            continue;
        }
        let python = entry.path().join(format!("bin/python{major}.{minor}"));
        let body = "import time\ntime.sleep(3600)\n";
        let path = dir.path().join(format!("{name}.py"));
        std::fs::write(&path, body).unwrap();
        let mut child = Command::new(&python).arg(&path).spawn().unwrap();
        // Detection reads the maps: wait for libpython to be mapped.
        std::thread::sleep(Duration::from_millis(500));
        let found = Detector::default()
            .process(Path::new("/proc"), child.id())
            .unwrap();
        let _ = child.kill();
        let _ = child.wait();
        let found = found.unwrap_or_else(|| panic!("{name} is detected as CPython"));
        assert_eq!(found.target, Err(Unsupported::Older), "{name}");
        assert_eq!(found.interpreter.version_label(), "older", "{name}");
        seen.push(name);
    }
    assert!(
        seen.iter().any(|v| v.starts_with("3.10.")),
        "pyenv has no CPython 3.10 in {}: install it with \
         `env PYTHON_CONFIGURE_OPTS=--enable-shared pyenv install 3.10`",
        root.display()
    );
}

/// A copy of pyenv's `libpython3.13.so` in `dir` whose `Py_Version` says `version`: a release
/// this machine does not have, as detection sees it.
fn libpython_claiming(dir: &Path, version: u32) -> PathBuf {
    use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
    let library = pyenv_python(13)
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("lib/libpython3.13.so.1.0");
    let mut bytes = std::fs::read(&library).unwrap();
    let at = {
        let elf = object::File::parse(&bytes[..]).unwrap();
        let symbol = elf
            .dynamic_symbols()
            .find(|s| s.name() == Ok("Py_Version"))
            .expect("libpython exports Py_Version");
        let section = elf
            .section_by_index(symbol.section_index().unwrap())
            .unwrap();
        let (offset, _) = section.file_range().unwrap();
        (symbol.address() - section.address() + offset) as usize
    };
    assert_eq!(
        u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) >> 16,
        0x030d,
        "Py_Version of 3.13 found"
    );
    bytes[at..at + 8].copy_from_slice(&u64::from(version).to_le_bytes());
    let copy = dir.join(format!("libpython-{version:x}.so"));
    std::fs::write(&copy, bytes).unwrap();
    copy
}

#[test]
fn releases_are_walked_only_where_their_layout_is_known() {
    let dir = tempfile::tempdir().unwrap();
    let detect = |version: u32| {
        let interpreter = inspect(&libpython_claiming(dir.path(), version))
            .unwrap()
            .expect("still CPython");
        assert_eq!(interpreter.version.map(|v| v.0), Some(version));
        (interpreter.layout, interpreter.version_label())
    };
    // 3.14 (tagged frame references): detected, counted as newer, left native.
    assert_eq!(detect(0x030e00f0), (Err(Unsupported::Newer), "newer"));
    assert_eq!(detect(0x030f02f0), (Err(Unsupported::Newer), "newer"));
    // Any final 3.11.x or 3.12.x takes its minor release's table (see layout.rs for why);
    // their pre-releases do not.
    assert_eq!(detect(0x030b0ef0), (Ok(Layout::V3_11), "3.11"));
    assert_eq!(detect(0x030c0af0), (Ok(Layout::V3_12), "3.12"));
    assert_eq!(detect(0x030c00c1), (Err(Unsupported::PreRelease), "3.12"));
}

/// Prints `offsetof`/`sizeof` of every field the layouts hold, compiled against a release's
/// internal headers.
const OFFSETS_C: &str = r#"
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#include "internal/pycore_runtime.h"
#include "internal/pycore_interp.h"
#include "internal/pycore_frame.h"
#include "internal/pycore_code.h"
#define P(name, expr) printf("%s %zu\n", name, (size_t)(expr))
int main(void) {
    P("runtime_interpreters_head", offsetof(_PyRuntimeState, interpreters.head));
    P("interp_next", offsetof(PyInterpreterState, next));
    P("interp_threads_head", offsetof(PyInterpreterState, threads.head));
    P("tstate_next", offsetof(PyThreadState, next));
    P("tstate_interp", offsetof(PyThreadState, interp));
    P("tstate_thread_id", offsetof(PyThreadState, thread_id));
    P("tstate_native_thread_id", offsetof(PyThreadState, native_thread_id));
#if PY_VERSION_HEX >= 0x030d0000
    P("tstate_current_frame", offsetof(PyThreadState, current_frame));
    P("frame_code", offsetof(_PyInterpreterFrame, f_executable));
    P("frame_instr", offsetof(_PyInterpreterFrame, instr_ptr));
#else
    P("tstate_cframe", offsetof(PyThreadState, cframe));
    P("cframe_current_frame", offsetof(_PyCFrame, current_frame));
    P("frame_code", offsetof(_PyInterpreterFrame, f_code));
    P("frame_instr", offsetof(_PyInterpreterFrame, prev_instr));
#endif
#if PY_VERSION_HEX >= 0x030c0000
    P("frame_shim_owner", FRAME_OWNED_BY_CSTACK);
#else
    P("frame_is_entry", offsetof(_PyInterpreterFrame, is_entry));
#endif
    P("frame_previous", offsetof(_PyInterpreterFrame, previous));
    P("frame_owner", offsetof(_PyInterpreterFrame, owner));
    P("object_type", offsetof(PyObject, ob_type));
    P("code_units", offsetof(PyVarObject, ob_size));
    P("code_filename", offsetof(PyCodeObject, co_filename));
    P("code_name", offsetof(PyCodeObject, co_name));
    P("code_qualname", offsetof(PyCodeObject, co_qualname));
    P("code_first_line", offsetof(PyCodeObject, co_firstlineno));
    P("code_adaptive", offsetof(PyCodeObject, co_code_adaptive));
    P("unicode_length", offsetof(PyASCIIObject, length));
    P("unicode_state", offsetof(PyASCIIObject, state));
    P("unicode_ascii_size", sizeof(PyASCIIObject));
    P("unicode_compact_size", sizeof(PyCompactUnicodeObject));
    return 0;
}
"#;

/// `layout` as the names [`OFFSETS_C`] prints.
fn layout_fields(layout: &Layout) -> HashMap<&'static str, u64> {
    let mut fields = HashMap::from([
        (
            "runtime_interpreters_head",
            layout.runtime_interpreters_head,
        ),
        ("interp_next", layout.interp_next),
        ("interp_threads_head", layout.interp_threads_head),
        ("tstate_next", layout.tstate_next),
        ("tstate_interp", layout.tstate_interp),
        ("tstate_thread_id", layout.tstate_thread_id),
        ("tstate_native_thread_id", layout.tstate_native_thread_id),
        ("frame_code", layout.frame_code),
        ("frame_instr", layout.frame_instr),
        ("frame_previous", layout.frame_previous),
        ("frame_owner", layout.frame_owner),
        ("object_type", layout.object_type),
        ("code_units", layout.code_units),
        ("code_filename", layout.code_filename),
        ("code_name", layout.code_name),
        ("code_qualname", layout.code_qualname),
        ("code_first_line", layout.code_first_line),
        ("code_adaptive", layout.code_adaptive),
        ("unicode_length", layout.unicode_length),
        ("unicode_state", layout.unicode_state),
        ("unicode_ascii_size", layout.unicode_ascii_size),
        ("unicode_compact_size", layout.unicode_compact_size),
    ]);
    match layout.tstate_frame {
        FrameAnchor::Direct(offset) => {
            fields.insert("tstate_current_frame", offset);
        }
        FrameAnchor::CFrame {
            cframe,
            current_frame,
        } => {
            fields.insert("tstate_cframe", cframe);
            fields.insert("cframe_current_frame", current_frame);
        }
    }
    match layout.frame_entry {
        EntryMarker::Flag(offset) => fields.insert("frame_is_entry", offset),
        EntryMarker::ShimOwner(owner) => fields.insert("frame_shim_owner", u64::from(owner)),
    };
    fields
}

/// What [`OFFSETS_C`] prints when compiled against `include`.
fn header_fields(include: &Path, dir: &Path) -> HashMap<String, u64> {
    let source = dir.join("offsets.c");
    std::fs::write(&source, OFFSETS_C).unwrap();
    let exe = dir.join("offsets");
    let status = Command::new("gcc")
        .arg("-I")
        .arg(include)
        .arg("-o")
        .arg(&exe)
        .arg(&source)
        .status()
        .expect("gcc runs");
    assert!(status.success(), "compiling against {}", include.display());
    let out = Command::new(&exe).output().unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let (name, value) = line.split_once(' ').unwrap();
            (name.to_owned(), value.parse().unwrap())
        })
        .collect()
}

#[test]
fn the_layouts_match_the_headers_of_each_release() {
    let dir = tempfile::tempdir().unwrap();
    for (label, python) in interpreters() {
        let (include, layout) = if label == "debian-3.11" {
            assert!(
                Path::new("/usr/include/python3.11/internal/pycore_frame.h").exists(),
                "Debian's CPython headers are missing: apt-get install python3.11-dev"
            );
            (PathBuf::from("/usr/include/python3.11"), Layout::V3_11)
        } else {
            let prefix = python.parent().unwrap().parent().unwrap();
            let minor = label.trim_start_matches("pyenv-");
            let include = prefix.join(format!("include/python{minor}"));
            let layout = match minor {
                "3.11" => Layout::V3_11,
                "3.12" => Layout::V3_12,
                // 3.13's layout comes from the binary's _Py_DebugOffsets.
                _ => {
                    let library = prefix.join(format!("lib/libpython{minor}.so.1.0"));
                    inspect(&library)
                        .unwrap()
                        .expect("libpython is CPython")
                        .layout
                        .expect("3.13 is supported")
                }
            };
            (include, layout)
        };
        let headers = header_fields(&include, dir.path());
        let layout = layout_fields(&layout);
        for (name, value) in &layout {
            assert_eq!(
                headers.get(*name),
                Some(value),
                "{label}: {name} differs from {}",
                include.display()
            );
        }
        assert_eq!(headers.len(), layout.len(), "{label}: every field compared");
    }
}

/// The main thread runs `sub_leaf` in a subinterpreter (`run_string` blocks until it returns).
const SUBINTERPRETER: &str = r#"
try:
    import _interpreters as interpreters
except ImportError:
    import _xxsubinterpreters as interpreters

def enter():
    report("main")
    interpreters.run_string(interpreters.create(), SUB)

enter()
"#;

#[test]
fn the_reader_finds_the_threads_of_subinterpreters() {
    let _host = crate::util::exclusive();
    let dir = tempfile::tempdir().unwrap();
    let sub = format!("{PRELUDE}\ndef sub_leaf():\n    report('sub')\n    block()\n\nsub_leaf()\n");
    let body = format!("SUB = {sub:?}\n{SUBINTERPRETER}");
    for (label, python) in interpreters() {
        let mut script = Script::start(&python, dir.path(), "subinterpreter", &body);
        let reports = script.reports(2);
        let (_, mut process) = attach(script.pid());
        assert_eq!(process.interpreters().unwrap().len(), 2, "{label}");
        let (main, sub) = (&reports[0], &reports[1]);
        assert_eq!(main.tid, sub.tid, "{label}: one thread in two interpreters");
        let expected = expected_names(sub);
        // The subinterpreter is the newer, so its thread state is found first.
        let stack = stack_of(&mut process, sub.tid, &expected);
        assert_eq!(names(&stack)[1..], expected[..], "{label}");
        assert_eq!(sub.frames[0].0, "sub_leaf", "{label}");
        let stacks = process.stacks().unwrap();
        let outer: Vec<&ThreadStack> = stacks
            .iter()
            .filter(|s| {
                s.thread.native_thread_id == main.tid && s.thread.interp != stack.thread.interp
            })
            .collect();
        assert_eq!(
            outer.len(),
            1,
            "{label}: the main interpreter's state of the thread"
        );
        assert_eq!(
            names(outer[0]),
            expected_names(main),
            "{label}: paused in run_string"
        );
    }
}

#[test]
fn musl_processes_are_detected_and_left_unsupported() {
    // A process as /proc would show one: Debian's python3.11 mapped beside musl's loader, its
    // binary reached through the process's root (as in a container).
    let proc = tempfile::tempdir().unwrap();
    let dir = proc.path().join("4242");
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::symlink("/", dir.join("root")).unwrap();
    std::os::unix::fs::symlink("/usr/bin/python3.11", dir.join("exe")).unwrap();
    let python = std::fs::metadata("/usr/bin/python3.11").unwrap();
    // The device number only has to be the same on both lines.
    let maps = format!(
        "00400000-00a00000 r-xp 00000000 fd:01 {} /usr/bin/python3.11\n\
         7f0000000000-7f0000100000 r-xp 00000000 fd:01 77 /lib/ld-musl-x86_64.so.1\n",
        python.ino(),
    );
    std::fs::write(dir.join("maps"), maps).unwrap();
    let found = Detector::default()
        .process(proc.path(), 4242)
        .unwrap()
        .expect("CPython is detected");
    assert_eq!(found.target, Err(Unsupported::Musl));
    assert_eq!(found.interpreter.version_label(), "3.11");
}
