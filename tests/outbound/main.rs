//! Pacing calls to a real HTTP upstream that enforces its own limits
//! (`paceline-upstream`: requests and tokens per second, 429 with
//! `Retry-After` and rate-limit headers), through the outbound layer: the
//! limiter configured at twice the upstream's limits learns them from its
//! answers, and settles each call's tokens from the response. And the
//! reading of that feedback (`feedback`), which needs no upstream.

#[path = "../support/mod.rs"]
mod support;

mod documented;
mod feedback;
#[cfg(all(feature = "http", feature = "redis"))]
mod fleet;
#[cfg(all(feature = "http", feature = "redis"))]
mod fleet_bounds;
mod hostile_upstream;
mod learned_at_random;
#[cfg(feature = "http")]
mod local;
