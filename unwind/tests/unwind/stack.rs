//! Real stacks of a `gcc -O2 -fomit-frame-pointer` program (`tests/data/snapshot.c`): its SIGPROF
//! handler writes snapshots (registers and stack bytes) of the main thread and two threads at
//! arbitrary points of a recursion through libc's `qsort`; every snapshot, unwound by the
//! evaluator over the tables of the executable and libc, must give the known call path down to
//! `_start` (main thread) or `clone3` (threads), and the handler's own walk must cross the signal
//! frame (`__restore_rt`) into exactly the interrupted stack.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use object::{Object as _, ObjectSymbol as _};
use regex::Regex;
use smolder_unwind::eval::{self, Memory, Registers, Status, Tables};
use smolder_unwind::{Elf, Limits, UnwindTable};

use crate::util::gcc;

const SNAPSHOTS: usize = 150;
const MAGIC: u64 = 0x7061_6e73_646c_6f6d;

/// One executable mapping of the victim.
struct Mapping {
    start: u64,
    end: u64,
    module: usize,
    bias: u64,
}

/// An executable file: its table and function symbols (sorted by address).
struct Module {
    name: String,
    table: UnwindTable,
    symbols: Vec<(u64, u64, String)>,
}

struct Process {
    mappings: Vec<Mapping>,
    modules: Vec<Module>,
}

impl Tables for Process {
    fn find(&self, address: u64) -> Option<(&UnwindTable, u64)> {
        let m = self
            .mappings
            .iter()
            .find(|m| address >= m.start && address < m.end)?;
        Some((&self.modules[m.module].table, m.bias))
    }
}

impl Process {
    fn load(maps: &str) -> Process {
        let mut modules: Vec<Module> = Vec::new();
        let mut by_path: HashMap<PathBuf, usize> = HashMap::new();
        let mut mappings = Vec::new();
        for line in maps.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 6 || !fields[1].contains('x') || !fields[5].starts_with('/') {
                continue;
            }
            let (start, end) = fields[0].split_once('-').unwrap();
            let start = u64::from_str_radix(start, 16).unwrap();
            let end = u64::from_str_radix(end, 16).unwrap();
            let offset = u64::from_str_radix(fields[2], 16).unwrap();
            let path = PathBuf::from(fields[5]);
            let bytes = std::fs::read(&path).unwrap();
            let elf = Elf::parse(&bytes).unwrap();
            let module = *by_path.entry(path.clone()).or_insert_with(|| {
                modules.push(Module {
                    name: path.file_name().unwrap().to_string_lossy().into_owned(),
                    table: smolder_unwind::build(&elf, None, &Limits::default()).unwrap(),
                    symbols: symbols(&bytes),
                });
                modules.len() - 1
            });
            let bias = elf
                .bias(start, offset)
                .expect("a loadable segment holds the mapping");
            mappings.push(Mapping {
                start,
                end,
                module,
                bias,
            });
        }
        Process { mappings, modules }
    }

    /// The frame's token for the call-path pattern: the function's name in the victim, `libc`
    /// for libc frames (except `__libc_start_main`, exported), `?` otherwise.
    fn token(&self, address: u64) -> String {
        let Some(m) = self
            .mappings
            .iter()
            .find(|m| address >= m.start && address < m.end)
        else {
            return "?".into();
        };
        let module = &self.modules[m.module];
        let vaddr = address - m.bias;
        let name = module
            .symbols
            .iter()
            .rev()
            .find(|(addr, size, _)| *addr <= vaddr && vaddr < addr + size)
            .map(|(_, _, name)| name.as_str());
        match (module.name.as_str(), name) {
            ("libc.so.6", Some("__libc_start_main")) => "__libc_start_main".into(),
            ("libc.so.6", _) => "libc".into(),
            // gcc's clones keep the name before the dot (`burn.isra.0`).
            ("snapshot", Some(name)) => name.split('.').next().unwrap_or(name).into(),
            _ => "?".into(),
        }
    }
}

fn symbols(bytes: &[u8]) -> Vec<(u64, u64, String)> {
    let file = object::File::parse(bytes).unwrap();
    let mut symbols: Vec<(u64, u64, String)> = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0)
        .filter_map(|s| Some((s.address(), s.size(), s.name().ok()?.to_owned())))
        .collect();
    symbols.sort();
    symbols
}

/// A copy of a stack, from `start` up.
struct Stack<'a> {
    start: u64,
    bytes: &'a [u8],
}

impl Memory for Stack<'_> {
    fn read_u64(&self, address: u64) -> Option<u64> {
        let offset = usize::try_from(address.checked_sub(self.start)?).ok()?;
        let bytes = self.bytes.get(offset..offset.checked_add(8)?)?;
        Some(u64::from_le_bytes(bytes.try_into().unwrap()))
    }
}

struct Snapshot {
    is_main: bool,
    handler: Registers,
    interrupted: Registers,
    bytes: Vec<u8>,
}

fn parse_snapshots(mut data: &[u8]) -> Vec<Snapshot> {
    let mut out = Vec::new();
    while !data.is_empty() {
        let word = |i: usize| u64::from_le_bytes(data[i * 8..i * 8 + 8].try_into().unwrap());
        assert_eq!(word(0), MAGIC, "snapshot framing");
        let len = word(8) as usize;
        out.push(Snapshot {
            is_main: word(1) == 1,
            handler: Registers {
                rip: word(2),
                rsp: word(3),
                rbp: Some(word(4)),
            },
            interrupted: Registers {
                rip: word(5),
                rsp: word(6),
                rbp: Some(word(7)),
            },
            bytes: data[72..72 + len].to_vec(),
        });
        data = &data[72 + len..];
    }
    out
}

fn run_victim(dir: &Path) -> (String, Vec<Snapshot>) {
    let binary = gcc(
        dir,
        "snapshot",
        include_str!("../data/snapshot.c"),
        &["-O2", "-fomit-frame-pointer", "-pthread"],
    );
    let (out, maps) = (dir.join("snapshots"), dir.join("maps"));
    let mut child = Command::new(&binary)
        .arg(&out)
        .arg(&maps)
        .arg(SNAPSHOTS.to_string())
        .spawn()
        .expect("start the victim");
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("the victim did not take {SNAPSHOTS} snapshots in 120 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "victim: {status}");
    (
        std::fs::read_to_string(maps).unwrap(),
        parse_snapshots(&std::fs::read(out).unwrap()),
    )
}

#[test]
fn gcc_o2_stacks_unwind_to_their_roots() {
    let dir = tempfile::tempdir().unwrap();
    let (maps, snapshots) = run_victim(dir.path());
    let process = Process::load(&maps);
    assert!(
        snapshots.len() >= SNAPSHOTS,
        "{} snapshots",
        snapshots.len()
    );
    let tail = r"(( recurse){1,6}|( recurse){6} sort_it( libc)*( cmp( burn)?)?)$";
    let main_path = Regex::new(&format!("^_start __libc_start_main libc main{tail}")).unwrap();
    let thread_path = Regex::new(&format!("^libc libc worker{tail}")).unwrap();
    let (mut main, mut threads, mut in_cmp) = (0, 0, 0);
    for (i, snapshot) in snapshots.iter().enumerate() {
        let stack = Stack {
            start: snapshot.handler.rsp,
            bytes: &snapshot.bytes,
        };
        let walk = eval::unwind(&process, snapshot.interrupted, &stack, 128);
        let tokens: Vec<String> = walk
            .frames
            .iter()
            .enumerate()
            .map(|(j, &pc)| process.token(if j == 0 { pc } else { pc - 1 }))
            .rev()
            .collect();
        let path = tokens.join(" ");
        let pattern = if snapshot.is_main {
            &main_path
        } else {
            &thread_path
        };
        assert!(
            walk.status == Status::Complete && pattern.is_match(&path),
            "snapshot {i} (main: {}): {:?}, root first: {path}",
            snapshot.is_main,
            walk.status
        );
        if snapshot.is_main {
            main += 1
        } else {
            threads += 1
        }
        in_cmp += usize::from(path.contains("cmp"));

        // From inside the handler: the handler, the signal trampoline, then the same stack.
        let walk_from_handler = eval::unwind(&process, snapshot.handler, &stack, 128);
        assert_eq!(walk_from_handler.status, Status::Complete, "snapshot {i}");
        assert_eq!(
            process.token(walk_from_handler.frames[0]),
            "handler",
            "snapshot {i}"
        );
        assert_eq!(
            process.token(walk_from_handler.frames[1] - 1),
            "libc",
            "snapshot {i}"
        );
        assert_eq!(
            walk_from_handler.frames[2..],
            walk.frames[..],
            "snapshot {i}"
        );
    }
    // Both kinds of thread were sampled, and most samples are in the comparator's loop.
    assert!(main > 0 && threads > 0, "main {main}, threads {threads}");
    assert!(
        in_cmp * 2 > snapshots.len(),
        "{in_cmp} of {} in cmp",
        snapshots.len()
    );
}
