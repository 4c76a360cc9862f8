//! README.md and OPERATIONS.md against the binaries: every `sh` block runs against a real
//! aggregator and agent on port 0 (or is skipped for a stated reason), every `yaml` block is a
//! config one of the daemons reads, every key `print-default-config` prints is shown in one, every
//! key the daemons read prints or is hidden for a stated reason, and the glossary is in order.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use smolder_common::pprof::{self, EncodeOptions};
use smolder_test_support::config_keys;
use smolder_test_support::net::{LOOPBACK_ANY_PORT, silent_udp};

use crate::util::{Aggregator, tree};

/// Commands the examples show that this test does not run, and why.
const NOT_RUN: &[(&str, &str)] = &[
    (
        "scripts/run",
        "both daemons on the default ports, built for release",
    ),
    ("scripts/test", "the whole suite, this test included"),
    (
        "scripts/package",
        "release builds of both packages; scripts/test runs it",
    ),
    ("npm", "the UI's build; scripts/test runs it"),
    (
        "cargo",
        "builds, benchmarks and fuzzing; scripts/test and BENCHMARKS.md cover them",
    ),
    ("cd", "only before cargo fuzz"),
    (
        "dpkg",
        "installs a package system-wide; vagrant/multihost-test does",
    ),
    (
        "systemctl",
        "needs systemd; vagrant/multihost-test starts the daemons as the units do",
    ),
    (
        "install",
        "writes into /etc; vagrant/provision/ does the same",
    ),
    (
        "chown",
        "writes into /etc; vagrant/provision/ does the same",
    ),
    ("$EDITOR", "interactive"),
    (
        "smolder-agent",
        "`record` samples the host for 10 s as root; agent/tests/agent/ebpf.rs runs it",
    ),
    (
        "agent/benches/offcpu/bench.sh",
        "a benchmark, as root, of a release build; BENCHMARKS.md covers it",
    ),
    (
        "flamegraph.pl",
        "not installed; it reads what `record` prints",
    ),
];

/// Programs the examples may run here.
const RUN: &[&str] = &["curl", "printf", "jq", "smolder-aggregator"];

/// Keys `print-default-config` does not print, by daemon, and why. An entry hides the key it
/// names and every key under it (`scrape-configs` hides `scrape-configs.job-name`).
const HIDDEN: &[(&str, &str, &str)] = &[
    (
        "aggregator",
        "auth.credentials",
        "a list of credentials, empty by default (it prints as []); README.md's Authentication shows an entry",
    ),
    (
        "aggregator",
        "ingest.quic.max-concurrent-streams",
        "the old name of ingest.quic.max-batches-in-flight, still read (deprecated)",
    ),
    (
        "aggregator",
        "ingest.quic.tenant-tokens",
        "a map of tenant id to its agents' tokens, empty by default (it prints as {}); OPERATIONS.md shows an entry",
    ),
    (
        "aggregator",
        "tenant.limits",
        "a map of tenant id to its own limits, empty by default (it prints as {}); OPERATIONS.md's Limits shows an entry",
    ),
    (
        "aggregator",
        "metrics-export-rules",
        "a map of rule name to rule, empty by default (it prints as {}); README.md shows a rule's keys",
    ),
    (
        "aggregator",
        "rules.remote-write-labels",
        "a map of label name to value, empty by default (it prints as {}); README.md shows an entry",
    ),
    (
        "agent",
        "ebpf.counts-map-entries",
        "deprecated and ignored (samples leave the kernel through a ring buffer); read, with a warning, so that old files load",
    ),
    (
        "agent",
        "ebpf.stack-map-entries",
        "deprecated and ignored (the agent walks user stacks itself); read, with a warning, so that old files load",
    ),
    (
        "agent",
        "ebpf.relabel-configs",
        "a list of Prometheus relabel_configs rules, empty by default (it prints as []); README.md shows a rule's keys",
    ),
    (
        "agent",
        "metrics-export-rules",
        "a map of rule name to rule, empty by default (it prints as {}); README.md shows a rule's keys",
    ),
    (
        "agent",
        "scrape-configs",
        "a list of jobs, empty by default (it prints as []): Pyroscope's scrape config, each key also in Prometheus' snake_case; README.md's pull mode shows a job",
    ),
    (
        "agent",
        "ship.max-in-flight",
        "the old name of ship.max-batches-in-flight, still read (deprecated)",
    ),
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The fenced blocks of `file` in language `lang`, with the line each starts on.
fn blocks(file: &str, lang: &str) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(repo().join(file)).unwrap();
    let mut found = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (number, line) in text.lines().enumerate() {
        match &mut current {
            Some((_, body)) if line.trim_start() == "```" => {
                let (start, body) = current.take().expect("open");
                found.push((start, body));
            }
            Some((_, body)) => {
                body.push_str(line);
                body.push('\n');
            }
            None => {
                if line.trim_start().strip_prefix("```") == Some(lang) {
                    current = Some((number + 1, String::new()));
                }
            }
        }
    }
    found
}

/// The program of every command of a shell block: the first word of each pipeline stage,
/// quotes, line continuations and comments understood.
fn programs(script: &str) -> Vec<String> {
    let mut programs = Vec::new();
    let (mut word, mut at_start, mut quote) = (String::new(), true, None::<char>);
    let mut chars = script.chars().peekable();
    let take = |word: &mut String, at_start: &mut bool, programs: &mut Vec<String>| {
        if *at_start && !word.is_empty() {
            programs.push(std::mem::take(word));
            *at_start = false;
        }
        word.clear();
    };
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '#') if word.is_empty() => {
                while chars.peek().is_some_and(|&c| c != '\n') {
                    chars.next();
                }
            }
            (None, '\\') if chars.peek() == Some(&'\n') => {
                chars.next();
            }
            (None, '\n' | ';' | '|' | '&') => {
                take(&mut word, &mut at_start, &mut programs);
                // A line ending in `|` or `&&` continues the command: the next word starts
                // the next stage either way.
                at_start = true;
            }
            (None, ' ' | '\t') => take(&mut word, &mut at_start, &mut programs),
            (None, c) => word.push(c),
        }
    }
    take(&mut word, &mut at_start, &mut programs);
    programs
}

/// Runs `script` with bash in `dir`, the daemons' addresses substituted, `curl` failing on an
/// HTTP error, `smolder-aggregator` the binary under test and the commands of [`NOT_RUN`] that
/// it also holds made no-ops.
fn run(script: &str, dir: &Path, aggregator: &str, agent: &str, skipped: &[&str]) {
    // One pass: replacing one address after another would find the second inside the first's
    // substitute (a port 40427 made `localhost:4042` of `127.0.0.1:40427`).
    let addresses = regex::Regex::new(r"\b(?:localhost|127\.0\.0\.1):(4040|4042)\b").unwrap();
    let script = addresses
        .replace_all(script, |c: &regex::Captures<'_>| {
            if &c[1] == "4040" { aggregator } else { agent }.to_owned()
        })
        .replace(
            "/etc/smolder/aggregator.yaml",
            &repo().join("systemd/aggregator.yaml").display().to_string(),
        );
    let mut prelude = format!(
        "curl() {{ command curl --fail-with-body --show-error --silent \"$@\"; }}\n\
         smolder-aggregator() {{ {} \"$@\"; }}\n",
        env!("CARGO_BIN_EXE_smolder-aggregator")
    );
    for program in skipped {
        // `$EDITOR` is `true` in this shell.
        if program.starts_with('$') {
            continue;
        }
        assert!(
            !program.contains('/'),
            "a block mixes commands this test runs with {program}: give it its own block"
        );
        prelude.push_str(&format!("{program}() {{ :; }}\n"));
    }
    let output = Command::new("bash")
        .args(["-e", "-o", "pipefail", "-c"])
        .arg(format!("{prelude}{script}"))
        .current_dir(dir)
        .env("EDITOR", "true")
        .output()
        .expect("bash runs");
    assert!(
        output.status.success(),
        "{}\n--- stdout\n{}\n--- stderr\n{}",
        script,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shell_example_runs_against_real_daemons() {
    let agg = Aggregator::start().await;
    let mut agent_config = smolder_agent::config::Config::default();
    agent_config.http.listen = LOOPBACK_ANY_PORT;
    agent_config.ebpf.enabled = false;
    agent_config.ship.aggregator = silent_udp().to_string();
    let agent = smolder_agent::app::start(agent_config).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The pprof file the README pushes.
    let heap = pprof::encode(
        &tree(&[("main;alloc", 4096)]),
        &EncodeOptions::new("inuse_space", "bytes"),
    );
    std::fs::write(dir.path().join("heap.pb.gz"), heap.to_bytes(true)).unwrap();

    let (aggregator, agent_addr) = (agg.addr().to_string(), agent.addr().to_string());
    let mut ran = 0;
    for file in ["README.md", "OPERATIONS.md"] {
        for (line, script) in blocks(file, "sh") {
            let programs = programs(&script);
            let mut skipped = Vec::new();
            for program in &programs {
                if RUN.contains(&program.as_str()) {
                    continue;
                }
                match NOT_RUN.iter().find(|(name, _)| name == program) {
                    Some((name, _)) => skipped.push(*name),
                    None => panic!(
                        "{file}:{line}: `{program}` is neither run by this test nor listed in \
                         NOT_RUN with a reason"
                    ),
                }
            }
            if skipped.len() == programs.len() {
                continue;
            }
            let (dir, aggregator, agent_addr) = (
                dir.path().to_owned(),
                aggregator.clone(),
                agent_addr.clone(),
            );
            tokio::task::spawn_blocking(move || {
                run(&script, &dir, &aggregator, &agent_addr, &skipped);
            })
            .await
            .unwrap_or_else(|err| panic!("{file}:{line}: {err}"));
            ran += 1;
        }
    }
    assert!(ran >= 4, "only {ran} blocks ran");
    agent.stop().await.unwrap();
    agg.stop().await;
}

/// Every key path of `value` (`ingest.quic.listen`), sections included.
fn key_paths(value: &serde_norway::Value, prefix: &str, out: &mut BTreeSet<String>) {
    let Some(mapping) = value.as_mapping() else {
        return;
    };
    for (key, inner) in mapping {
        let Some(key) = key.as_str() else { continue };
        let path = if prefix.is_empty() {
            key.to_owned()
        } else {
            format!("{prefix}.{key}")
        };
        out.insert(path.clone());
        key_paths(inner, &path, out);
    }
}

/// The keys `print-default-config` prints that hold a value (a section's subkeys are its
/// keys; an empty map, such as the rules', is a key itself).
fn default_keys(yaml: &str) -> BTreeSet<String> {
    let value: serde_norway::Value = serde_norway::from_str(yaml).unwrap();
    let mut all = BTreeSet::new();
    key_paths(&value, "", &mut all);
    all.iter()
        .filter(|path| {
            !all.iter()
                .any(|other| other.starts_with(&format!("{path}.")))
        })
        .cloned()
        .collect()
}

#[test]
fn every_yaml_example_is_a_config_and_every_key_is_shown() {
    let mut shown_aggregator = BTreeSet::new();
    let mut shown_agent = BTreeSet::new();
    for file in ["README.md", "OPERATIONS.md"] {
        for (line, yaml) in blocks(file, "yaml") {
            let value: serde_norway::Value = serde_norway::from_str(&yaml)
                .unwrap_or_else(|err| panic!("{file}:{line}: not YAML: {err}"));
            // Prometheus' own config, for its side of the setup.
            if value.get("scrape_configs").is_some() {
                continue;
            }
            let aggregator =
                smolder_daemon::parse::<smolder_aggregator::config::Config>(&yaml).is_ok();
            let agent = smolder_daemon::parse::<smolder_agent::config::Config>(&yaml).is_ok();
            assert!(
                aggregator || agent,
                "{file}:{line}: neither daemon reads this config: {:#}\n{yaml}",
                smolder_daemon::parse::<smolder_agent::config::Config>(&yaml).unwrap_err()
            );
            let mut keys = BTreeSet::new();
            key_paths(&value, "", &mut keys);
            if aggregator {
                shown_aggregator.extend(keys.iter().cloned());
            }
            if agent {
                shown_agent.extend(keys);
            }
        }
    }
    for (daemon, defaults, shown) in [
        (
            "aggregator",
            smolder_daemon::default_yaml::<smolder_aggregator::config::Config>(),
            &shown_aggregator,
        ),
        (
            "agent",
            smolder_daemon::default_yaml::<smolder_agent::config::Config>(),
            &shown_agent,
        ),
    ] {
        let missing: Vec<String> = default_keys(&defaults)
            .into_iter()
            .filter(|key| !shown.contains(key))
            .collect();
        assert!(
            missing.is_empty(),
            "the {daemon}'s keys {missing:?} are in no example of README.md or OPERATIONS.md"
        );
    }
}

/// The HIDDEN entries of `daemon` that hide `key`.
fn hiding(daemon: &str, key: &str) -> Vec<&'static str> {
    HIDDEN
        .iter()
        .filter(|(d, hidden, _)| {
            *d == daemon && (key == *hidden || key.starts_with(&format!("{hidden}.")))
        })
        .map(|(_, hidden, _)| *hidden)
        .collect()
}

#[test]
fn every_config_key_prints_or_is_hidden_for_a_reason() {
    for (daemon, defaults, keys) in [
        (
            "aggregator",
            smolder_daemon::default_yaml::<smolder_aggregator::config::Config>(),
            config_keys::keys::<smolder_aggregator::config::Config>(),
        ),
        (
            "agent",
            smolder_daemon::default_yaml::<smolder_agent::config::Config>(),
            config_keys::keys::<smolder_agent::config::Config>(),
        ),
    ] {
        let printed = default_keys(&defaults);
        // The walk finds what prints: a broken walk would make every key hidden.
        assert!(
            printed.iter().filter(|key| keys.contains(*key)).count() > 20,
            "the {daemon}'s keys found: {keys:?}"
        );
        let mut unexplained = Vec::new();
        for key in &keys {
            let hidden = hiding(daemon, key);
            // A value the walk cannot look into (an internally tagged enum, such as
            // `store.object-store`) prints as a section: its keys are checked above as printed.
            let prints = printed.contains(key)
                || printed
                    .iter()
                    .any(|printed| printed.starts_with(&format!("{key}.")));
            if prints {
                assert!(
                    hidden.is_empty(),
                    "the {daemon}'s key {key} prints, yet HIDDEN hides it ({hidden:?})"
                );
            } else if hidden.is_empty() {
                unexplained.push(key.clone());
            }
        }
        assert!(
            unexplained.is_empty(),
            "the {daemon}'s keys {unexplained:?} do not print in print-default-config; print \
             them, or add them to HIDDEN with a reason"
        );
    }
    for (daemon, hidden, reason) in HIDDEN {
        assert!(!reason.is_empty(), "HIDDEN's {hidden} has no reason");
        let keys = match *daemon {
            "aggregator" => config_keys::keys::<smolder_aggregator::config::Config>(),
            "agent" => config_keys::keys::<smolder_agent::config::Config>(),
            other => panic!("HIDDEN names daemon {other:?}"),
        };
        assert!(
            keys.iter().any(|key| hiding(daemon, key).contains(hidden)),
            "HIDDEN's {hidden} is no key of the {daemon}"
        );
    }
}

#[test]
fn the_shell_parser_finds_every_program() {
    assert_eq!(
        programs(
            "# comment\nprintf 'a;b 1\\n' |\n  curl -g --data-binary @- 'x' # trailing\n\
             curl -X POST x -d '{\"a\": 1,\n  \"b\": 2}'   # 201\ncd fuzz && cargo fuzz\n\
             a \\\n  --flag\n"
        ),
        ["printf", "curl", "curl", "cd", "cargo", "a"]
    );
}

#[test]
fn architecture_names_paths_that_exist_and_lists_every_crate() {
    let doc = std::fs::read_to_string(repo().join("ARCHITECTURE.md")).unwrap();
    // The stage table: the first table of the file.
    let table: Vec<&str> = doc
        .lines()
        .skip_while(|line| !line.starts_with("| stage |"))
        .take_while(|line| line.starts_with('|'))
        .skip(2)
        .collect();
    assert!(
        table.len() >= 20,
        "the stage table has {} rows",
        table.len()
    );
    let mut missing = Vec::new();
    let mut without_folder = Vec::new();
    for row in &table {
        for path in row.split('`').skip(1).step_by(2) {
            // Paths only: not code names, globs or brace lists.
            let is_path = path.contains('/') && !path.contains(['*', '{', ' ', '"', '=']);
            if is_path && !repo().join(path).exists() {
                missing.push(path.to_owned());
            }
        }
        // Each stage names where it lives: a path in its module column (a folder or a file,
        // or the docs at the root).
        let module = row.split(" | ").nth(1).unwrap_or_default();
        let located = module.split('`').skip(1).step_by(2).any(|path| {
            (path.contains('/') || path.ends_with(".md")) && repo().join(path).exists()
        });
        if !located {
            without_folder.push(row.split(" | ").next().unwrap_or_default().to_owned());
        }
    }
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md's table names {missing:?}"
    );
    assert!(
        without_folder.is_empty(),
        "ARCHITECTURE.md's rows {without_folder:?} name no folder or file that exists"
    );
    // The workspace listing: every member, and nothing else.
    let listed: BTreeSet<String> = doc
        .lines()
        .skip_while(|line| !line.starts_with("The workspace, by crate"))
        .skip_while(|line| !line.starts_with("```"))
        .skip(1)
        .take_while(|line| !line.starts_with("```"))
        .filter_map(|line| line.split_whitespace().next())
        .map(|folder| folder.trim_end_matches('/').to_owned())
        .collect();
    let manifest = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    let members = manifest
        .lines()
        .find_map(|line| line.strip_prefix("members = "))
        .expect("a members line");
    let mut expected: BTreeSet<String> = members
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    expected.insert("fuzz".to_owned());
    assert_eq!(listed, expected, "ARCHITECTURE.md's workspace listing");
}

#[test]
fn the_glossary_is_in_alphabetical_order() {
    let glossary = std::fs::read_to_string(repo().join("GLOSSARY.md")).unwrap();
    let terms: Vec<String> = glossary
        .lines()
        .filter_map(|line| line.strip_prefix("- **"))
        .filter_map(|rest| rest.split_once("**"))
        .map(|(term, _)| term.to_lowercase())
        .collect();
    assert!(terms.len() > 100, "{} terms found", terms.len());
    for pair in terms.windows(2) {
        assert!(
            pair[0] <= pair[1],
            "GLOSSARY.md: {:?} comes before {:?}",
            pair[0],
            pair[1]
        );
    }
}

#[test]
fn architecture_lists_every_call_of_the_store_interface() {
    let source = std::fs::read_to_string(repo().join("aggregator/src/store/mod.rs")).unwrap();
    let calls: BTreeSet<String> = source
        .split_once("trait Store")
        .expect("the Store trait")
        .1
        .lines()
        .take_while(|line| *line != "}")
        .filter_map(|line| line.trim_start().strip_prefix("fn "))
        .map(|rest| rest.split(['(', '<']).next().unwrap().to_owned())
        .collect();
    assert!(calls.len() >= 10, "{calls:?}");
    let doc = std::fs::read_to_string(repo().join("ARCHITECTURE.md")).unwrap();
    let listed: BTreeSet<String> = doc
        .lines()
        .skip_while(|line| !line.starts_with("| call | what |"))
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .flat_map(|row| {
            let call = row.split('|').nth(1).unwrap_or_default();
            call.split('`')
                .skip(1)
                .step_by(2)
                .filter_map(|code| code.split_once('(').map(|(name, _)| name.to_owned()))
                // Calls only, not the types they answer with (`Ack<()>`).
                .filter(|name| name.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        listed, calls,
        "ARCHITECTURE.md's table of the store's interface against store::Store"
    );
}

#[test]
fn architecture_lists_every_module_of_both_daemons() {
    let doc = std::fs::read_to_string(repo().join("ARCHITECTURE.md")).unwrap();
    for krate in ["agent", "aggregator"] {
        let root = format!("{krate}/src/");
        // The listing's top level: names indented by two spaces (several on a line, comma
        // separated, before the description).
        let listed: BTreeSet<String> = doc
            .lines()
            .skip_while(|line| *line != root)
            .skip(1)
            .take_while(|line| !line.starts_with("```"))
            .filter(|line| line.starts_with("  ") && !line.starts_with("   "))
            .flat_map(|line| {
                line.split_whitespace()
                    .map(|word| word.trim_end_matches(','))
                    .take_while(|word| word.ends_with(".rs") || word.ends_with('/'))
                    .map(|word| word.trim_end_matches('/').to_owned())
                    .collect::<Vec<_>>()
            })
            .collect();
        let existing: BTreeSet<String> = std::fs::read_dir(repo().join(&root))
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .filter(|name| !["lib.rs", "main.rs"].contains(&name.as_str()))
            .collect();
        let listed: BTreeSet<String> = listed
            .into_iter()
            .filter(|name| !["lib.rs", "main.rs"].contains(&name.as_str()))
            .collect();
        assert_eq!(listed, existing, "ARCHITECTURE.md's listing of {root}");
    }
}
