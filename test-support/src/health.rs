//! `/healthz` and `/readyz` as both daemons answer them (`smolder_daemon::health`): a verdict
//! line, then a table `loop state last-beat restarts detail`, read into rows by loop name.

use std::time::{Duration, Instant};

/// How long a state a test waits for may take on a loaded machine.
pub const PATIENCE: Duration = Duration::from_secs(120);

/// One loop's row of a health body.
#[derive(Debug)]
pub struct Row {
    /// `running`, `degraded`, `restarting`, `stuck`, `dead`, …
    pub state: String,
    /// Restarts since the daemon started.
    pub restarts: u64,
    /// Why it is in that state (free text), if anything.
    pub detail: String,
}

/// One answer of `/healthz` or `/readyz`: status, body and rows by loop name.
#[derive(Debug)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// The whole body, for failure messages.
    pub body: String,
    /// The table's rows, in its order.
    pub rows: Vec<(String, Row)>,
}

impl Answer {
    /// The row of loop `name`; fails naming the body when there is none.
    pub fn row(&self, name: &str) -> &Row {
        self.rows
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, row)| row)
            .unwrap_or_else(|| panic!("no loop {name} in\n{}", self.body))
    }

    /// Whether loop `name` is in `state`.
    pub fn is(&self, name: &str, state: &str) -> bool {
        self.rows
            .iter()
            .any(|(n, row)| n == name && row.state == state)
    }
}

/// Asks `base` (`http://host:port`) for `path` and reads the table.
pub async fn probe(base: &str, path: &str) -> Answer {
    let response = reqwest::get(format!("{base}{path}")).await.unwrap();
    let status = response.status().as_u16();
    let body = response.text().await.unwrap();
    let rows = body
        .lines()
        .skip_while(|line| !line.starts_with("loop "))
        .skip(1)
        .map(|line| {
            let mut columns = line.split_whitespace();
            let name = columns.next().unwrap().to_owned();
            let state = columns.next().unwrap().to_owned();
            let _beat = columns.next().unwrap();
            let restarts = columns.next().unwrap().parse().unwrap();
            let detail = columns.collect::<Vec<_>>().join(" ");
            (
                name,
                Row {
                    state,
                    restarts,
                    detail,
                },
            )
        })
        .collect();
    Answer { status, body, rows }
}

/// Polls `path` every 20 ms until `check` holds for its answer, failing after [`PATIENCE`]
/// with `what` and the last body.
pub async fn until(base: &str, path: &str, what: &str, check: impl Fn(&Answer) -> bool) -> Answer {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let answer = probe(base, path).await;
        if check(&answer) {
            return answer;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: last {path} {}:\n{}",
            answer.status,
            answer.body
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
