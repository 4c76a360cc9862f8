//! The kernel walk and mixed stacks: the agent's real sampler (`record`, and the daemon), loaded
//! as root, sampling CPU-bound scripts run by real interpreters. Each script reports its stacks
//! as the interpreter sees them, then spins in the reported frame (an inline loop: no Python call
//! below it) until its end; every sample of it must carry those Python frames, in order, in the
//! native stack of the interpreter that ran them.

use smolder_agent::ebpf::Recording;
use smolder_test_support::prometheus::Metrics;

use super::*;

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

/// A thread hashing 8 MiB at a time (`hashlib` releases the GIL for the C call, so the thread
/// runs native code without it, in parallel with) the main thread spinning in Python.
const HASH_WITHOUT_GIL: &str = r#"
import hashlib

END = time.monotonic() + float(sys.argv[1])
DATA = b"x" * (8 << 20)

def hash_worker():
    report("hash")
    while time.monotonic() < END:
        hashlib.sha256(DATA).digest()

def spin_main():
    threading.Thread(target=hash_worker, daemon=True).start()
    report("main")
    while time.monotonic() < END:
        pass

spin_main()
"#;

/// A thread that runs a file in a subinterpreter (`SUB` below, its path in `argv[2]`), the main
/// thread asleep (3.11's subinterpreters share the GIL, and a thread of one waits forever for
/// a GIL that a thread of the other spins with) until it ends the process.
const RUN_SUBINTERPRETER: &str = r#"
import os

try:
    import _interpreters as interpreters
except ImportError:
    import _xxsubinterpreters as interpreters

END = time.monotonic() + float(sys.argv[1])
SUB = sys.argv[2]

def run_sub():
    interp = interpreters.create()
    report("caller")
    code = f"import sys; sys.argv = ['', {sys.argv[1]!r}]; exec(compile(open({SUB!r}).read(), {SUB!r}, 'exec'))"
    interpreters.run_string(interp, code)

threading.Thread(target=run_sub, daemon=True).start()
time.sleep(float(sys.argv[1]))
# Not a normal exit: the subinterpreter is still running.
os._exit(0)
"#;

/// What the subinterpreter runs: it spins in `sub_spin`, and reports from there.
const SUB: &str = r#"
END = time.monotonic() + float(sys.argv[1])

def sub_spin():
    report("sub")
    while time.monotonic() < END:
        pass

sub_spin()
"#;

/// A thread sleeping in `time.sleep` under `serve → handler`, 10 ms at a time.
const SLEEP_TREE: &str = r#"
END = time.monotonic() + float(sys.argv[1])

def handler():
    report("sleep")
    while time.monotonic() < END:
        time.sleep(0.01)

def serve():
    handler()

serve()
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
        Self::start_with(wrapper, python, dir, name, body, seconds, &[])
    }

    /// [`Spinner::start`], with `args` after the seconds.
    fn start_with(
        wrapper: &[&str],
        python: &Path,
        dir: &Path,
        name: &str,
        body: &str,
        seconds: f64,
        args: &[&Path],
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
            .args(args)
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

/// Starts `body` with every interpreter of [`interpreters`], each as `smolder-py-<name>-<label>`
/// with `args` after the seconds, and reads the first `reports` reports of each.
fn start_everywhere(
    dir: &Path,
    name: &str,
    body: &str,
    seconds: f64,
    args: &[&Path],
    reports: usize,
) -> (Vec<(String, Spinner)>, Vec<Vec<Report>>) {
    let mut spinners: Vec<(String, Spinner)> = interpreters()
        .into_iter()
        .map(|(label, python)| {
            let name = format!("{name}-{label}");
            let spinner = Spinner::start_with(&[], &python, dir, &name, body, seconds, args);
            (label, spinner)
        })
        .collect();
    let reports = spinners
        .iter_mut()
        .map(|(_, s)| s.script.reports(reports))
        .collect();
    (spinners, reports)
}

/// (service, pid) of each spinner, for [`record_enough`].
fn scripts_of(spinners: &[(String, Spinner)]) -> Vec<(&str, u32)> {
    spinners
        .iter()
        .map(|(_, s)| (s.service.as_str(), s.script.pid()))
        .collect()
}

/// Records `seconds` of the scripts whose file is `smolder-py-*.py`, each under its own
/// service: the script's name; in windows of 1 s, so that those after a script's unwind tables
/// went in can be told apart.
fn record_scripts(seconds: u64) -> Recording {
    record_scripts_with(seconds, smolder_agent::config::Config::default(), None)
}

/// [`record_scripts`] with `config`'s eBPF settings, and the agent's data directory `data` (its
/// disk cache of unwind tables) when given.
fn record_scripts_with(
    seconds: u64,
    mut config: smolder_agent::config::Config,
    data: Option<&Path>,
) -> Recording {
    config.window.length = Duration::from_secs(1);
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
    smolder_agent::ebpf::record(&config, Duration::from_secs(seconds), data).unwrap()
}

/// The profiles of `recording` whose window began after process `pid`'s unwind tables went in:
/// their samples were walked with the tables, so their native stacks are whole.
fn after_tables(recording: &Recording, pid: u32) -> Vec<smolder_common::Profile> {
    let Some(ready) = recording
        .ready
        .iter()
        .filter(|r| r.pid == pid)
        .map(|r| r.at)
        .min()
    else {
        return Vec::new();
    };
    recording
        .profiles
        .iter()
        .filter(|p| p.from >= ready)
        .cloned()
        .collect()
}

/// Every CPU stack of `service` as `;`-joined names, with its samples.
fn folded(profiles: &[smolder_common::Profile], service: &str) -> Vec<(String, u64)> {
    folded_kind(profiles, service, "cpu")
}

/// Every stack of `service`'s profile type `kind` as `;`-joined names, with its value.
fn folded_kind(
    profiles: &[smolder_common::Profile],
    service: &str,
    kind: &str,
) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for profile in profiles
        .iter()
        .filter(|p| p.series.service() == service && p.series.profile_type() == Some(kind))
    {
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

/// Whether `frame` is a Python frame: `qualname (path:first_line)`, the scripts' paths being
/// absolute.
fn is_python(frame: &str) -> bool {
    frame.ends_with(')') && frame.contains(" (/") && frame.contains(".py:")
}

/// The Python frames of a `;`-joined stack, root first and `;`-joined.
fn python_part(stack: &str) -> String {
    stack
        .split(';')
        .filter(|f| is_python(f))
        .collect::<Vec<_>>()
        .join(";")
}

/// Samples of `stacks` whose Python frames are exactly `python`, in order (native frames of
/// the interpreter, C code and the kernel may sit around and between them).
fn carrying(stacks: &[(String, u64)], python: &str) -> u64 {
    stacks
        .iter()
        .filter(|(stack, _)| python_part(stack) == python)
        .map(|(_, n)| n)
        .sum()
}

/// Whether a `;`-joined stack is mixed: native frames of the interpreter's start below the
/// first Python frame, and no interpreter-loop frame left (each gave way to its Python frames).
fn is_mixed(stack: &str) -> bool {
    let frames: Vec<&str> = stack.split(';').collect();
    let first = frames.iter().position(|f| is_python(f));
    first.is_some_and(|i| i > 0)
        && !frames
            .iter()
            .any(|f| f.contains("_PyEval_EvalFrameDefault"))
}

/// Samples of `stacks` that are mixed ([`is_mixed`]).
fn mixed(stacks: &[(String, u64)]) -> u64 {
    stacks
        .iter()
        .filter(|(stack, _)| is_mixed(stack))
        .map(|(_, n)| n)
        .sum()
}

fn total(stacks: &[(String, u64)]) -> u64 {
    stacks.iter().map(|(_, n)| n).sum()
}

/// Samples a script must have for its share of correct stacks to mean something.
const ENOUGH: u64 = 50;

/// A script's stacks over the recordings, of the windows after its unwind tables went in.
/// Before the agent has read a process (its tables, its interpreter's offsets), its samples
/// carry what a first sight can give, and how long that takes depends on the machine's load
/// (on a loaded CI run, a third of a thread test's samples fell before), so the shares the
/// tests check are of these windows only.
#[derive(Default)]
struct Recorded {
    with_tables: Vec<(String, u64)>,
}

/// Records the scripts (service, pid) until each has [`ENOUGH`] samples with its tables in,
/// however long a busy machine takes to give them (recordings of 10 s, at most eight), and
/// returns each service's stacks over the recordings. Each recording loads the sampler afresh,
/// so each starts with the samples a script has before the agent registers it for the Python
/// walk and loads its tables; those windows are left out. The recordings share a data
/// directory, so that the tables built by the first (slow on a loaded machine) come from the
/// disk cache in the others.
fn record_enough(scripts: &[(&str, u32)]) -> HashMap<String, Recorded> {
    let data = tempfile::tempdir().unwrap();
    let mut stacks: HashMap<String, Recorded> = HashMap::new();
    for _ in 0..8 {
        let recording = record_scripts_with(
            10,
            smolder_agent::config::Config::default(),
            Some(data.path()),
        );
        for &(service, pid) in scripts {
            let recorded = stacks.entry(service.to_owned()).or_default();
            recorded
                .with_tables
                .extend(folded(&after_tables(&recording, pid), service));
        }
        if scripts.iter().all(|(service, _)| {
            let recorded = &stacks[*service];
            total(&recorded.with_tables) >= ENOUGH
        }) {
            break;
        }
    }
    stacks
}

/// Checks that the samples walked with the script's tables are mixed (at least 95 %: the rest
/// fell while the interpreter switched frames).
fn assert_mixed(label: &str, recorded: &Recorded) {
    let with_tables = &recorded.with_tables;
    let (mixed, all) = (mixed(with_tables), total(with_tables));
    assert!(
        all >= ENOUGH,
        "{label}: too few samples with tables ({all})"
    );
    assert!(
        mixed as f64 >= 0.95 * all as f64,
        "{label}: {mixed} of {all} samples with tables are mixed: {with_tables:#?}"
    );
}

#[test]
fn python_stacks_carry_the_call_tree_with_files_and_first_lines() {
    let _host = crate::util::exclusive();
    let dir = tempfile::tempdir().unwrap();
    let mut pythons = interpreters();
    pythons.push(("venv-3.12".to_owned(), virtualenv(dir.path(), 12)));
    let mut spinners: Vec<(String, Spinner)> = pythons
        .into_iter()
        .map(|(label, python)| {
            let spinner = Spinner::start(
                &[],
                &python,
                dir.path(),
                &format!("tree-{label}"),
                SPIN_TREE,
                120.0,
            );
            (label, spinner)
        })
        .collect();
    let reports: Vec<Report> = spinners
        .iter_mut()
        .map(|(_, s)| s.script.reports(1).pop().unwrap())
        .collect();
    let scripts = scripts_of(&spinners);
    let recorded = record_enough(&scripts);
    for ((label, spinner), report) in spinners.iter().zip(&reports) {
        // The user-space reader, the kernel walk's oracle, sees the same stack.
        let (_, mut process) = attach(spinner.script.pid());
        let oracle = process
            .stacks()
            .unwrap()
            .into_iter()
            .find(|s| s.thread.native_thread_id == report.tid)
            .expect("the spinning thread");
        assert_eq!(
            names(&oracle),
            expected_names(report),
            "{label}: the oracle"
        );
        let stacks = &recorded[&spinner.service].with_tables;
        let expected = root_first(report);
        let (carried, all) = (carrying(stacks, &expected), total(stacks));
        assert!(
            all >= ENOUGH,
            "{label}: too few samples ({all}): {stacks:?}"
        );
        assert!(
            carried as f64 >= 0.95 * all as f64,
            "{label}: {carried} of {all} samples carry {expected}: {stacks:#?}"
        );
        // Mixed: once the interpreter's unwind tables are in, the native stack runs from the
        // interpreter's start to the leaf, Python frames in place of the interpreter loop's.
        assert_mixed(label, &recorded[&spinner.service]);
    }
}

#[test]
fn python_threads_each_carry_their_own_function() {
    let _host = crate::util::exclusive();
    let dir = tempfile::tempdir().unwrap();
    let (spinners, reports) = start_everywhere(dir.path(), "threads", SPIN_THREADS, 120.0, &[], 4);
    let scripts = scripts_of(&spinners);
    let recorded = record_enough(&scripts);
    for ((label, spinner), reports) in spinners.iter().zip(&reports) {
        let stacks = &recorded[&spinner.service].with_tables;
        let all = total(stacks);
        let mut carried = 0;
        for report in reports {
            let own = carrying(stacks, &root_first(report));
            // The GIL lets one thread run Python code at a time, yet each gets its turns.
            assert!(
                own > 0,
                "{label}: no sample of thread {}: {stacks:#?}",
                report.tag
            );
            carried += own;
        }
        assert!(all >= ENOUGH, "{label}: too few samples ({all})");
        assert!(
            carried as f64 >= 0.95 * all as f64,
            "{label}: {carried} of {all} samples carry their thread's own stack: {stacks:#?}"
        );
        assert_mixed(label, &recorded[&spinner.service]);
    }
}

#[test]
fn a_python_callback_of_a_c_function_follows_its_python_caller() {
    let _host = crate::util::exclusive();
    let dir = tempfile::tempdir().unwrap();
    let (spinners, reports) =
        start_everywhere(dir.path(), "callback", SPIN_CALLBACK, 120.0, &[], 1);
    let reports: Vec<&Report> = reports.iter().map(|r| &r[0]).collect();
    let scripts = scripts_of(&spinners);
    let recorded = record_enough(&scripts);
    for ((label, spinner), report) in spinners.iter().zip(&reports) {
        let stacks = &recorded[&spinner.service].with_tables;
        let expected = root_first(report);
        assert!(expected.contains("sort_items ("), "{label}: {expected}");
        assert!(expected.ends_with(&format!(";{}", expected_names(report)[0])));
        let (carried, all) = (carrying(stacks, &expected), total(stacks));
        assert!(all >= ENOUGH, "{label}: too few samples ({all})");
        assert!(
            carried as f64 >= 0.95 * all as f64,
            "{label}: {carried} of {all} samples carry {expected}: {stacks:#?}"
        );
        // In every mixed stack, sorted()'s native frames sit between sort_items and key, the
        // interpreter's start below <module>.
        assert_mixed(label, &recorded[&spinner.service]);
        let with_tables = &recorded[&spinner.service].with_tables;
        let mut interleaved = 0;
        for (stack, n) in with_tables.iter().filter(|(stack, _)| is_mixed(stack)) {
            let frames: Vec<&str> = stack.split(';').collect();
            let at = |name: &str| {
                frames
                    .iter()
                    .position(|f| f.starts_with(&format!("{name} (")))
            };
            let (Some(module), Some(sort_items), Some(key)) =
                (at("<module>"), at("sort_items"), at("key"))
            else {
                continue;
            };
            assert!(module < sort_items && sort_items < key, "{label}: {stack}");
            assert!(
                key > sort_items + 1 && frames[sort_items + 1..key].iter().all(|f| !is_python(f)),
                "{label}: no native frame between sort_items and key: {stack}"
            );
            assert!(
                frames[..module].iter().all(|f| !is_python(f)),
                "{label}: {stack}"
            );
            interleaved += n;
        }
        let all = total(with_tables);
        assert!(
            interleaved as f64 >= 0.95 * all as f64,
            "{label}: {interleaved} of {all} samples with tables interleaved: {with_tables:#?}"
        );
    }
}

#[test]
fn a_python_process_that_exits_before_the_drain_keeps_its_names() {
    let _host = crate::util::exclusive();
    let dir = tempfile::tempdir().unwrap();
    let (mut spinners, reports) = start_everywhere(dir.path(), "exit", SPIN_TREE, 4.0, &[], 1);
    let reports: Vec<&Report> = reports.iter().map(|r| &r[0]).collect();
    // The scripts exit two to three seconds into the recording.
    let profiles = record_scripts(6).profiles;
    for ((label, spinner), report) in spinners.iter_mut().zip(&reports) {
        assert!(
            spinner.script.child.try_wait().unwrap().is_some(),
            "{label}: still running at the drain"
        );
        let stacks = folded(&profiles, &spinner.service);
        let expected = root_first(report);
        let carried = carrying(&stacks, &expected);
        // A few samples suffice: every one of them must be named.
        assert!(
            carried >= 5,
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
    let _host = crate::util::exclusive();
    let dir = tempfile::tempdir().unwrap();
    let python = pyenv_python(13);
    // A container's view: the interpreter is pid 1 and knows its threads by namespace ids.
    let wrapper = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"];
    let mut spinner = Spinner::start(
        &wrapper,
        &python,
        dir.path(),
        "container",
        SPIN_THREADS,
        120.0,
    );
    let reports = spinner.script.reports(4);
    assert!(
        reports.iter().all(|r| r.tid < 100),
        "namespace ids: {reports:?}"
    );
    let recorded = record_enough(&[(spinner.service.as_str(), spinner.script.pid())]);
    let stacks = &recorded[&spinner.service].with_tables;
    let all = total(stacks);
    let carried: u64 = reports
        .iter()
        .map(|report| carrying(stacks, &root_first(report)))
        .sum();
    assert!(all >= ENOUGH, "too few samples ({all})");
    assert!(
        carried as f64 >= 0.95 * all as f64,
        "{carried} of {all} samples carry their thread's stack: {stacks:#?}"
    );
}

#[test]
fn the_daemon_counts_python_processes_by_release_and_the_frames_it_reads() {
    let _host = crate::util::exclusive();
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
        let mut text = Metrics::default();
        for _ in 0..120 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            text = Metrics::scrape(&url).await;
            if text.value("smolder_agent_python_frames_total", &[]) > 0.0
                && text.value("smolder_agent_ebpf_drains_total", &[]) >= 3.0
            {
                break;
            }
        }
        agent.stop().await.unwrap();
        text
    });
    let found = |version: &str, support: &str| {
        text.value(
            "smolder_agent_python_processes_total",
            &[("version", version), ("support", support)],
        )
    };
    assert_eq!(found("older", "older"), 1.0, "{text:?}");
    assert_eq!(found("3.11", "supported"), 2.0, "{text:?}");
    assert_eq!(found("3.12", "supported"), 1.0, "{text:?}");
    assert_eq!(found("3.13", "supported"), 1.0, "{text:?}");
    assert_eq!(
        text.value("smolder_agent_python_processes", &[]),
        4.0,
        "{text:?}"
    );
    assert!(
        text.value("smolder_agent_python_frames_total", &[]) > 0.0,
        "{text:?}"
    );
    let stack = |stack: &str| text.value("smolder_agent_python_samples_total", &[("stack", stack)]);
    let (mixed, alone, native) = (stack("mixed"), stack("python_only"), stack("native"));
    assert!(mixed + alone >= 0.95 * (mixed + alone + native), "{text:?}");
    assert!(mixed > 0.0, "{text:?}");
    assert_eq!(
        text.value("smolder_agent_python_read_failures_total", &[]),
        0.0,
        "{text:?}"
    );
}

#[test]
fn the_kernel_walk_reads_the_frames_and_entry_frames_the_reader_reads() {
    use aya::maps::{HashMap as BpfHashMap, RingBuf};
    use aya::programs::PerfEvent;
    use aya::programs::perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent};
    use smolder_agent::ebpf::python::kernel_entry;
    use smolder_agent_ebpf::unwind::{MAP_SAMPLES, parse_sample};
    use smolder_agent_ebpf::{self as kernel, PythonProc, PythonStatus};

    let _host = crate::util::exclusive();
    let dir = tempfile::tempdir().unwrap();
    for (label, python) in interpreters() {
        let name = format!("oracle-{label}");
        let mut spinner = Spinner::start(&[], &python, dir.path(), &name, SPIN_CALLBACK, 20.0);
        let report = spinner.script.reports(1).pop().unwrap();
        let pid = spinner.script.pid();
        let (found, mut process) = attach(pid);
        let target = found.target.unwrap();
        // The oracle: the reader's frames of the spinning thread, once it spins in key.
        let deadline = Instant::now() + Duration::from_secs(10);
        let oracle = loop {
            let stack = process
                .stacks()
                .unwrap()
                .into_iter()
                .find(|s| s.thread.native_thread_id == report.tid)
                .unwrap();
            if names(&stack) == expected_names(&report) {
                break stack;
            }
            assert!(Instant::now() < deadline, "{label}: {:?}", names(&stack));
            std::thread::sleep(Duration::from_millis(20));
        };

        let mut ebpf = aya::EbpfLoader::new()
            .override_global(kernel::GLOBAL_SELF_TGID, &std::process::id(), true)
            // The off-CPU task storage, which aya creates but has no type for.
            .allow_unsupported_maps()
            .load(kernel::OBJECT)
            .expect("loading the sampler (as root)");
        let mut procs: BpfHashMap<_, u32, PythonProc> =
            BpfHashMap::try_from(ebpf.take_map(kernel::MAP_PYTHON_PROCS).unwrap()).unwrap();
        let entry = kernel_entry(Path::new("/proc"), pid, &target).unwrap();
        procs.insert(pid, entry, 0).unwrap();
        let mut samples = RingBuf::try_from(ebpf.take_map(MAP_SAMPLES).unwrap()).unwrap();
        let program: &mut PerfEvent = ebpf
            .program_mut(kernel::PROGRAM_CPU)
            .unwrap()
            .try_into()
            .unwrap();
        program.load().unwrap();
        program
            .attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::OneProcess { pid, cpu: None },
                SamplePolicy::Frequency(499),
                false,
            )
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let frames = 'found: loop {
            while let Some(item) = samples.next() {
                let sample = parse_sample(&item).unwrap();
                if sample.header.tgid == pid
                    && PythonStatus::from_raw(sample.header.python_status) == Some(PythonStatus::Ok)
                {
                    break 'found sample.python().collect::<Vec<_>>();
                }
            }
            assert!(
                Instant::now() < deadline,
                "{label}: no Python frames from the kernel"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let kernel: Vec<(u64, bool)> = frames
            .iter()
            .map(|f| (f.code_object(), f.is_entry()))
            .collect();
        let reader: Vec<(u64, bool)> = oracle
            .frames
            .iter()
            .map(|f| (f.raw.code, f.raw.entry))
            .collect();
        assert_eq!(
            kernel, reader,
            "{label}: the kernel walk against the reader"
        );
        assert_eq!(
            reader.iter().map(|(_, entry)| *entry).collect::<Vec<_>>(),
            [true, false, true],
            "{label}: key and <module> are entry frames"
        );
    }
}

/// Whether the innermost frame of a `;`-joined stack (root first) is native code called from
/// the Python frame `caller`: `caller` is the last Python frame and frames follow it.
fn native_below(stack: &str, caller: &str) -> bool {
    let frames: Vec<&str> = stack.split(';').collect();
    frames
        .iter()
        .rposition(|f| is_python(f))
        .is_some_and(|last| frames[last].starts_with(caller) && last + 1 < frames.len())
}

#[test]
fn a_thread_in_a_c_call_without_the_gil_carries_its_python_frames() {
    let _host = crate::util::exclusive();
    let dir = tempfile::tempdir().unwrap();
    let (spinners, reports) =
        start_everywhere(dir.path(), "nogil", HASH_WITHOUT_GIL, 120.0, &[], 2);
    let scripts = scripts_of(&spinners);
    let recorded = record_enough(&scripts);
    for ((label, spinner), reports) in spinners.iter().zip(&reports) {
        let stacks = &recorded[&spinner.service].with_tables;
        let all = total(stacks);
        assert!(all >= ENOUGH, "{label}: too few samples ({all})");
        let hash = reports.iter().find(|r| r.tag == "hash").unwrap();
        let hash_stack = root_first(hash);
        let hashing: Vec<&(String, u64)> = stacks
            .iter()
            .filter(|(stack, _)| python_part(stack) == hash_stack)
            .collect();
        let hashed: u64 = hashing.iter().map(|(_, n)| n).sum();
        // The hashing thread runs beside the main thread most of the time, GIL or not: a good
        // share of the samples, nearly all in the C call.
        assert!(
            hashed as f64 >= 0.2 * all as f64,
            "{label}: {hashed} of {all} samples carry {hash_stack}: {stacks:#?}"
        );
        let in_c: u64 = hashing
            .iter()
            .filter(|(stack, _)| native_below(stack, "hash_worker ("))
            .map(|(_, n)| n)
            .sum();
        assert!(
            in_c as f64 >= 0.8 * hashed as f64,
            "{label}: {in_c} of {hashed} samples of hash_worker are in the C call: {hashing:#?}"
        );
        let carried: u64 = reports
            .iter()
            .map(|r| carrying(stacks, &root_first(r)))
            .sum();
        assert!(
            carried as f64 >= 0.95 * all as f64,
            "{label}: {carried} of {all} samples carry their thread's stack: {stacks:#?}"
        );
    }
}

#[test]
fn a_thread_running_a_subinterpreter_carries_the_subinterpreters_frames() {
    let _host = crate::util::exclusive();
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("smolder-sub.py");
    std::fs::write(&sub, format!("{PRELUDE}{SUB}")).unwrap();
    let (spinners, reports) = start_everywhere(
        dir.path(),
        "subinterp",
        RUN_SUBINTERPRETER,
        120.0,
        &[&sub],
        2,
    );
    let scripts = scripts_of(&spinners);
    let recorded = record_enough(&scripts);
    for ((label, spinner), reports) in spinners.iter().zip(&reports) {
        let stacks = &recorded[&spinner.service].with_tables;
        let all = total(stacks);
        assert!(all >= ENOUGH, "{label}: too few samples ({all})");
        let report = |tag: &str| reports.iter().find(|r| r.tag == tag).unwrap();
        // The subinterpreter's frames, from its file (its `<string>` module is no file).
        let sub_stack = python_part(&root_first(report("sub")));
        assert!(sub_stack.ends_with(&expected_names(report("sub"))[0]));
        let in_sub = carrying(stacks, &sub_stack);
        assert!(
            in_sub as f64 >= 0.95 * all as f64,
            "{label}: {in_sub} of {all} samples carry {sub_stack}: {stacks:#?}"
        );
    }
}

#[test]
fn off_cpu_profiles_carry_the_python_frames_that_waited() {
    let _host = crate::util::exclusive();
    let dir = tempfile::tempdir().unwrap();
    let (spinners, reports) = start_everywhere(dir.path(), "sleep", SLEEP_TREE, 120.0, &[], 1);
    let reports: Vec<&Report> = reports.iter().map(|r| &r[0]).collect();
    let mut config = smolder_agent::config::Config::default();
    config.ebpf.off_cpu.enabled = true;
    config.ebpf.off_cpu.probability = 1.0;
    config.ebpf.off_cpu.max_unwinds_per_second = 0;
    let recording = record_scripts_with(10, config, None);
    for ((label, spinner), report) in spinners.iter().zip(&reports) {
        let waits = folded_kind(
            &after_tables(&recording, spinner.script.pid()),
            &spinner.service,
            "off_cpu",
        );
        let expected = root_first(report);
        assert!(expected.contains("serve (") && expected.ends_with(&expected_names(report)[0]));
        let (carried, all) = (carrying(&waits, &expected), total(&waits));
        // About a second per window of sleeping, nanoseconds: most of it in time.sleep.
        assert!(
            all >= 2_000_000_000,
            "{label}: {all} ns off-CPU with tables: {waits:#?}"
        );
        assert!(
            carried as f64 >= 0.9 * all as f64,
            "{label}: {carried} of {all} ns carry {expected}: {waits:#?}"
        );
        let slept: u64 = waits
            .iter()
            .filter(|(stack, _)| python_part(stack) == expected && stack.contains("nanosleep"))
            .map(|(_, n)| n)
            .sum();
        assert!(
            slept as f64 >= 0.9 * carried as f64,
            "{label}: {slept} of {carried} ns under a nanosleep: {waits:#?}"
        );
        assert!(
            mixed(&waits) as f64 >= 0.9 * all as f64,
            "{label}: the waits' stacks are not mixed: {waits:#?}"
        );
    }
}
