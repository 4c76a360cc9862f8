//! Child processes under test: Smolder's daemons (and other servers) that bind port 0 and say
//! where they listen in their log, which the fixture reads.
//!
//! [`daemon`] builds the command line of a Smolder binary that logs JSON with its `listening`
//! lines (`smolder_daemon::listening`); [`Process`] runs any command with its stderr read on
//! a thread, kept whole for assertions, and waits for lines in it.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long a process may take to say something the test waits for.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// A command running the Smolder daemon binary `bin` with JSON logs filtered by `log_level`,
/// plus the `listening` lines whatever the level; stdout discarded. Add the daemon's own
/// arguments (`--config`, `--data-dir`) and [`Process::spawn`] it.
pub fn daemon(bin: &Path, log_level: &str) -> Command {
    let mut command = Command::new(bin);
    command
        .args(["--log-format", "json", "--log-level"])
        .arg(format!("{log_level},smolder_daemon=info"))
        .stdout(Stdio::null());
    command
}

/// A running child whose stderr is collected; killed when dropped.
pub struct Process {
    child: Child,
    output: Arc<Output>,
    what: String,
}

#[derive(Default)]
struct Output {
    /// Everything written to stderr so far, and whether it was closed.
    text: Mutex<(String, bool)>,
    grown: Condvar,
}

impl Process {
    /// Starts `command` with stderr piped and read on a thread.
    ///
    /// # Panics
    ///
    /// When it cannot start.
    pub fn spawn(mut command: Command) -> Process {
        let what = command.get_program().to_string_lossy().into_owned();
        let mut child = command
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|err| panic!("starting {what}: {err}"));
        let stderr = child.stderr.take().expect("stderr is piped");
        let output = Arc::new(Output::default());
        let shared = Arc::clone(&output);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let mut text = shared.text.lock().expect("not poisoned");
                text.0.push_str(&line);
                text.0.push('\n');
                shared.grown.notify_all();
            }
            shared.text.lock().expect("not poisoned").1 = true;
            shared.grown.notify_all();
        });
        Process {
            child,
            output,
            what,
        }
    }

    /// The address a Smolder daemon's listener `listener` (`http`, `quic`) is bound to, from
    /// its `listening` log line.
    ///
    /// # Panics
    ///
    /// When the line does not come within [`PATIENCE`] (the process exited, or logs otherwise).
    pub fn listening(&self, listener: &str) -> SocketAddr {
        self.listening_within(listener, PATIENCE)
    }

    /// [`listening`](Process::listening), waiting up to `patience`: for a daemon that does
    /// long work before it binds, such as an aggregator replaying a large head after a kill.
    ///
    /// # Panics
    ///
    /// When the line does not come within `patience`.
    pub fn listening_within(&self, listener: &str, patience: Duration) -> SocketAddr {
        let what = format!("the {listener} listener's address");
        let line = self.wait_for_line_within(&what, patience, |line| {
            let Ok(json) = serde_json::from_str::<serde_json::Value>(line) else {
                return false;
            };
            json["fields"]["message"] == "listening" && json["fields"]["listener"] == listener
        });
        let json: serde_json::Value = serde_json::from_str(&line).expect("checked above");
        json["fields"]["addr"]
            .as_str()
            .and_then(|addr| addr.parse().ok())
            .unwrap_or_else(|| panic!("a listening line without an address: {line}"))
    }

    /// The first stderr line for which `matches` holds, waiting for it up to [`PATIENCE`].
    ///
    /// # Panics
    ///
    /// When none comes in time or stderr closes first; the message holds the whole log.
    pub fn wait_for_line(&self, what: &str, matches: impl Fn(&str) -> bool) -> String {
        self.wait_for_line_within(what, PATIENCE, matches)
    }

    /// [`wait_for_line`](Process::wait_for_line), waiting up to `patience`.
    ///
    /// # Panics
    ///
    /// When none comes in time or stderr closes first; the message holds the whole log.
    pub fn wait_for_line_within(
        &self,
        what: &str,
        patience: Duration,
        matches: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + patience;
        let mut text = self.output.text.lock().expect("not poisoned");
        loop {
            if let Some(line) = text.0.lines().find(|line| matches(line)) {
                return line.to_owned();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !text.1 && !left.is_zero(),
                "{}: no {what} in its log{}:\n{}",
                self.what,
                if text.1 { " (it closed stderr)" } else { "" },
                text.0
            );
            text = self
                .output
                .grown
                .wait_timeout(text, left)
                .expect("not poisoned")
                .0;
        }
    }

    /// Everything the process wrote to stderr so far.
    pub fn log(&self) -> String {
        self.output.text.lock().expect("not poisoned").0.clone()
    }

    /// Its process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM, as systemd stops a unit.
    ///
    /// # Panics
    ///
    /// When `kill` cannot be run.
    pub fn terminate(&self) {
        self.signal("TERM");
    }

    /// Sends the signal named `name` (`TERM`, `STOP`, `CONT`, …).
    ///
    /// # Panics
    ///
    /// When `kill` cannot be run or fails.
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("running kill");
        assert!(
            status.success(),
            "kill -{name} {}: {status}",
            self.child.id()
        );
    }

    /// Sends SIGKILL and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for it to exit, then for its stderr to close, and returns how it ended.
    ///
    /// # Panics
    ///
    /// When waiting fails.
    pub fn wait(&mut self) -> ExitStatus {
        let status = self.child.wait().expect("waiting for the child");
        let deadline = Instant::now() + PATIENCE;
        let mut text = self.output.text.lock().expect("not poisoned");
        while !text.1 && Instant::now() < deadline {
            text = self
                .output
                .grown
                .wait_timeout(text, Duration::from_millis(100))
                .expect("not poisoned")
                .0;
        }
        status
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}
