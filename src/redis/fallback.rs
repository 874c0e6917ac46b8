//! What a Redis limiter does while Redis is unavailable, and how it notices
//! that Redis is back.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// What to do when Redis cannot be reached, times out, or fails.
///
/// Whichever is chosen, the limiter's backend (its own, or a shared
/// [`RedisBackend`](super::RedisBackend)) then switches to *degraded* mode
/// ([`is_degraded`](super::RedisRateLimiter::is_degraded)): calls no longer
/// wait for Redis but are served by the fallback at once, and one background
/// probe opens a fresh connection every `probe_interval` and runs the
/// script on it, on the key whose call failed (in a mode that reserves
/// nothing but writes, so a server that answers PING but refuses writes
/// stays "down"). When the script works, that connection replaces the old
/// one and calls go back to Redis; each limiter's first call then carries
/// what its local fallback granted into its key. Switches are logged
/// (`tracing`, warn and info) and counted in [`RedisStats`].
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

    pub(crate) fn set_last_error(&self, error: &str) {
        if let Ok(mut last) = self.last_error.lock() {
            error.clone_into(&mut last);
        }
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
        self.set_last_error(error);
        let switched = self
            .degraded
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if switched {
            self.fallbacks.fetch_add(1, Ordering::Relaxed);
        }
        switched
    }

    /// Marks the limiter healthy again.
    pub(crate) fn recover(&self) {
        self.recoveries.fetch_add(1, Ordering::Relaxed);
        self.degraded.store(false, Ordering::Release);
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
