//! What a process costs, from `/proc`: resident memory and CPU time, and the machine's load
//! average, which every figure of a shared machine must be read with.

use std::time::Duration;

/// Linux reports CPU times in `/proc/<pid>/stat` in clock ticks of `USER_HZ`, 100 on every
/// architecture Smolder runs on.
const TICKS_PER_SECOND: u64 = 100;

/// One reading of a process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Resident set size, bytes (`VmRSS`).
    pub rss: u64,
    /// CPU time in user and kernel mode since it started.
    pub cpu: Duration,
}

/// `pid`'s usage now, or `None` when it is gone.
pub fn usage(pid: u32) -> Option<Usage> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map_or(0, |kib| kib * 1024);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(Usage {
        rss,
        cpu: cpu_of(&stat)?,
    })
}

/// utime + stime of a `/proc/<pid>/stat` line. The command name (field 2) may hold spaces and
/// parentheses, so fields are counted after its last `)`.
fn cpu_of(stat: &str) -> Option<Duration> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, utime field 14, stime field 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_millis(
        (utime + stime) * 1_000 / TICKS_PER_SECOND,
    ))
}

/// The 1-minute load average.
pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_after_the_command_name() {
        let stat = "42 (a (weird) name) S 1 42 42 0 -1 4194560 100 0 0 0 250 130 0 0 20 0 3 0 5 0";
        assert_eq!(cpu_of(stat), Some(Duration::from_millis(3_800)));
    }

    #[test]
    fn this_process_is_read() {
        let usage = usage(std::process::id()).expect("this process");
        assert!(usage.rss > 0);
        assert!(load_average() >= 0.0);
    }
}
