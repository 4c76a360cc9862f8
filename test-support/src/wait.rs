//! Waiting for a condition that another task or process makes true.

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `check` every 50 ms until it holds.
///
/// # Panics
///
/// When `limit` passes first, naming `what`.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: not within {limit:?}");
}
