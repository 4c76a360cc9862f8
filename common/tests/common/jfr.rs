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

    static byte[][] keep = new byte[16][];

    public static void main(String[] args) {
        // Large arrays are allocated outside TLABs and parks over 10 ms are recorded (the
        // `profile` settings' threshold), so those conversions have events to count too.
        for (int i = 0; i < 16; i++) {
            keep[i] = new byte[4 << 20];
            java.util.concurrent.locks.LockSupport.parkNanos(20_000_000L);
        }
        long end = System.nanoTime() + 2_000_000_000L;
        long sum = 0;
        while (System.nanoTime() < end) {
            sum += spin(1_000_000);
        }
        System.out.println(sum);
    }
}
"#;

/// The recording settings: the events Pyroscope converts, with stack traces. JDK 17's
/// `profile` settings leave the TLAB allocation events off (it samples allocations with
/// `jdk.ObjectAllocationSample` instead), so they are switched on here, as async-profiler
/// records them for the Java agent.
const SETTINGS: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<configuration version="2.0" label="smolder-test">
  <event name="jdk.ExecutionSample">
    <setting name="enabled">true</setting>
    <setting name="period">10 ms</setting>
  </event>
  <event name="jdk.ObjectAllocationInNewTLAB">
    <setting name="enabled">true</setting>
    <setting name="stackTrace">true</setting>
  </event>
  <event name="jdk.ObjectAllocationOutsideTLAB">
    <setting name="enabled">true</setting>
    <setting name="stackTrace">true</setting>
  </event>
  <event name="jdk.ThreadPark">
    <setting name="enabled">true</setting>
    <setting name="stackTrace">true</setting>
    <setting name="threshold">10 ms</setting>
  </event>
  <event name="jdk.JavaMonitorEnter">
    <setting name="enabled">true</setting>
    <setting name="stackTrace">true</setting>
    <setting name="threshold">10 ms</setting>
  </event>
</configuration>
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

/// The number of `event` events in `recording` that have a stack trace, as `jfr print --json`
/// reports them. Events without one (allocations by JIT compiler threads, for example) are
/// dropped by the conversion, as Pyroscope drops them.
fn jfr_count(recording: &Path, event: &str, dir: &Path) -> u64 {
    let path = recording.to_str().expect("temp paths are UTF-8");
    let json = run("jfr", &["print", "--json", "--events", event, path], dir);
    let json: serde_json::Value = serde_json::from_str(&json).expect("jfr print --json");
    let events = json["recording"]["events"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    events
        .iter()
        .filter(|e| e["type"] == event && !e["values"]["stackTrace"].is_null())
        .count() as u64
}

/// The number of `event` events in `recording`, as `jfr summary` counts them.
fn jfr_summary_count(recording: &Path, event: &str, dir: &Path) -> u64 {
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
    let settings = dir.path().join("smolder.jfc");
    std::fs::write(&settings, SETTINGS).expect("write smolder.jfc");
    let record = format!(
        "-XX:StartFlightRecording=filename={},settings={}",
        recording.display(),
        settings.display()
    );
    run("java", &[&record, "Burn"], dir.path());
    let expected = jfr_count(&recording, "jdk.ExecutionSample", dir.path());
    assert!(expected > 0, "the JDK recorded no execution samples");
    // Every execution sample has a stack trace: the summary's count is the oracle too.
    assert_eq!(
        jfr_summary_count(&recording, "jdk.ExecutionSample", dir.path()),
        expected
    );

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

    // Every other converted type counts one per event with a stack trace.
    for (event, suffix) in [
        ("jdk.ObjectAllocationInNewTLAB", "alloc_in_new_tlab_objects"),
        (
            "jdk.ObjectAllocationOutsideTLAB",
            "alloc_outside_tlab_objects",
        ),
    ] {
        let expected = jfr_count(&recording, event, dir.path());
        let total = series
            .iter()
            .find(|s| s.name_suffix == suffix)
            .map_or(0, |s| s.tree.total());
        eprintln!("{event}: jfr print {expected} with stacks, {suffix} total {total}");
        assert_eq!(total, expected, "{suffix}");
        assert!(total > 0, "the JDK recorded no {event}");
    }
    let locks = jfr_count(&recording, "jdk.JavaMonitorEnter", dir.path())
        + jfr_count(&recording, "jdk.ThreadPark", dir.path());
    let total = |suffix: &str| {
        series
            .iter()
            .find(|s| s.name_suffix == suffix)
            .map_or(0, |s| s.tree.total())
    };
    eprintln!(
        "locks: jfr print {locks}, lock_count total {}, lock_duration {} ns",
        total("lock_count"),
        total("lock_duration")
    );
    assert_eq!(total("lock_count"), locks);
    assert!(locks >= 16, "the 16 parks of 20 ms are recorded");
    assert!(total("alloc_outside_tlab_bytes") >= 16 * (4 << 20));
    // A recording of several chunks: each chunk has its own metadata and pools.
    let twice = jfr::parse(&[bytes.as_slice(), bytes.as_slice()].concat()).expect("two chunks");
    let cpu_twice = twice
        .iter()
        .find(|s| s.name_suffix == "cpu")
        .map(|s| s.tree.total());
    assert_eq!(cpu_twice, Some(2 * expected));
    // At least 16 parks of 20 ms each, converted from ticks to nanoseconds.
    assert!(total("lock_duration") >= 16 * 20_000_000);
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
