//! The JFR parser against an oracle, the JDK's own `java` and `jfr` tools: a recording of a
//! program that burns CPU in `Burn.spin` converts to a `cpu` tree whose total is the number of
//! `jdk.ExecutionSample` events `jfr summary` counts, with `Burn.spin` on its stacks. And no
//! input, however malformed, makes the parser panic.

use std::path::Path;
use std::process::Command;

use proptest::prelude::*;
use smolder_common::jfr;

/// A program that spends about two seconds in `Burn.spin`.
const BURN: &str = r#"
public class Burn {
    static long spin(long n) {
        long x = 0;
        for (long i = 0; i < n; i++) {
            x += (i * 31) ^ (x >>> 3);
        }
        return x;
    }

    public static void main(String[] args) {
        long end = System.nanoTime() + 2_000_000_000L;
        long sum = 0;
        while (System.nanoTime() < end) {
            sum += spin(1_000_000);
        }
        System.out.println(sum);
    }
}
"#;

/// Runs `program` and returns its stdout, failing the test with its stderr when it fails.
fn run(program: &str, args: &[&str], dir: &Path) -> String {
    let output = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|err| {
            panic!(
                "cannot run {program} ({err}): install openjdk-17-jdk-headless \
                 (scripts/test installs it)"
            )
        });
    assert!(
        output.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The number of `event` events in `recording`, as `jfr summary` counts them.
fn jfr_count(recording: &Path, event: &str, dir: &Path) -> u64 {
    let path = recording.to_str().expect("temp paths are UTF-8");
    let summary = run("jfr", &["summary", path], dir);
    summary
        .lines()
        .find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some(event)).then(|| words.next()?.parse().ok())?
        })
        .unwrap_or(0)
}

#[test]
fn jdk_recording_matches_jfr_summary() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("Burn.java"), BURN).expect("write Burn.java");
    run("javac", &["Burn.java"], dir.path());
    let recording = dir.path().join("rec.jfr");
    let record = format!(
        "-XX:StartFlightRecording=filename={},settings=profile",
        recording.display()
    );
    run("java", &[&record, "Burn"], dir.path());
    let expected = jfr_count(&recording, "jdk.ExecutionSample", dir.path());
    assert!(expected > 0, "the JDK recorded no execution samples");

    let bytes = std::fs::read(&recording).expect("read rec.jfr");
    let series = jfr::parse(&bytes).expect("the JDK's recording parses");
    let cpu = series
        .iter()
        .find(|s| s.name_suffix == "cpu")
        .expect("a cpu series");
    assert_eq!(cpu.units, "samples");
    eprintln!(
        "rec.jfr: {} bytes, jfr summary: {expected} jdk.ExecutionSample, cpu tree total {}",
        bytes.len(),
        cpu.tree.total()
    );
    assert_eq!(cpu.tree.total(), expected);
    let mut spin = 0;
    cpu.tree.for_each_stack(|stack, value| {
        let names: Vec<&str> = stack.iter().map(|&f| cpu.tree.frames().name(f)).collect();
        if names.contains(&"Burn.spin") {
            // Root first: the program's entry point, then the method it calls.
            assert_eq!(names, ["Burn.main", "Burn.spin"]);
            spin += value;
        }
    });
    assert!(
        spin > expected / 2,
        "Burn.spin in {spin} of {expected} samples"
    );
}

proptest! {
    #[test]
    fn never_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let _ = jfr::parse(&bytes);
    }

    #[test]
    fn never_panics_behind_a_valid_header(tail in prop::collection::vec(any::<u8>(), 0..2048)) {
        // A header that points inside the tail, so the metadata and event readers run.
        let size = 68 + tail.len() as u64;
        let mut bytes = b"FLR\0\0\x02\0\0".to_vec();
        bytes.extend_from_slice(&size.to_be_bytes());
        bytes.extend_from_slice(&68u64.to_be_bytes());
        bytes.extend_from_slice(&68u64.to_be_bytes());
        bytes.extend_from_slice(&[0; 32]);
        bytes.extend_from_slice(&1u32.to_be_bytes());
        bytes.extend_from_slice(&tail);
        let _ = jfr::parse(&bytes);
    }
}
