//! CPython: detection, the offsets of each release, the user-space reader and the kernel walk,
//! against real interpreters the tests do not modify (Debian's `/usr/bin/python3.11`, pyenv's
//! 3.11, 3.12 and 3.13 built with `--enable-shared`). A missing interpreter fails the test by
//! name. Each script reports its own stacks with `sys._getframe` (the interpreter's view,
//! measured in the same run), which is what the reader and the kernel walk are checked against.

/// The kernel walk: the real sampler sampling CPU-bound scripts, and the daemon's metrics.
mod kernel;
/// Mixed stacks: the BPF unwinder's native stack of a live interpreter merged with its Python
/// frames.
mod mixed;
/// The user-space reader: detection, the offsets of each release, threads, frames, names.
mod reader;

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

/// A virtualenv made in `dir` from pyenv's CPython 3.`minor`; returns its `bin/python`.
fn virtualenv(dir: &Path, minor: u32) -> PathBuf {
    let venv = dir.join(format!("venv-3.{minor}"));
    let status = Command::new(pyenv_python(minor))
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .status()
        .unwrap();
    assert!(status.success(), "creating a virtualenv");
    venv.join("bin/python")
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
