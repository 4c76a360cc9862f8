//! Fixtures: the victim program, loading a process's unwind tables into the BPF maps the way
//! the agent will, reading samples, naming frames.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use aya::Ebpf;
use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{Array, HashOfMaps, MapData, RingBuf};
use object::{Object as _, ObjectSymbol as _};
use smolder_agent_ebpf::unwind::{
    MAP_MAPPINGS, MAP_SAMPLES, MAP_TABLES, Mapping, MappingKey, SampleHeader, TABLE_MAP_FLAGS,
    mapping_prefixes, parse_sample,
};
use smolder_unwind::{Elf, Limits};

/// `tests/data/victim.c`, built with `gcc -O2 -fomit-frame-pointer`, running until dropped.
pub(crate) struct Victim {
    _child: KillOnDrop,
    stdin: Option<ChildStdin>,
    pub(crate) pid: u32,
    pub(crate) binary: PathBuf,
    _dir: tempfile::TempDir,
}

impl Victim {
    /// Starts the victim with a recursion `depth` in `mode` (`plain`, `syscalls`, `signal`,
    /// `flat`; see `victim.c`); it waits for [`Victim::go`].
    pub(crate) fn start(depth: u32, mode: &str) -> Victim {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("victim.c");
        std::fs::write(&source, include_str!("../data/victim.c")).unwrap();
        let binary = dir.path().join("victim");
        let output = Command::new("gcc")
            .args(["-O2", "-fomit-frame-pointer", "-pthread", "-o"])
            .arg(&binary)
            .arg(&source)
            .output()
            .expect("run gcc (apt-get install gcc)");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let mut child = Command::new(&binary)
            .arg(depth.to_string())
            .arg(mode)
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let pid = child.id();
        // Its libraries are mapped once it waits for its line.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .unwrap_or_default()
            .contains("libc.so.6")
        {
            assert!(Instant::now() < deadline, "the victim did not map libc");
            std::thread::sleep(Duration::from_millis(10));
        }
        Victim {
            _child: KillOnDrop(child),
            stdin,
            pid,
            binary,
            _dir: dir,
        }
    }

    /// Lets the victim start its work.
    pub(crate) fn go(&mut self) {
        let mut stdin = self.stdin.take().expect("go once");
        stdin.write_all(b"go\n").unwrap();
    }
}

/// A child process killed and reaped when this is dropped, also when a test panics.
pub(crate) struct KillOnDrop(pub(crate) Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An executable mapping of the victim, with its file's symbols.
struct ExecMapping {
    start: u64,
    end: u64,
    bias: u64,
    module: usize,
}

/// A file's function symbols: (address, size, name), sorted.
type Symbols = Vec<(u64, u64, String)>;

/// What the test knows of a process: its executable mappings and their symbols.
pub(crate) struct Process {
    mappings: Vec<ExecMapping>,
    modules: Vec<(String, Symbols)>,
}

impl Process {
    /// Reads `pid`'s executable mappings; with `ebpf`, builds their tables and loads them into
    /// the unwinder's maps (executable ids from 1), as the agent does.
    pub(crate) fn load(pid: u32, mut ebpf: Option<&mut Ebpf>) -> Process {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        let mut process = Process {
            mappings: Vec::new(),
            modules: Vec::new(),
        };
        let mut ids: HashMap<String, (usize, u64, smolder_unwind::UnwindTable)> = HashMap::new();
        for line in maps.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 6 || !fields[1].contains('x') || !fields[5].starts_with('/') {
                continue;
            }
            let (start, end) = fields[0].split_once('-').unwrap();
            let start = u64::from_str_radix(start, 16).unwrap();
            let end = u64::from_str_radix(end, 16).unwrap();
            let offset = u64::from_str_radix(fields[2], 16).unwrap();
            let path = fields[5].to_owned();
            let bytes = std::fs::read(&path).unwrap();
            let elf = Elf::parse(&bytes).unwrap();
            let bias = elf.bias(start, offset).unwrap();
            let next_id = ids.len() as u64 + 1;
            let (module, exe_id, table) = ids.entry(path.clone()).or_insert_with(|| {
                let table = smolder_unwind::build(&elf, None, &Limits::default()).unwrap();
                let name = Path::new(&path)
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                process.modules.push((name, symbols(&bytes)));
                (process.modules.len() - 1, next_id, table)
            });
            if let Some(ebpf) = ebpf.as_deref_mut() {
                let mapping = Mapping {
                    exe_id: *exe_id,
                    bias,
                    first_page: table.first_page(),
                    n_pages: table.n_pages(),
                    n_entries: table.entries().len() as u32,
                    flags: 0,
                    start,
                    end,
                };
                let mut trie: LpmTrie<&mut MapData, MappingKey, Mapping> =
                    LpmTrie::try_from(ebpf.map_mut(MAP_MAPPINGS).unwrap()).unwrap();
                for (len, key) in mapping_prefixes(pid, start, end) {
                    trie.insert(&Key::new(len, key), mapping, 0).unwrap();
                }
            }
            process.mappings.push(ExecMapping {
                start,
                end,
                bias,
                module: *module,
            });
        }
        if let Some(ebpf) = ebpf {
            for (_, exe_id, table) in ids.values() {
                let entries = table.entries();
                let mut inner =
                    Array::<MapData, u64>::create(entries.len() as u32, TABLE_MAP_FLAGS)
                        .expect("create a table array");
                for (i, entry) in entries.iter().enumerate() {
                    inner.set(i as u32, entry, 0).unwrap();
                }
                let mut outer: HashOfMaps<&mut MapData, u64, Array<MapData, u64>> =
                    HashOfMaps::try_from(ebpf.map_mut(MAP_TABLES).unwrap()).unwrap();
                outer.insert(exe_id, &inner, 0).unwrap();
            }
        }
        process
    }

    /// The frame's token for call-path patterns: the victim's function names, `libc` for libc
    /// (but `__libc_start_main`, exported), `?` for anything else.
    pub(crate) fn token(&self, address: u64) -> String {
        let Some(m) = self
            .mappings
            .iter()
            .find(|m| address >= m.start && address < m.end)
        else {
            return "?".into();
        };
        let (module, symbols) = &self.modules[m.module];
        let vaddr = address - m.bias;
        let name = symbols
            .iter()
            .rev()
            .find(|(addr, size, _)| *addr <= vaddr && vaddr < addr + size)
            .map(|(_, _, name)| name.as_str());
        match (module.as_str(), name) {
            ("libc.so.6", Some("__libc_start_main")) => "__libc_start_main".into(),
            ("libc.so.6", _) => "libc".into(),
            ("victim", Some(name)) => name.into(),
            _ => "?".into(),
        }
    }

    /// A walk's frames as a root-first path of tokens. Return addresses are looked up at
    /// `- 1` (their call); a frame interrupted by a signal is exact, which the `- 1` lookup only
    /// misses at a function's first byte, where the exact address is tried.
    pub(crate) fn path(&self, frames: &[u64]) -> String {
        let tokens: Vec<String> = frames
            .iter()
            .enumerate()
            .map(
                |(i, &pc)| match self.token(if i == 0 { pc } else { pc - 1 }) {
                    unknown if unknown == "?" => self.token(pc),
                    token => token,
                },
            )
            .rev()
            .collect();
        tokens.join(" ")
    }
}

fn symbols(bytes: &[u8]) -> Symbols {
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

/// Reads samples of process `tgid` from the samples ring buffer until `want` arrived or
/// `timeout` passed.
pub(crate) fn read_samples(
    ebpf: &mut Ebpf,
    tgid: u32,
    want: usize,
    timeout: Duration,
) -> Vec<(SampleHeader, Vec<u64>)> {
    let mut ring = RingBuf::try_from(ebpf.map_mut(MAP_SAMPLES).unwrap()).unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + timeout;
    while out.len() < want && Instant::now() < deadline {
        while let Some(item) = ring.next() {
            let sample = parse_sample(&item).expect("a whole sample");
            if sample.header.tgid == tgid && out.len() < want {
                out.push((sample.header, sample.user().collect()));
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    out
}
