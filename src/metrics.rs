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
//! | `paceline.rate_limiting.requests` | counter | `limiter`, `result` = `acquired` or `refused` | reservations granted, and tries refused (nothing reserved) |
//! | `paceline.rate_limiting.request.time_in_queue` | histogram, s | `limiter` | the wait of each granted reservation (0 when it went at once) |
//! | `paceline.rate_limiting.given_back` | counter | `limiter` | reservations given back before their wait ended (a dropped future, a dropped [`Reservation`](crate::Reservation)) |
//! | `paceline.rate_limiting.keys` | gauge | `limiter` | keys a keyed limiter holds (in this process) |
//! | `paceline.rate_limiting.upstream.refused` | counter | `limiter` | refusals (429) of an upstream fed back to the limiter ([`Call::learn`](crate::outbound::Call::learn)) |
//! | `paceline.rate_limiting.rate` | gauge | `limiter` | the rate a limiter without keys, in this process, runs its first limit at, in permits per second, set when it learns from an upstream's answer (see [`outbound`](crate::outbound)) |
//! | `db.client.operation.duration` | histogram, s | `db.system.name` = `redis`, `db.operation.name` = `EVALSHA`, `error.type` on failure | each round trip of a Redis limiter |
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

// Without the feature the names are unused, and without Redis the backend's
// handles.
#![cfg_attr(not(all(feature = "metrics", feature = "redis")), allow(dead_code))]

use std::time::Duration;

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
/// The learned rate of a limiter without keys, in this process: a gauge.
pub const RATE: &str = "paceline.rate_limiting.rate";
/// Each Redis round trip, in seconds: a histogram.
pub const REDIS_CALL_DURATION: &str = "db.client.operation.duration";
/// 1 while part of Redis is down, else 0: a gauge.
pub const REDIS_DEGRADED: &str = "paceline.redis.degraded";
/// Switches to the fallback and back: a counter.
pub const REDIS_FALLBACK_SWITCHES: &str = "paceline.redis.fallback.switches";

/// A limiter's handles (registered when it is built), or nothing: the feature
/// is off, and every method is empty.
#[doc(hidden)]
#[derive(Clone, Default)]
pub struct Metrics {
    #[cfg(feature = "metrics")]
    handles: Option<std::sync::Arc<Handles>>,
}

#[cfg(feature = "metrics")]
struct Handles {
    acquired: metrics::Counter,
    refused: metrics::Counter,
    given_back: metrics::Counter,
    time_in_queue: metrics::Histogram,
    keys: metrics::Gauge,
    upstream_refused: metrics::Counter,
    rate: metrics::Gauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    /// The handles of the limiter called `name` (`None`: `default`).
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn named(name: Option<&str>) -> Metrics {
        #[cfg(feature = "metrics")]
        {
            let limiter = name.unwrap_or("default").to_owned();
            let handles = Handles {
                acquired: metrics::counter!(REQUESTS, "limiter" => limiter.clone(), "result" => "acquired"),
                refused: metrics::counter!(REQUESTS, "limiter" => limiter.clone(), "result" => "refused"),
                given_back: metrics::counter!(GIVEN_BACK, "limiter" => limiter.clone()),
                time_in_queue: metrics::histogram!(TIME_IN_QUEUE, "limiter" => limiter.clone()),
                keys: metrics::gauge!(KEYS, "limiter" => limiter.clone()),
                upstream_refused: metrics::counter!(UPSTREAM_REFUSED, "limiter" => limiter.clone()),
                rate: metrics::gauge!(RATE, "limiter" => limiter),
            };
            Metrics {
                handles: Some(std::sync::Arc::new(handles)),
            }
        }
        #[cfg(not(feature = "metrics"))]
        Metrics {}
    }

    /// A reservation granted, with its wait.
    #[inline(always)]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn granted(&self, wait: Duration) {
        #[cfg(feature = "metrics")]
        if let Some(handles) = &self.handles {
            handles.acquired.increment(1);
            handles.time_in_queue.record(wait.as_secs_f64());
        }
    }

    /// A try refused.
    #[inline(always)]
    pub(crate) fn refused(&self) {
        #[cfg(feature = "metrics")]
        if let Some(handles) = &self.handles {
            handles.refused.increment(1);
        }
    }

    /// A try's outcome: the wait if granted.
    #[inline(always)]
    pub(crate) fn tried(&self, wait: Option<Duration>) {
        match wait {
            Some(wait) => self.granted(wait),
            None => self.refused(),
        }
    }

    /// A reservation given back.
    #[inline(always)]
    pub(crate) fn given_back(&self) {
        #[cfg(feature = "metrics")]
        if let Some(handles) = &self.handles {
            handles.given_back.increment(1);
        }
    }

    /// An upstream's answer fed back: a refusal or not.
    #[inline]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn upstream_answered(&self, refused: bool) {
        #[cfg(feature = "metrics")]
        if let (Some(handles), true) = (&self.handles, refused) {
            handles.upstream_refused.increment(1);
        }
    }

    /// The rate the limiter runs its first limit at, as learned.
    #[inline]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn rate(&self, permits_per_second: f64) {
        #[cfg(feature = "metrics")]
        if let Some(handles) = &self.handles {
            handles.rate.set(permits_per_second);
        }
    }

    /// The keys held changed by `delta`.
    #[inline]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn keys_changed(&self, delta: isize) {
        #[cfg(feature = "metrics")]
        if let Some(handles) = &self.handles {
            if delta > 0 {
                handles.keys.increment(delta as f64);
            } else if delta < 0 {
                handles.keys.decrement(delta.unsigned_abs() as f64);
            }
        }
    }
}

/// A Redis backend's handles.
#[derive(Clone, Default)]
pub(crate) struct BackendMetrics {
    #[cfg(feature = "metrics")]
    handles: Option<std::sync::Arc<BackendHandles>>,
}

#[cfg(feature = "metrics")]
struct BackendHandles {
    ok: metrics::Histogram,
    failed: metrics::Histogram,
    degraded: metrics::Gauge,
    to_local: metrics::Counter,
    to_redis: metrics::Counter,
}

impl std::fmt::Debug for BackendMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BackendMetrics")
    }
}

impl BackendMetrics {
    /// Registers a backend's handles.
    pub(crate) fn new() -> BackendMetrics {
        #[cfg(feature = "metrics")]
        {
            let call = |error: Option<&'static str>| {
                let mut labels = vec![
                    metrics::Label::new("db.system.name", "redis"),
                    metrics::Label::new("db.operation.name", "EVALSHA"),
                ];
                if let Some(error) = error {
                    labels.push(metrics::Label::new("error.type", error));
                }
                metrics::histogram!(REDIS_CALL_DURATION, labels)
            };
            let handles = BackendHandles {
                ok: call(None),
                failed: call(Some("redis")),
                degraded: metrics::gauge!(REDIS_DEGRADED),
                to_local: metrics::counter!(REDIS_FALLBACK_SWITCHES, "to" => "local"),
                to_redis: metrics::counter!(REDIS_FALLBACK_SWITCHES, "to" => "redis"),
            };
            BackendMetrics {
                handles: Some(std::sync::Arc::new(handles)),
            }
        }
        #[cfg(not(feature = "metrics"))]
        BackendMetrics {}
    }

    /// A round trip that took `took`, and whether it succeeded.
    #[inline]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn call(&self, took: Duration, ok: bool) {
        #[cfg(feature = "metrics")]
        if let Some(handles) = &self.handles {
            let histogram = if ok { &handles.ok } else { &handles.failed };
            histogram.record(took.as_secs_f64());
        }
    }

    /// Whether a round trip should be timed at all.
    #[inline]
    pub(crate) fn timing(&self) -> bool {
        #[cfg(feature = "metrics")]
        return self.handles.is_some();
        #[cfg(not(feature = "metrics"))]
        false
    }

    /// `switched` parts went down (`down`) or came back up; `degraded`:
    /// whether any part is down.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn switched(&self, switched: usize, down: bool, degraded: bool) {
        #[cfg(feature = "metrics")]
        if let Some(handles) = &self.handles {
            if switched > 0 {
                let counter = if down {
                    &handles.to_local
                } else {
                    &handles.to_redis
                };
                counter.increment(switched as u64);
            }
            handles.degraded.set(if degraded { 1.0 } else { 0.0 });
        }
    }
}
