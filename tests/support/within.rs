//! Waiting, on the real clock, for something a background task does.

use std::time::{Duration, Instant};

/// Polls `done` every 5 ms for up to `limit`; returns how long it took, or
/// `None` if it never held.
pub async fn within(limit: Duration, mut done: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if done() {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}
