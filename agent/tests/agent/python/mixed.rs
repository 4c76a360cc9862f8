//! Mixed stacks at an exact point: the agent's BPF program gives the native stack of Debian's
//! python3.11 (no frame pointers) and its Python frames at a uprobe on libc's `clock_nanosleep`,
//! reached from a Python `key` function that `sorted` (C) calls; the reader gives the same
//! thread's Python frames, which hold still while it loops in `time.sleep`, as the oracle of the
//! kernel's; `place` puts native and Python frames together. Each `_PyEval_EvalFrameDefault`
//! frame must give way to the Python frames it ran, with `sorted`'s native frames between
//! `sort_items` and `key`.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{Array, HashMap as BpfHashMap, HashOfMaps, MapData, RingBuf};
use aya::programs::UProbe;
use aya::programs::uprobe::UProbeScope;
use aya::{Ebpf, EbpfLoader};
use object::{Object as _, ObjectSymbol as _};
use smolder_agent::ebpf::python::{Walks, kernel_entry, place};
use smolder_agent_ebpf::unwind::{
    MAP_MAPPINGS, MAP_SAMPLES, MAP_TABLES, Mapping, MappingKey, SampleHeader, Status,
    TABLE_MAP_FLAGS, mapping_prefixes, parse_sample,
};
use smolder_agent_ebpf::{self as kernel, PythonFrame, PythonProc, PythonStatus};
use smolder_unwind::{Elf, Limits};

use super::*;

/// `sorted` (C) calls the Python `key`, which sleeps in a loop on its second item.
const SLEEPING_CALLBACK: &str = r#"
def key(item):
    if item == 2:
        report("key")
        while True:
            time.sleep(0.005)
    return item

def sort_items():
    return sorted([3, 1, 2], key=key)

sort_items()
"#;

/// An executable mapping of the process and the file it maps.
struct Module {
    start: u64,
    end: u64,
    bias: u64,
    name: String,
    /// Function symbols (ELF address, size, name), from `.symtab` and `.dynsym`.
    symbols: Vec<(u64, u64, String)>,
}

/// Builds the unwind tables of every executable mapping of `pid` and loads them into the
/// unwinder's maps, as the agent will; returns the mappings, to name frames.
fn load_tables(ebpf: &mut Ebpf, pid: u32) -> Vec<Module> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mut modules = Vec::new();
    let mut tables: HashMap<String, (u64, smolder_unwind::UnwindTable)> = HashMap::new();
    for line in maps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 6 || !fields[1].contains('x') || !fields[5].starts_with('/') {
            continue;
        }
        let (start, end) = fields[0].split_once('-').unwrap();
        let (start, end) = (
            u64::from_str_radix(start, 16).unwrap(),
            u64::from_str_radix(end, 16).unwrap(),
        );
        let offset = u64::from_str_radix(fields[2], 16).unwrap();
        let path = fields[5].to_owned();
        let bytes = std::fs::read(&path).unwrap();
        let elf = Elf::parse(&bytes).unwrap();
        let bias = elf.bias(start, offset).unwrap();
        let next_id = tables.len() as u64 + 1;
        let (exe_id, table) = tables.entry(path.clone()).or_insert_with(|| {
            let table = smolder_unwind::build(&elf, None, &Limits::default()).unwrap();
            (next_id, table)
        });
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
        let file = object::File::parse(&bytes[..]).unwrap();
        let mut symbols: Vec<(u64, u64, String)> = file
            .symbols()
            .chain(file.dynamic_symbols())
            .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0)
            .filter_map(|s| Some((s.address(), s.size(), s.name().ok()?.to_owned())))
            .collect();
        symbols.sort();
        modules.push(Module {
            start,
            end,
            bias,
            name: path.rsplit('/').next().unwrap().to_owned(),
            symbols,
        });
    }
    for (exe_id, table) in tables.values() {
        let entries = table.entries();
        let mut inner = Array::<MapData, u64>::create(entries.len() as u32, TABLE_MAP_FLAGS)
            .expect("create a table array");
        for (i, entry) in entries.iter().enumerate() {
            inner.set(i as u32, entry, 0).unwrap();
        }
        let mut outer: HashOfMaps<&mut MapData, u64, Array<MapData, u64>> =
            HashOfMaps::try_from(ebpf.map_mut(MAP_TABLES).unwrap()).unwrap();
        outer.insert(exe_id, &inner, 0).unwrap();
    }
    modules
}

/// `module:function` (or `module:?`) of the native frame at `pc`.
fn native_name(modules: &[Module], pc: u64) -> String {
    let Some(module) = modules.iter().find(|m| (m.start..m.end).contains(&pc)) else {
        return "?".into();
    };
    let vaddr = pc - module.bias;
    let function = module
        .symbols
        .iter()
        .rev()
        .find(|(addr, size, _)| *addr <= vaddr && vaddr < addr + size)
        .map_or("?", |(_, _, name)| name.as_str());
    format!("{}:{function}", module.name)
}

#[test]
fn mixed_stacks_put_the_native_frames_of_a_c_function_between_its_python_caller_and_callback() {
    let _host = crate::util::exclusive();
    let dir = tempfile::tempdir().unwrap();
    let python = Path::new("/usr/bin/python3.11");
    let mut script = Script::start(python, dir.path(), "mixed", SLEEPING_CALLBACK);
    let report = script.reports(1).pop().unwrap();
    let pid = script.pid();
    let (found, mut process) = attach(pid);
    let target = found.target.unwrap();
    let eval_loop = target
        .eval_loop
        .expect("python3.11 exports _PyEval_EvalFrameDefault");

    // The oracle: the reader's Python frames of the thread, once it blocks in key.
    let expected = expected_names(&report);
    let deadline = Instant::now() + Duration::from_secs(10);
    let oracle: Vec<(u64, bool)> = loop {
        let thread = process
            .threads()
            .unwrap()
            .into_iter()
            .find(|t| t.native_thread_id == report.tid)
            .unwrap();
        let raw = process.frames(&thread).unwrap();
        let names: Vec<String> = raw
            .iter()
            .map(|f| process.name(f.code).unwrap().name.to_string())
            .collect();
        if names == expected {
            break raw.iter().map(|f| (f.code, f.entry)).collect();
        }
        assert!(
            Instant::now() < deadline,
            "the script never blocked in key: {names:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };

    let mut ebpf = EbpfLoader::new()
        .override_global(kernel::GLOBAL_SELF_TGID, &std::process::id(), true)
        // The off-CPU task storage, which aya creates but has no type for.
        .allow_unsupported_maps()
        .load(kernel::OBJECT)
        .expect("loading the unwinder (as root)");
    let modules = load_tables(&mut ebpf, pid);
    let mut procs: BpfHashMap<_, u32, PythonProc> =
        BpfHashMap::try_from(ebpf.take_map(kernel::MAP_PYTHON_PROCS).unwrap()).unwrap();
    procs
        .insert(
            pid,
            kernel_entry(Path::new("/proc"), pid, &target).unwrap(),
            0,
        )
        .unwrap();
    let libc = modules
        .iter()
        .find(|m| m.name.starts_with("libc.so"))
        .expect("python3.11 maps libc");
    let libc_path = std::fs::read_link(format!(
        "/proc/{pid}/map_files/{:x}-{:x}",
        libc.start, libc.end
    ))
    .unwrap();
    let program: &mut UProbe = ebpf
        .program_mut(kernel::PROGRAM_UPROBE)
        .unwrap()
        .try_into()
        .unwrap();
    program.load().unwrap();
    program
        .attach(
            "clock_nanosleep",
            &libc_path,
            UProbeScope::OneProcess(NonZeroU32::new(pid).unwrap()),
        )
        .expect("a uprobe on libc's clock_nanosleep");

    let mut samples: Vec<(SampleHeader, Vec<u64>, Vec<PythonFrame>)> = Vec::new();
    {
        let mut ring = RingBuf::try_from(ebpf.map_mut(MAP_SAMPLES).unwrap()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while samples.len() < 20 && Instant::now() < deadline {
            while let Some(item) = ring.next() {
                let sample = parse_sample(&item).unwrap();
                if sample.header.tgid == pid {
                    samples.push((
                        sample.header,
                        sample.user().collect(),
                        sample.python().collect(),
                    ));
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    assert!(samples.len() >= 20, "{} samples", samples.len());

    for (header, native, python) in &samples {
        assert_eq!(Status::from_raw(header.status), Some(Status::Complete));
        assert_eq!(
            PythonStatus::from_raw(header.python_status),
            Some(PythonStatus::Ok)
        );
        let kernel: Vec<(u64, bool)> = python
            .iter()
            .map(|f| (f.code_object(), f.is_entry()))
            .collect();
        assert_eq!(
            kernel, oracle,
            "the kernel's Python frames against the reader's"
        );
        let walks = Walks {
            native_complete: true,
            python_complete: true,
        };
        let placements = place(native, python, eval_loop, walks).unwrap_or_else(|err| {
            let names: Vec<String> = native.iter().map(|&pc| native_name(&modules, pc)).collect();
            panic!("{err}: {names:?}")
        });
        // Leaf first: each placed native frame gives way to its Python frames by name.
        let mut leaf_first: Vec<String> = Vec::new();
        let mut next = placements.iter().peekable();
        for (depth, &pc) in native.iter().enumerate() {
            match next.next_if(|p| p.depth == depth) {
                Some(p) => leaf_first.extend(
                    python[p.frames.clone()]
                        .iter()
                        .map(|f| process.name(f.code_object()).unwrap().name.to_string()),
                ),
                None => leaf_first.push(native_name(&modules, pc)),
            }
        }
        assert!(next.next().is_none(), "{placements:?}");
        // Root first, Python frames by name, native ones as module:function.
        let path: Vec<String> = leaf_first.into_iter().rev().collect();
        let at = |name: &str| {
            path.iter()
                .position(|f| f.starts_with(&format!("{name} (")))
                .unwrap_or_else(|| panic!("no {name} in {path:#?}"))
        };
        let (module, sort_items, key) = (at("<module>"), at("sort_items"), at("key"));
        assert!(module < sort_items && sort_items < key, "{path:#?}");
        let is_python = |f: &String| f.ends_with(')') && f.contains(" (");
        // The interpreter's start below <module>, sorted()'s native frames between sort_items
        // and key, time.sleep's below key down to libc.
        assert!(
            path[..module].iter().all(|f| !is_python(f)) && module > 0,
            "{path:#?}"
        );
        assert!(key > sort_items + 1, "no native frame between: {path:#?}");
        assert!(
            path[sort_items + 1..key].iter().all(|f| !is_python(f)),
            "{path:#?}"
        );
        assert!(
            path[key + 1..].iter().all(|f| !is_python(f)) && key + 1 < path.len(),
            "{path:#?}"
        );
        assert!(
            path.last().unwrap().starts_with("libc.so.6:")
                && path.last().unwrap().contains("clock_nanosleep"),
            "{path:#?}"
        );
        assert!(
            path.iter()
                .all(|f| !f.ends_with("_PyEval_EvalFrameDefault")),
            "an interpreter-loop frame is left: {path:#?}"
        );
    }
}
