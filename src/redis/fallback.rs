//! What a Redis limiter does while Redis is unavailable, and how it notices
//! that Redis is back.

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
    /// Whether calls are being served by the fallback now (for a backend or
    /// a keyed limiter on a cluster: some of them, a node being down).
    pub degraded: bool,
    /// How many times the limiter switched to its fallback: went from all
    /// on Redis to (on a cluster, partly) degraded.
    pub fallbacks: u64,
    /// How many times it switched back to Redis: nothing degraded anymore.
    pub recoveries: u64,
    /// How many calls the fallback served.
    pub fallback_calls: u64,
    /// The keys a keyed limiter's fallback holds now (served locally, not
    /// yet carried back to Redis); 0 from a backend or an unkeyed limiter.
    pub local_keys: usize,
}
