//! Metrics (feature `metrics`): what every limiter records through the
//! [`metrics`](https://docs.rs/metrics) facade. The crate depends on no
//! exporter: install a recorder in the application *before* building the
//! limiters (a limiter registers its metrics when it is built). Without a
//! recorder, nothing is recorded and each call costs a branch.
//!
//! Every metric is labelled by the limiter's name (a Redis limiter's Redis
//! key, or for a keyed one its keys' prefix, `paceline:v1:api`;
//! [`Builder::name`](crate::Builder::name) for a local one, `default`
//! otherwise), never by a user's key: a key is client-controlled text, and one
//! label value per key would let clients grow the metrics without bound. The
//! names follow the OpenTelemetry conventions where they exist (rate limiting,
//! and the database client's operation duration); times are in seconds. Each
//! name is a constant of this module.
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `paceline.rate_limiting.requests` | counter | `limiter`, `result` = `acquired` or `refused` | reservations granted, and tries refused (nothing reserved); a request counts once, as it ended, however often it reserved |
//! | `paceline.rate_limiting.request.time_in_queue` | histogram, s | `limiter` | the wait of each granted reservation (0 when it went at once); of a request that waited more than once (a call for its slot, a caller again behind a pause an upstream's refusal started), the whole of it, counted once |
//! | `paceline.rate_limiting.given_back` | counter | `limiter` | reservations given back before their wait ended (a dropped future, a dropped [`Reservation`](crate::Reservation)) |
//! | `paceline.rate_limiting.keys` | gauge | `limiter` | keys a keyed limiter holds (in this process) |
//! | `paceline.rate_limiting.upstream.refused` | counter | `limiter` | refusals (429) of an upstream fed back to the limiter ([`Call::learn`](crate::outbound::Call::learn)) |
//! | `paceline.rate_limiting.rate` | gauge | `limiter` | the rate a limiter without keys, in this process, runs its first limit at, in permits per second, set when it learns from an upstream's answer (see [`outbound`](crate::outbound)) or its rates are set (`set_rate`, `set_limit_rate`) |
//! | `db.client.operation.duration` | histogram, s | `db.system.name` = `redis`, `db.operation.name` = `EVALSHA`, `error.type` on failure (`redis`, or `timeout` where the caller's time ran out first: recorded then, once) | each round trip of a Redis limiter |
//! | `paceline.redis.degraded` | gauge | | 1 while some part of Redis is down and limiters serve from their fallbacks, else 0 (per backend; the last one to change sets it) |
//! | `paceline.redis.fallback.switches` | counter | `to` = `local` or `redis` | parts of Redis marked down (calls switch to the fallback) and back up |
//!
//! `stats()` on the limiters and the backend reads the same events without a
//! recorder.
//!
//! Once a recorder is installed, every limiter records under its name:
//!
//! ```
//! use std::time::Duration;
//! use paceline::RateLimiter;
//!
//! let limiter = RateLimiter::builder()
//!     .permits_per_second(10.0)
//!     .name("outbound") // the `limiter` label
//!     .build()?;
//! limiter.reserve(1)?; // requests{limiter="outbound", result="acquired"} += 1
//! assert!(limiter.try_reserve(1, Duration::ZERO)?.is_none()); // result="refused"
//! # Ok::<(), paceline::Error>(())
//! ```
//!
//! The crate's `tests/metrics` checks each of these by value, with a small
//! recorder of its own.

// Without the feature the names are unused.
#![cfg_attr(not(feature = "metrics"), allow(dead_code))]

/// Reservations granted and tries refused: a counter.
pub const REQUESTS: &str = "paceline.rate_limiting.requests";
/// The wait of each granted reservation, in seconds: a histogram.
pub const TIME_IN_QUEUE: &str = "paceline.rate_limiting.request.time_in_queue";
/// Reservations given back: a counter.
pub const GIVEN_BACK: &str = "paceline.rate_limiting.given_back";
/// Keys a keyed limiter holds: a gauge.
pub const KEYS: &str = "paceline.rate_limiting.keys";
/// Refusals of an upstream fed back: a counter.
pub const UPSTREAM_REFUSED: &str = "paceline.rate_limiting.upstream.refused";
/// The rate of a limiter without keys, in this process, learned or set: a gauge.
pub const RATE: &str = "paceline.rate_limiting.rate";
/// Each Redis round trip, in seconds: a histogram.
pub const REDIS_CALL_DURATION: &str = "db.client.operation.duration";
/// 1 while part of Redis is down, else 0: a gauge.
pub const REDIS_DEGRADED: &str = "paceline.redis.degraded";
/// Switches to the fallback and back: a counter.
pub const REDIS_FALLBACK_SWITCHES: &str = "paceline.redis.fallback.switches";
