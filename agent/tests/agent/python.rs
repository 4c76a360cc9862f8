//! CPython processes read from user space: detection, the offsets of each release, threads and
//! frames, against real interpreters the tests do not modify (Debian's `/usr/bin/python3.11`,
//! pyenv's 3.11, 3.12 and 3.13 built with `--enable-shared`). A missing interpreter fails the
//! test by name. Each script reports its own stacks with `sys._getframe` (the interpreter's view,
//! measured in the same run), then blocks in C (`time.sleep`) so that its stack holds still
//! while the reader walks it.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use smolder_agent::ebpf::python::{
    Detector, EntryMarker, FrameAnchor, Layout, ProcessInterpreter, PythonProcess, Target,
    ThreadStack, Unsupported, inspect,
};

/// Imported by every script: `report(tag)` prints the caller's stack as the interpreter sees it.
const PRELUDE: &str = r#"
import json, sys, threading, time

REPORTING = threading.Lock()

def report(tag):
    frame = sys._getframe(1)
    frames = []
    while frame is not None:
        code = frame.f_code
        frames.append([code.co_qualname, code.co_filename, code.co_firstlineno])
        frame = frame.f_back
    line = json.dumps({"tag": tag, "tid": threading.get_native_id(), "hexversion": sys.hexversion,
                       "frames": frames})
    with REPORTING:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

def block():
    while True:
        time.sleep(3600)
"#;

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

/// `pyenv root`, or a failure saying pyenv is missing.
fn pyenv_root() -> PathBuf {
    let out = Command::new("pyenv").arg("root").output().expect(
        "pyenv is not installed: the Python tests need CPython 3.11, 3.12 and 3.13 under pyenv",
    );
    assert!(out.status.success(), "`pyenv root` failed");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// The newest final pyenv build of `3.minor`, or a failure naming it.
fn pyenv_python(minor: u32) -> PathBuf {
    let versions = pyenv_root().join("versions");
    let prefix = format!("3.{minor}.");
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir(&versions)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let micro: u32 = name.strip_prefix(&prefix)?.parse().ok()?;
            let python = entry.path().join(format!("bin/python3.{minor}"));
            python.exists().then_some((micro, python))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, python)| python).unwrap_or_else(|| {
        panic!(
            "pyenv has no CPython 3.{minor} in {}: install it with \
             `env PYTHON_CONFIGURE_OPTS=--enable-shared pyenv install 3.{minor}`",
            versions.display()
        )
    })
}

/// The interpreters every test runs: Debian's static 3.11 and pyenv's shared 3.11 to 3.13.
fn interpreters() -> Vec<(String, PathBuf)> {
    let debian = PathBuf::from("/usr/bin/python3.11");
    assert!(
        debian.exists(),
        "Debian's /usr/bin/python3.11 is missing: apt-get install python3.11"
    );
    let mut all = vec![("debian-3.11".to_owned(), debian)];
    for minor in [11, 12, 13] {
        all.push((format!("pyenv-3.{minor}"), pyenv_python(minor)));
    }
    all
}

/// What a script reported of one of its threads.
#[derive(Debug)]
struct Report {
    tag: String,
    tid: u64,
    hexversion: u32,
    /// (qualname, filename, first line), leaf first.
    frames: Vec<(String, String, i32)>,
}

/// A running script; killed when dropped.
struct Script {
    child: Child,
    stdout: BufReader<ChildStdout>,
    path: PathBuf,
}

impl Script {
    fn start(python: &Path, dir: &Path, name: &str, body: &str) -> Script {
        let path = dir.join(format!("{name}.py"));
        std::fs::write(&path, format!("{PRELUDE}{body}")).unwrap();
        let mut child = Command::new(python)
            .arg(&path)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|err| panic!("starting {}: {err}", python.display()));
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Script {
            child,
            stdout,
            path,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next `count` reports.
    fn reports(&mut self, count: usize) -> Vec<Report> {
        (0..count)
            .map(|_| {
                let mut line = String::new();
                self.stdout.read_line(&mut line).unwrap();
                assert!(!line.is_empty(), "{} exited early", self.path.display());
                let value: serde_json::Value = serde_json::from_str(&line).unwrap();
                Report {
                    tag: value["tag"].as_str().unwrap().to_owned(),
                    tid: value["tid"].as_u64().unwrap(),
                    hexversion: value["hexversion"].as_u64().unwrap() as u32,
                    frames: value["frames"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|f| {
                            (
                                f[0].as_str().unwrap().to_owned(),
                                f[1].as_str().unwrap().to_owned(),
                                f[2].as_i64().unwrap() as i32,
                            )
                        })
                        .collect(),
                }
            })
            .collect()
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Detects and attaches to `pid`, which must run a supported interpreter.
fn attach(pid: u32) -> (ProcessInterpreter, PythonProcess) {
    let found = Detector::default()
        .process(Path::new("/proc"), pid)
        .unwrap()
        .expect("CPython is detected");
    let target: Target = found.target.expect("the interpreter is supported");
    let process = PythonProcess::attach(Path::new("/proc"), pid, target).unwrap();
    (found, process)
}

/// The frame names a report expects, leaf first.
fn expected_names(report: &Report) -> Vec<String> {
    report
        .frames
        .iter()
        .map(|(qualname, file, line)| format!("{qualname} ({file}:{line})"))
        .collect()
}

fn names(stack: &ThreadStack) -> Vec<String> {
    stack.frames.iter().map(|f| f.name.to_string()).collect()
}

/// Reads `process` until the thread `tid` shows `expected` (it may still be on its way from
/// `report` to `block`), failing with the last stack read after ten seconds.
fn stack_of(process: &mut PythonProcess, tid: u64, expected: &[String]) -> ThreadStack {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stacks = process.stacks().unwrap();
        let stack = stacks
            .into_iter()
            .find(|s| s.thread.native_thread_id == tid)
            .unwrap_or_else(|| panic!("no thread state with native id {tid}"));
        // block() is the leaf while the thread sleeps; the report stopped at its caller.
        let names = names(&stack);
        let blocked = names
            .first()
            .is_some_and(|leaf| leaf.starts_with("block ("));
        if (blocked && names.get(1..) == Some(expected)) || Instant::now() > deadline {
            return stack;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_reader_walks_a_known_call_tree_with_files_and_first_lines() {
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
    let dir = tempfile::tempdir().unwrap();
    let python = pyenv_python(12);
    let venv = dir.path().join("venv");
    let status = Command::new(&python)
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .status()
        .unwrap();
    assert!(status.success(), "creating a virtualenv");
    let mut script = Script::start(&venv.join("bin/python"), dir.path(), "venv", CALL_TREE);
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

// The kernel walk: the real sampler, loaded as root, sampling CPU-bound scripts. Each script
// reports its stacks as the interpreter sees them, then spins in the reported frame (an inline
// loop: no Python call below it) until its end; every sample of it must carry that stack.

/// Spins in `leaf` under `serve → handler → Handler.handle → recurse ×6`.
const SPIN_TREE: &str = r#"
END = time.monotonic() + float(sys.argv[1])

class Handler:
    def handle(self, depth):
        return recurse(depth)

def recurse(n):
    if n == 0:
        return leaf()
    return recurse(n - 1)

def leaf():
    report("leaf")
    while time.monotonic() < END:
        pass

def handler():
    return Handler().handle(5)

def serve():
    return handler()

serve()
"#;

/// Three threads spinning in three functions, the main thread in a fourth.
const SPIN_THREADS: &str = r#"
END = time.monotonic() + float(sys.argv[1])

def worker_a():
    report("a")
    while time.monotonic() < END:
        pass

def worker_b():
    report("b")
    while time.monotonic() < END:
        pass

def worker_c():
    report("c")
    while time.monotonic() < END:
        pass

def main_thread():
    for target in (worker_a, worker_b, worker_c):
        threading.Thread(target=target, daemon=True).start()
    report("main")
    while time.monotonic() < END:
        pass

main_thread()
"#;

/// `sorted` (C) calls the Python `key`, which spins on its second item.
const SPIN_CALLBACK: &str = r#"
END = time.monotonic() + float(sys.argv[1])

def key(item):
    if item == 2:
        report("key")
        while time.monotonic() < END:
            pass
    return item

def sort_items():
    return sorted([3, 1, 2], key=key)

sort_items()
"#;

/// A running script under the sampler: its service name is the script's name.
struct Spinner {
    script: Script,
    service: String,
}

impl Spinner {
    /// Starts `body` as `smolder-py-<name>.py` with `python` (through `wrapper`, such as
    /// `unshare`, when given), spinning for `seconds`.
    fn start(
        wrapper: &[&str],
        python: &Path,
        dir: &Path,
        name: &str,
        body: &str,
        seconds: f64,
    ) -> Spinner {
        let service = format!("smolder-py-{name}");
        let path = dir.join(format!("{service}.py"));
        std::fs::write(&path, format!("{PRELUDE}{body}")).unwrap();
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(python);
                command
            }
            None => Command::new(python),
        };
        let mut child = command
            .arg(&path)
            .arg(seconds.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|err| panic!("starting {}: {err}", python.display()));
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Spinner {
            script: Script {
                child,
                stdout,
                path,
            },
            service,
        }
    }
}

/// Records `seconds` of the scripts whose file is `smolder-py-*.py`, each under its own
/// service: the script's name.
fn record_scripts(seconds: u64) -> Vec<smolder_common::Profile> {
    let mut config = smolder_agent::config::Config::default();
    config.ebpf.relabel_configs = serde_norway::from_str(
        r#"
- source_labels: [__meta_process_cmdline]
  regex: '.*/(smolder-py-[^ /]+)\.py( .*)?'
  action: keep
- source_labels: [__meta_process_cmdline]
  regex: '.*/(smolder-py-[^ /]+)\.py( .*)?'
  target_label: service_name
  replacement: $1
"#,
    )
    .unwrap();
    smolder_agent::ebpf::record(&config, Duration::from_secs(seconds)).unwrap()
}

/// Every stack of `service` as `;`-joined names, with its samples.
fn folded(profiles: &[smolder_common::Profile], service: &str) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for profile in profiles.iter().filter(|p| p.series.service() == service) {
        profile.tree.for_each_stack(|stack, value| {
            let names: Vec<&str> = stack
                .iter()
                .map(|&id| profile.tree.frames().name(id))
                .collect();
            out.push((names.join(";"), value));
        });
    }
    out
}

/// The stack a report describes, root first and `;`-joined, as the agent names it.
fn root_first(report: &Report) -> String {
    let mut names = expected_names(report);
    names.reverse();
    names.join(";")
}

/// Samples of `stacks` whose Python frames are exactly `python` (kernel frames may follow).
fn carrying(stacks: &[(String, u64)], python: &str) -> u64 {
    stacks
        .iter()
        .filter(|(stack, _)| {
            stack == python
                || stack
                    .strip_prefix(python)
                    .is_some_and(|rest| rest.starts_with(';') && !rest.contains(" ("))
        })
        .map(|(_, n)| n)
        .sum()
}

fn total(stacks: &[(String, u64)]) -> u64 {
    stacks.iter().map(|(_, n)| n).sum()
}

#[test]
fn python_stacks_carry_the_call_tree_with_files_and_first_lines() {
    let _host = crate::ebpf::exclusive();
    let dir = tempfile::tempdir().unwrap();
    let mut spinners: Vec<(String, Spinner)> = interpreters()
        .into_iter()
        .map(|(label, python)| {
            let spinner = Spinner::start(
                &[],
                &python,
                dir.path(),
                &format!("tree-{label}"),
                SPIN_TREE,
                12.0,
            );
            (label, spinner)
        })
        .collect();
    let reports: Vec<Report> = spinners
        .iter_mut()
        .map(|(_, s)| s.script.reports(1).pop().unwrap())
        .collect();
    let profiles = record_scripts(8);
    for ((label, spinner), report) in spinners.iter().zip(&reports) {
        let stacks = folded(&profiles, &spinner.service);
        let expected = root_first(report);
        let (carried, all) = (carrying(&stacks, &expected), total(&stacks));
        assert!(all >= 50, "{label}: too few samples ({all}): {stacks:?}");
        assert!(
            carried as f64 >= 0.95 * all as f64,
            "{label}: {carried} of {all} samples carry {expected}: {stacks:#?}"
        );
    }
}

#[test]
fn python_threads_each_carry_their_own_function() {
    let _host = crate::ebpf::exclusive();
    let dir = tempfile::tempdir().unwrap();
    let mut spinners: Vec<(String, Spinner)> = interpreters()
        .into_iter()
        .map(|(label, python)| {
            let name = format!("threads-{label}");
            let spinner = Spinner::start(&[], &python, dir.path(), &name, SPIN_THREADS, 12.0);
            (label, spinner)
        })
        .collect();
    let reports: Vec<Vec<Report>> = spinners
        .iter_mut()
        .map(|(_, s)| s.script.reports(4))
        .collect();
    let profiles = record_scripts(8);
    for ((label, spinner), reports) in spinners.iter().zip(&reports) {
        let stacks = folded(&profiles, &spinner.service);
        let all = total(&stacks);
        let mut carried = 0;
        for report in reports {
            let own = carrying(&stacks, &root_first(report));
            // The GIL lets one thread run Python code at a time, yet each gets its turns.
            assert!(
                own > 0,
                "{label}: no sample of thread {}: {stacks:#?}",
                report.tag
            );
            carried += own;
        }
        assert!(all >= 50, "{label}: too few samples ({all})");
        assert!(
            carried as f64 >= 0.95 * all as f64,
            "{label}: {carried} of {all} samples carry their thread's own stack: {stacks:#?}"
        );
    }
}

#[test]
fn a_python_callback_of_a_c_function_follows_its_python_caller() {
    let _host = crate::ebpf::exclusive();
    let dir = tempfile::tempdir().unwrap();
    let mut spinners: Vec<(String, Spinner)> = interpreters()
        .into_iter()
        .map(|(label, python)| {
            let name = format!("callback-{label}");
            let spinner = Spinner::start(&[], &python, dir.path(), &name, SPIN_CALLBACK, 10.0);
            (label, spinner)
        })
        .collect();
    let reports: Vec<Report> = spinners
        .iter_mut()
        .map(|(_, s)| s.script.reports(1).pop().unwrap())
        .collect();
    let profiles = record_scripts(6);
    for ((label, spinner), report) in spinners.iter().zip(&reports) {
        let stacks = folded(&profiles, &spinner.service);
        let expected = root_first(report);
        // Python frames only: sorted()'s native frames between sort_items and key come with
        // mixed stacks (the DWARF unwinder, issue 14).
        assert!(expected.contains("sort_items ("), "{label}: {expected}");
        assert!(expected.ends_with(&format!(";{}", expected_names(report)[0])));
        let (carried, all) = (carrying(&stacks, &expected), total(&stacks));
        assert!(all >= 50, "{label}: too few samples ({all})");
        assert!(
            carried as f64 >= 0.95 * all as f64,
            "{label}: {carried} of {all} samples carry {expected}: {stacks:#?}"
        );
    }
}

#[test]
fn a_python_process_that_exits_before_the_drain_keeps_its_names() {
    let _host = crate::ebpf::exclusive();
    let dir = tempfile::tempdir().unwrap();
    let mut spinners: Vec<(String, Spinner)> = interpreters()
        .into_iter()
        .map(|(label, python)| {
            let name = format!("exit-{label}");
            let spinner = Spinner::start(&[], &python, dir.path(), &name, SPIN_TREE, 3.0);
            (label, spinner)
        })
        .collect();
    let reports: Vec<Report> = spinners
        .iter_mut()
        .map(|(_, s)| s.script.reports(1).pop().unwrap())
        .collect();
    // The scripts exit about two seconds into the recording.
    let profiles = record_scripts(6);
    for ((label, spinner), report) in spinners.iter_mut().zip(&reports) {
        assert!(
            spinner.script.child.try_wait().unwrap().is_some(),
            "{label}: still running at the drain"
        );
        let stacks = folded(&profiles, &spinner.service);
        let expected = root_first(report);
        let carried = carrying(&stacks, &expected);
        assert!(
            carried >= 20,
            "{label}: {carried} samples carry {expected}: {stacks:#?}"
        );
        assert!(
            stacks
                .iter()
                .all(|(stack, _)| !stack.contains(smolder_agent::ebpf::python::UNKNOWN_CODE)),
            "{label}: unnamed frames: {stacks:#?}"
        );
    }
}

#[test]
fn python_stacks_of_a_process_in_its_own_pid_namespace() {
    let _host = crate::ebpf::exclusive();
    let dir = tempfile::tempdir().unwrap();
    let python = pyenv_python(13);
    // A container's view: the interpreter is pid 1 and knows its threads by namespace ids.
    let wrapper = ["unshare", "--pid", "--fork", "--mount-proc"];
    let mut spinner = Spinner::start(
        &wrapper,
        &python,
        dir.path(),
        "container",
        SPIN_THREADS,
        10.0,
    );
    let reports = spinner.script.reports(4);
    assert!(
        reports.iter().all(|r| r.tid < 100),
        "namespace ids: {reports:?}"
    );
    let profiles = record_scripts(6);
    let stacks = folded(&profiles, &spinner.service);
    let all = total(&stacks);
    let carried: u64 = reports
        .iter()
        .map(|report| carrying(&stacks, &root_first(report)))
        .sum();
    assert!(all >= 50, "too few samples ({all})");
    assert!(
        carried as f64 >= 0.95 * all as f64,
        "{carried} of {all} samples carry their thread's stack: {stacks:#?}"
    );
}

/// Sums the values of `name`'s series whose labels include every `label` pair.
fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|line| {
            labels
                .iter()
                .all(|(k, v)| line.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn the_daemon_counts_python_processes_by_release_and_the_frames_it_reads() {
    let _host = crate::ebpf::exclusive();
    let dir = tempfile::tempdir().unwrap();
    let older = pyenv_root().join("versions");
    let python310 = std::fs::read_dir(&older)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("3.10.")
        })
        .expect("pyenv has CPython 3.10")
        .join("bin/python3.10");
    let mut pythons: Vec<(&str, PathBuf)> = vec![("3.10", python310)];
    pythons.extend(interpreters().into_iter().map(|(label, path)| {
        let version = if label.ends_with("3.11") {
            "3.11"
        } else if label.ends_with("3.12") {
            "3.12"
        } else {
            "3.13"
        };
        (version, path)
    }));
    let _spinners: Vec<Spinner> = pythons
        .iter()
        .enumerate()
        .map(|(i, (_, python))| {
            let body = "while True:\n    pass\n";
            Spinner::start(&[], python, dir.path(), &format!("daemon-{i}"), body, 30.0)
        })
        .collect();
    let mut config = crate::util::isolated(smolder_agent::config::Config::default());
    config.window.length = Duration::from_secs(1);
    config.window.settle = Duration::from_secs(1);
    config.ebpf.relabel_configs = serde_norway::from_str(
        "- {source_labels: [__meta_process_cmdline], regex: '.*/smolder-py-daemon-.*', action: keep}",
    )
    .unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let text = runtime.block_on(async {
        let agent = smolder_agent::app::start(config).await.unwrap();
        let url = format!("http://{}/metrics", agent.addr());
        let mut text = String::new();
        for _ in 0..120 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            text = reqwest::get(&url).await.unwrap().text().await.unwrap();
            if metric(&text, "smolder_agent_python_frames_total", &[]) > 0.0
                && metric(&text, "smolder_agent_ebpf_drains_total", &[]) >= 3.0
            {
                break;
            }
        }
        agent.stop().await.unwrap();
        text
    });
    let found = |version: &str, support: &str| {
        metric(
            &text,
            "smolder_agent_python_processes_total",
            &[("version", version), ("support", support)],
        )
    };
    assert_eq!(found("older", "older"), 1.0, "{text}");
    assert_eq!(found("3.11", "supported"), 2.0, "{text}");
    assert_eq!(found("3.12", "supported"), 1.0, "{text}");
    assert_eq!(found("3.13", "supported"), 1.0, "{text}");
    assert_eq!(
        metric(&text, "smolder_agent_python_processes", &[]),
        4.0,
        "{text}"
    );
    assert!(
        metric(&text, "smolder_agent_python_frames_total", &[]) > 0.0,
        "{text}"
    );
    let python = metric(
        &text,
        "smolder_agent_python_samples_total",
        &[("stack", "python")],
    );
    let native = metric(
        &text,
        "smolder_agent_python_samples_total",
        &[("stack", "native")],
    );
    assert!(python >= 0.95 * (python + native), "{text}");
    assert_eq!(
        metric(&text, "smolder_agent_python_read_failures_total", &[]),
        0.0,
        "{text}"
    );
}
