//! Off-CPU profiles: where threads wait, and for how long.
//!
//! Input: the `ebpf.off-cpu` config section, and the kernel's switch-out samples (a stack, the
//! switch-out time and the sampling threshold) and switch-in samples (the time) of sampled
//! threads, by thread id. Output: blocked nanoseconds per stack, each weighted by 1 / the
//! probability its switch-out was sampled with, added to the window's stacks
//! ([`super::samples::WindowSamples`]); and the threshold the kernel samples with
//! ([`Throttle`]). Caller: the samples reader and the collector. Owns the table of threads
//! sampled and not back yet. Sans IO: times are kernel `CLOCK_MONOTONIC` nanoseconds given by
//! the caller.
//!
//! A thread blocked across a window boundary contributes to each window it spans: at every
//! window close ([`Pending::close`]) the part since its last boundary is counted and its start
//! moved to the boundary, so that a thread blocked in `epoll_wait` for a minute shows a steady
//! second per second, not one spike at wake-up. A wait shorter than `min-duration` counts for
//! nothing: it is counted only once it has lasted that long.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use smolder_agent_ebpf::offcpu;

/// Off-CPU sampling (`ebpf.off-cpu:`). Only with `ebpf.enabled: true`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct OffCpuConfig {
    /// Whether the agent samples threads that leave the CPU to wait (`<service>.off_cpu`).
    /// Default `false`.
    pub enabled: bool,
    /// The probability that a context switch is sampled, above 0 and at most 1 (`1.0`
    /// samples every switch). Each sample's duration is weighted by 1 / probability, so the
    /// totals estimate the real blocked time. Default `0.01`.
    pub probability: f64,
    /// Waits shorter than this are not counted: a number and a unit, `ns`, `us`, `ms`, `s` or
    /// `m` (`500us`, `1ms`, `2s`). Default `1ms`.
    #[serde(with = "fine_duration")]
    pub min_duration: Duration,
    /// At most this many switch-outs unwound per second on the host: past it the agent lowers
    /// the probability in use (exported as `smolder_agent_ebpf_off_cpu_probability`), and
    /// weights the samples by the probability they were taken with. `0` for no limit.
    /// Default `500`.
    pub max_unwinds_per_second: u64,
    /// Whether threads preempted while runnable (waiting in the run queue for a CPU) are
    /// sampled too, as their own type `<service>.run_queue`. Default `false`.
    pub run_queue: bool,
}

impl Default for OffCpuConfig {
    fn default() -> Self {
        OffCpuConfig {
            enabled: false,
            probability: 0.01,
            min_duration: Duration::from_millis(1),
            max_unwinds_per_second: 500,
            run_queue: false,
        }
    }
}

impl OffCpuConfig {
    /// The flags of the kernel's off-CPU config.
    pub(crate) fn flags(&self) -> u32 {
        if self.run_queue {
            offcpu::FLAG_RUN_QUEUE
        } else {
            0
        }
    }
}

/// A duration finer than a second, as config text: `<number><unit>`, the unit `ns`, `us`, `ms`,
/// `s` or `m`; written in the largest unit that holds it whole.
mod fine_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    const UNITS: [(&str, u64); 5] = [
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
        ("ns", 1),
    ];

    pub(super) fn serialize<S: Serializer>(value: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format(*value))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        parse(&text).ok_or_else(|| {
            D::Error::custom(format!(
                "invalid duration {text:?}: expected a whole number and a unit (ns, us, ms, s, m), such as 1ms"
            ))
        })
    }

    pub(super) fn format(value: Duration) -> String {
        let ns = u64::try_from(value.as_nanos()).unwrap_or(u64::MAX);
        let (unit, size) = UNITS
            .iter()
            .find(|(_, size)| ns > 0 && ns.is_multiple_of(*size))
            .copied()
            .unwrap_or(("ms", 1_000_000));
        format!("{}{unit}", ns / size)
    }

    pub(super) fn parse(text: &str) -> Option<Duration> {
        let text = text.trim();
        let split = text.find(|c: char| !c.is_ascii_digit())?;
        let (number, unit) = text.split_at(split);
        let number: u64 = number.parse().ok()?;
        let (_, size) = UNITS.iter().find(|(name, _)| *name == unit)?;
        Some(Duration::from_nanos(number.checked_mul(*size)?))
    }
}

/// The kernel's `CLOCK_MONOTONIC`, the clock of `bpf_ktime_get_ns`, in nanoseconds.
pub(crate) fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    u64::try_from(now.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(now.tv_nsec).unwrap_or(0)
}

/// One thread sampled at its switch-out, not back yet. `T` is what the caller keeps of its
/// stack.
#[derive(Clone, Debug)]
struct Waiting<T> {
    stack: T,
    /// The switch-out time.
    start: u64,
    /// Where the part not counted yet begins: `start`, or the last window boundary.
    from: u64,
    /// 1 / the probability it was sampled with.
    weight: f64,
}

/// A contribution to a window: `nanoseconds` (already weighted) on `stack`, and whether it
/// ends a wait (`true`) or is the part of a continuing wait up to a boundary (`false`).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Blocked<T> {
    /// What the caller kept of the stack.
    pub stack: T,
    /// Weighted nanoseconds.
    pub nanoseconds: u64,
    /// Whether the wait ended.
    pub ended: bool,
}

/// What happened to a switch-in.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Woke<T> {
    /// The wait counts: this much goes to the window.
    Counted(Blocked<T>),
    /// It lasted less than `min-duration`.
    TooShort,
    /// No switch-out of that thread is known (lost to a full ring buffer, or the table was
    /// full).
    Unmatched,
}

/// The threads sampled at switch-out and not back yet.
#[derive(Debug)]
pub(crate) struct Pending<T> {
    threads: HashMap<u32, Waiting<T>>,
    min_duration: u64,
    max: usize,
}

/// Threads a [`Pending`] table tracks at most: a switch-out beyond it is not counted. Each
/// entry holds a stack (a few hundred bytes).
pub(crate) const MAX_PENDING: usize = 65_536;

impl<T: Clone> Pending<T> {
    /// A table counting waits of at least `min_duration`, of at most `max` threads.
    pub(crate) fn new(min_duration: Duration, max: usize) -> Self {
        Pending {
            threads: HashMap::new(),
            min_duration: u64::try_from(min_duration.as_nanos()).unwrap_or(u64::MAX),
            max,
        }
    }

    /// Threads waiting.
    pub(crate) fn len(&self) -> usize {
        self.threads.len()
    }

    /// Thread `tid` left the CPU at `start`, sampled with `threshold`. Returns false when the
    /// table is full (the wait is not counted). A thread already waiting (its switch-in was
    /// lost) starts over.
    pub(crate) fn switched_out(&mut self, tid: u32, stack: T, start: u64, threshold: u32) -> bool {
        if self.threads.len() >= self.max && !self.threads.contains_key(&tid) {
            return false;
        }
        let weight = weight(threshold);
        self.threads.insert(
            tid,
            Waiting {
                stack,
                start,
                from: start,
                weight,
            },
        );
        true
    }

    /// Thread `tid` ran again at `end`.
    pub(crate) fn switched_in(&mut self, tid: u32, end: u64) -> Woke<T> {
        let Some(waiting) = self.threads.remove(&tid) else {
            return Woke::Unmatched;
        };
        if end.saturating_sub(waiting.start) < self.min_duration {
            return Woke::TooShort;
        }
        Woke::Counted(Blocked {
            nanoseconds: weighted(end.saturating_sub(waiting.from), waiting.weight),
            stack: waiting.stack,
            ended: true,
        })
    }

    /// A window ends at `boundary`: each wait that has lasted `min-duration` by then gives
    /// the part since its last boundary, and continues from `boundary`.
    pub(crate) fn close(&mut self, boundary: u64) -> Vec<Blocked<T>> {
        let mut out = Vec::new();
        for waiting in self.threads.values_mut() {
            if boundary <= waiting.from || boundary - waiting.start < self.min_duration {
                continue;
            }
            out.push(Blocked {
                stack: waiting.stack.clone(),
                nanoseconds: weighted(boundary - waiting.from, waiting.weight),
                ended: false,
            });
            waiting.from = boundary;
        }
        out
    }

    /// Forgets the waits of the threads `keep` refuses (a process that exited).
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        self.threads.retain(|_, waiting| keep(&waiting.stack));
    }
}

/// The switch-outs a sample taken with `threshold` stands for: 1 / its probability (1 for a
/// threshold of 0, which the kernel never samples with).
pub(crate) fn weight(threshold: u32) -> f64 {
    let probability = offcpu::probability(threshold);
    if probability > 0.0 {
        1.0 / probability
    } else {
        1.0
    }
}

fn weighted(nanoseconds: u64, weight: f64) -> u64 {
    // Saturating: a float above u64::MAX converts to u64::MAX.
    (nanoseconds as f64 * weight).round() as u64
}

/// Keeps the host's off-CPU unwinds under `max-unwinds-per-second` by lowering the
/// probability in use, and raises it back towards the configured one when switches slow down.
/// It lowers as soon as a tenth of a second has run over the limit, so that a burst of
/// switches is capped within it; it raises at most once a second. The new probability comes
/// from the switches the unwinds stand for, each weighted by the probability it was sampled
/// with: samples read after a change but taken before it (the ring buffer is read every
/// 50 ms) do not make it lower the probability twice. Sans IO: fed the unwinds seen and the
/// time.
#[derive(Debug)]
pub(crate) struct Throttle {
    configured: f64,
    max_per_second: u64,
    current: f64,
    since: Instant,
    unwinds: u64,
    switches: u64,
}

/// How often the probability is reconsidered.
const THROTTLE_PERIOD: Duration = Duration::from_secs(1);

/// How soon a rate over the limit lowers the probability: a ping-pong of a second at 4,000
/// unwinds a second ran its whole length at the full rate with the one-second period.
const THROTTLE_LOWER_AFTER: Duration = Duration::from_millis(100);

impl Throttle {
    /// A throttle for `config`, starting at the configured probability at `now`.
    pub(crate) fn new(config: &OffCpuConfig, now: Instant) -> Self {
        Throttle {
            configured: config.probability,
            max_per_second: config.max_unwinds_per_second,
            current: config.probability,
            since: now,
            unwinds: 0,
            switches: 0,
        }
    }

    /// The probability in use.
    pub(crate) fn probability(&self) -> f64 {
        self.current
    }

    /// Counts `unwinds` switch-outs sampled, standing for `switches` switch-outs (the sum of
    /// their [`weight`]s); returns the new probability when it changes: lower at most every
    /// tenth of a second, higher at most every second.
    pub(crate) fn observe(&mut self, unwinds: u64, switches: u64, now: Instant) -> Option<f64> {
        self.unwinds = self.unwinds.saturating_add(unwinds);
        self.switches = self.switches.saturating_add(switches);
        let elapsed = now.saturating_duration_since(self.since);
        if self.max_per_second == 0 || elapsed < THROTTLE_LOWER_AFTER {
            return None;
        }
        let seconds = elapsed.as_secs_f64();
        let over = self.unwinds as f64 / seconds > self.max_per_second as f64;
        if elapsed < THROTTLE_PERIOD && !over {
            return None;
        }
        // The probability that would give `max` unwinds of the switches seen, at most doubling
        // per period so that one quiet second does not open the gate wide, and never higher
        // while over the limit.
        let switch_rate = self.switches as f64 / seconds;
        let mut next = if switch_rate > 0.0 {
            (self.max_per_second as f64 / switch_rate).min(self.current * 2.0)
        } else {
            self.current * 2.0
        };
        if over {
            next = next.min(self.current);
        }
        let next = next.min(self.configured).max(f64::MIN_POSITIVE);
        self.since = now;
        self.unwinds = 0;
        self.switches = 0;
        // Changes under 5% are noise.
        if (next - self.current).abs() <= self.current * 0.05 && next != self.configured {
            return None;
        }
        if next == self.current {
            return None;
        }
        self.current = next;
        Some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn pending() -> Pending<&'static str> {
        Pending::new(Duration::from_millis(1), 4)
    }

    #[test]
    fn min_durations_read_and_write_in_fine_units() {
        for (text, duration) in [
            ("1ms", Duration::from_millis(1)),
            ("500us", Duration::from_micros(500)),
            ("2s", Duration::from_secs(2)),
            ("3m", Duration::from_secs(180)),
            ("7ns", Duration::from_nanos(7)),
        ] {
            assert_eq!(fine_duration::parse(text), Some(duration), "{text}");
            assert_eq!(fine_duration::format(duration), text);
        }
        for bad in [
            "",
            "1",
            "ms",
            "1.5ms",
            "1h",
            "-1ms",
            "99999999999999999999s",
        ] {
            assert_eq!(fine_duration::parse(bad), None, "{bad}");
        }
        assert_eq!(fine_duration::format(Duration::ZERO), "0ms");
    }

    #[test]
    fn a_wait_counts_its_duration_weighted_by_its_probability() {
        let mut table = pending();
        assert!(table.switched_out(7, "sleep", 100 * MS, offcpu::ALWAYS));
        assert_eq!(
            table.switched_in(7, 105 * MS),
            Woke::Counted(Blocked {
                stack: "sleep",
                nanoseconds: 5 * MS,
                ended: true
            })
        );
        table.switched_out(8, "sleep", 0, offcpu::threshold(0.1));
        let Woke::Counted(blocked) = table.switched_in(8, 5 * MS) else {
            panic!("counted");
        };
        assert!((blocked.nanoseconds as f64 - 50.0 * MS as f64).abs() < 1e3);
        assert_eq!(table.switched_in(8, 6 * MS), Woke::Unmatched);
    }

    #[test]
    fn short_waits_count_for_nothing() {
        let mut table = pending();
        table.switched_out(1, "spin", 0, offcpu::ALWAYS);
        assert_eq!(table.switched_in(1, MS / 2), Woke::TooShort);
        // Not split at a boundary before it lasted min-duration, counted whole after.
        table.switched_out(1, "spin", 0, offcpu::ALWAYS);
        assert!(table.close(MS / 2).is_empty());
        let Woke::Counted(blocked) = table.switched_in(1, 3 * MS) else {
            panic!("counted");
        };
        assert_eq!(blocked.nanoseconds, 3 * MS);
    }

    #[test]
    fn a_long_wait_is_split_at_every_boundary() {
        let mut table = pending();
        table.switched_out(3, "epoll", 500 * MS, offcpu::ALWAYS);
        let mut per_window = Vec::new();
        for boundary in [1000, 2000, 3000] {
            let closed = table.close(boundary * MS);
            assert_eq!(closed.len(), 1);
            assert!(!closed[0].ended);
            per_window.push(closed[0].nanoseconds / MS);
        }
        let Woke::Counted(last) = table.switched_in(3, 3250 * MS) else {
            panic!("counted");
        };
        per_window.push(last.nanoseconds / MS);
        assert_eq!(per_window, [500, 1000, 1000, 250]);
        assert_eq!(table.len(), 0);
    }

    #[test]
    fn the_table_is_bounded_and_forgets_exited_processes() {
        let mut table = pending();
        for tid in 0..4 {
            assert!(table.switched_out(tid, if tid % 2 == 0 { "a" } else { "b" }, 0, 1));
        }
        assert!(!table.switched_out(9, "c", 0, 1));
        assert!(
            table.switched_out(2, "a", 5, 1),
            "a known thread starts over"
        );
        table.retain(|stack| *stack != "a");
        assert_eq!(table.len(), 2);
    }

    /// Every switch sampled, at most 500 unwinds a second.
    fn capped_at_500() -> OffCpuConfig {
        OffCpuConfig {
            probability: 1.0,
            max_unwinds_per_second: 500,
            ..OffCpuConfig::default()
        }
    }

    #[test]
    fn the_throttle_keeps_unwinds_under_the_limit_and_recovers() {
        let config = capped_at_500();
        let start = Instant::now();
        let mut throttle = Throttle::new(&config, start);
        let ms = |n: u64| start + Duration::from_millis(n);
        assert_eq!(
            throttle.observe(400, 400, ms(80)),
            None,
            "not a tenth of a second yet"
        );
        // 5,000 switches a second at probability 1: 10 times too many, seen after 100 ms.
        let p = throttle.observe(100, 100, ms(100)).unwrap();
        assert!((p - 0.1).abs() < 1e-9, "{p}");
        // At 0.1 the same switches give 500 unwinds a second: it holds, and under the limit
        // it waits for a whole second before it would raise.
        assert_eq!(throttle.observe(50, 500, ms(200)), None);
        assert_eq!(throttle.observe(450, 4500, ms(1100)), None);
        // Quiet: it doubles back up to the configured probability, never above, once a second.
        assert_eq!(
            throttle.observe(0, 0, ms(2000)),
            None,
            "under a second since"
        );
        let mut at = 2;
        while throttle.probability() < 1.0 {
            at += 1;
            throttle
                .observe(0, 0, start + Duration::from_secs(at))
                .unwrap();
        }
        assert_eq!(throttle.probability(), 1.0);
        assert_eq!(
            throttle.observe(0, 0, start + Duration::from_secs(at + 1)),
            None
        );
        let unlimited = OffCpuConfig {
            max_unwinds_per_second: 0,
            ..config
        };
        let mut throttle = Throttle::new(&unlimited, start);
        assert_eq!(
            throttle.observe(1_000_000, 1_000_000, start + Duration::from_secs(1)),
            None
        );
    }

    #[test]
    fn samples_taken_before_a_change_do_not_lower_the_probability_twice() {
        let start = Instant::now();
        let mut throttle = Throttle::new(&capped_at_500(), start);
        let ms = |n: u64| start + Duration::from_millis(n);
        // 5,000 switches a second: lowered to 0.1.
        let p = throttle.observe(500, 500, ms(100)).unwrap();
        assert!((p - 0.1).abs() < 1e-9, "{p}");
        // The next tenth of a second reads 250 unwinds taken at 1 before the change, and 50 at
        // 0.1 after it: 3,000 a second, but standing for 750 switches, not 3,000 at 0.1.
        let p = throttle.observe(300, 250 + 500, ms(200)).unwrap();
        assert!((p - 500.0 / 7500.0).abs() < 1e-9, "{p}");
        // Over the limit, it never raises, whatever the switches seem to say.
        assert_eq!(throttle.observe(60, 60, ms(300)), None);
    }
}
