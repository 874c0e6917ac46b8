//! What a Redis limiter does while Redis is unavailable, and how it notices
//! that Redis is back.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use super::connection::Connection;

/// What to do when Redis cannot be reached, times out, or fails.
///
/// Whichever is chosen, the limiter then switches to *degraded* mode
/// ([`is_degraded`](super::RedisRateLimiter::is_degraded)): calls no longer
/// wait for Redis but are served by the fallback at once, and one background
/// probe PINGs Redis every `probe_interval` until it answers, when calls go
/// back to Redis. Switches are logged (`tracing`, warn and info) and counted
/// in [`RedisStats`].
///
/// A key that holds data of another type, or a call the script rejects, is
/// not an outage: such calls return [`Error::Backend`](crate::Error::Backend)
/// whatever the fallback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fallback {
    /// Limit in this process with the same configuration (at the rate times
    /// the builder's [`local_fraction`](super::RedisBuilder::local_fraction),
    /// e.g. `1/N` for N instances sharing the key). The default.
    #[default]
    Local,
    /// Grant every request at once: availability over limiting.
    FailOpen,
    /// Refuse every call with [`Error::Backend`](crate::Error::Backend):
    /// limiting over availability.
    FailClosed,
}

/// Counters of a Redis limiter's health, from [`stats`](super::RedisRateLimiter::stats).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct RedisStats {
    /// Whether calls are being served by the fallback now.
    pub degraded: bool,
    /// How many times the limiter switched to its fallback.
    pub fallbacks: u64,
    /// How many times it switched back to Redis.
    pub recoveries: u64,
    /// How many calls the fallback served.
    pub fallback_calls: u64,
}

/// Shared between a limiter and its probe task.
#[derive(Debug, Default)]
pub(crate) struct Health {
    degraded: AtomicBool,
    closed: AtomicBool,
    fallbacks: AtomicU64,
    recoveries: AtomicU64,
    fallback_calls: AtomicU64,
    last_error: Mutex<String>,
}

impl Health {
    pub(crate) fn is_degraded(&self) -> bool {
        self.degraded.load(Ordering::Acquire)
    }

    pub(crate) fn count_fallback_call(&self) {
        self.fallback_calls.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn last_error(&self) -> String {
        self.last_error
            .lock()
            .map(|e| e.clone())
            .unwrap_or_default()
    }

    /// Marks the limiter degraded; returns true if it was not already (the
    /// caller then starts the probe).
    pub(crate) fn degrade(&self, error: &str) -> bool {
        if let Ok(mut last) = self.last_error.lock() {
            error.clone_into(&mut last);
        }
        let switched = self
            .degraded
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if switched {
            self.fallbacks.fetch_add(1, Ordering::Relaxed);
        }
        switched
    }

    fn recover(&self) {
        self.recoveries.fetch_add(1, Ordering::Relaxed);
        self.degraded.store(false, Ordering::Release);
    }

    /// Stops the probe: the limiter is gone.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    pub(crate) fn stats(&self) -> RedisStats {
        RedisStats {
            degraded: self.is_degraded(),
            fallbacks: self.fallbacks.load(Ordering::Relaxed),
            recoveries: self.recoveries.load(Ordering::Relaxed),
            fallback_calls: self.fallback_calls.load(Ordering::Relaxed),
        }
    }
}

/// PINGs Redis every `interval` (each PING bounded by `response_timeout`)
/// until it answers, then marks the limiter healthy. Ends early if the
/// limiter is dropped.
pub(crate) async fn probe(
    health: Arc<Health>,
    mut connection: Connection,
    key: String,
    interval: Duration,
    response_timeout: Duration,
) {
    loop {
        tokio::time::sleep(interval).await;
        if health.closed.load(Ordering::Acquire) {
            return;
        }
        let ping_cmd = redis::cmd("PING");
        let ping = ping_cmd.query_async::<String>(&mut connection);
        if let Ok(Ok(_)) = tokio::time::timeout(response_timeout, ping).await {
            health.recover();
            tracing::info!(key = %key, "Redis answers again; the limiter is back on Redis");
            return;
        }
    }
}
