//! What a Redis limiter does while Redis is unavailable, and how it notices
//! that Redis is back.

/// What to do when Redis cannot be reached, times out, or fails.
///
/// Whichever is chosen, the [`RedisBackend`](super::RedisBackend) then
/// switches to *degraded* mode (`stats().degraded`): the fallback serves
/// calls at once, and one background probe opens a fresh connection every
/// `probe_interval` and runs the script on the key whose call failed, in a
/// mode that reserves nothing but writes (so a server that answers PING but
/// refuses writes stays down). When the script works, that connection
/// replaces the old one and calls go back to Redis, after what the fallback
/// granted is carried into Redis (see [the module docs](super)). Switches
/// are logged (`tracing`, warn and info) and counted in
/// [`Stats`](crate::Stats).
///
/// A key holding data of another type, or a call the script rejects, is not
/// an outage: [`Error::Backend`](crate::Error::Backend) whatever the
/// fallback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Fallback {
    /// Limit in this process with the same configuration (at the rate times
    /// the builder's [`local_fraction`](crate::Builder::local_fraction),
    /// e.g. `1/N` for N instances sharing the key). The default.
    #[default]
    Local,
    /// Grant every request at once: availability over limiting.
    FailOpen,
    /// Refuse every call with [`Error::Backend`](crate::Error::Backend):
    /// limiting over availability.
    FailClosed,
}
