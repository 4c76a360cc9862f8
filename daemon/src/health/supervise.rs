//! A worker thread under supervision: its loop runs inside `catch_unwind`; a panic or an error
//! is logged with its message, counted in `smolder_<tier>_health_restarts_total{loop}`, and the
//! loop runs again after a backoff (1 s, doubling to 16 s), its state `restarting` meanwhile.
//! Five failures in a row (none after 60 s of running) leave it dead: the daemon reports itself
//! unhealthy and stops pinging the watchdog, so that systemd restarts the whole process.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::{error, info_span};

use super::Heartbeat;

/// The first wait before a restart; each failure in a row doubles it.
const BACKOFF_MIN: Duration = Duration::from_secs(1);
/// The longest wait before a restart.
const BACKOFF_MAX: Duration = Duration::from_secs(16);
/// A run this long ends a series of failures.
const HEALTHY_RUN: Duration = Duration::from_secs(60);
/// Failures in a row after which the loop is left dead.
const MAX_FAILURES: u32 = 5;

/// A supervised thread; joining it waits for its loop to end (its body returned `Ok`).
#[derive(Debug)]
pub struct Supervised {
    thread: JoinHandle<()>,
}

impl Supervised {
    /// Waits for the thread to end. Its loop's panics were caught, so this does not fail.
    pub fn join(self) {
        // The supervisor itself does not panic; a panic of the body was caught.
        let _ = self.thread.join();
    }

    /// Whether the thread has ended.
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }
}

/// Starts the thread `thread_name` running `body` under supervision with `heartbeat`: `body`
/// runs its loop, beating, and returns `Ok` when asked to stop (the thread ends, the loop
/// stopped). A panic or an `Err` restarts it after a backoff; `body` gets the same captures
/// again (they must be left usable by a panic: state a fresh run rebuilds or can take as is).
///
/// # Errors
///
/// When the thread cannot be started.
pub fn supervise<F>(
    heartbeat: Heartbeat,
    thread_name: &str,
    mut body: F,
) -> std::io::Result<Supervised>
where
    F: FnMut(&Heartbeat) -> anyhow::Result<()> + Send + 'static,
{
    let thread = std::thread::Builder::new()
        .name(thread_name.to_owned())
        .spawn(move || {
            let _span = info_span!("supervise", loop_name = heartbeat.name()).entered();
            let mut failures = 0u32;
            loop {
                let started = Instant::now();
                let why = match catch_unwind(AssertUnwindSafe(|| body(&heartbeat))) {
                    Ok(Ok(())) => return,
                    Ok(Err(err)) => format!("failed: {err:#}"),
                    Err(panic) => format!("panicked: {}", panic_message(&*panic)),
                };
                if started.elapsed() >= HEALTHY_RUN {
                    failures = 0;
                }
                failures += 1;
                if failures >= MAX_FAILURES {
                    error!(
                        loop_name = heartbeat.name(),
                        error = why,
                        failures,
                        "a loop failed too often in a row; left dead, the daemon reports itself unhealthy"
                    );
                    heartbeat.dead(&format!("{why} ({failures} times in a row; not restarted)"));
                    return;
                }
                let delay = backoff(failures);
                heartbeat.restarting(&why);
                error!(
                    loop_name = heartbeat.name(),
                    error = why,
                    restarts = heartbeat.restarts(),
                    delay_s = delay.as_secs_f64(),
                    "a loop failed; restarting it"
                );
                std::thread::sleep(delay);
            }
        })?;
    Ok(Supervised { thread })
}

/// The wait before the restart after `failures` failures in a row (at least 1).
fn backoff(failures: u32) -> Duration {
    BACKOFF_MIN
        .saturating_mul(1 << failures.saturating_sub(1).min(16))
        .min(BACKOFF_MAX)
}

/// What a panic said: its `&str` or `String` payload.
fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let waits: Vec<u64> = (1..=7).map(|f| backoff(f).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 16, 16]);
    }

    #[test]
    fn panic_messages_are_read_from_both_payloads() {
        let text: Box<dyn Any + Send> = Box::new("static");
        let owned: Box<dyn Any + Send> = Box::new(String::from("owned"));
        let other: Box<dyn Any + Send> = Box::new(3u8);
        assert_eq!(panic_message(&*text), "static");
        assert_eq!(panic_message(&*owned), "owned");
        assert_eq!(panic_message(&*other), "a panic without a message");
    }
}
