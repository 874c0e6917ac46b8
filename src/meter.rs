//! What a limiter records its grants, refusals and give-backs in, and a
//! Redis backend its round trips: the handles registered under the names
//! [`metrics`](crate::metrics) lists, or nothing when the feature is off
//! (every method is then empty).

// Without Redis the backend's handles are unused.
#![cfg_attr(not(all(feature = "metrics", feature = "redis")), allow(dead_code))]

use std::time::Duration;

#[cfg(feature = "metrics")]
use crate::metrics::*;

/// What an engine records its grants, refusals and give-backs in, said
/// once for both of its sides: the [`Rate`](crate::store::Rate) its limiter
/// calls and the [`GivesBack`](crate::reservation::GivesBack) its
/// reservations call.
pub trait Metered {
    /// Its metrics.
    fn metrics(&self) -> &Metrics;
}

/// An engine shared behind an `Arc` records in the engine's metrics.
impl<T: Metered + ?Sized> Metered for std::sync::Arc<T> {
    fn metrics(&self) -> &Metrics {
        (**self).metrics()
    }
}

/// A limiter's handles (registered when it is built), or nothing: the feature
/// is off, and every method is empty.
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
    timed_out: metrics::Histogram,
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
                timed_out: call(Some("timeout")),
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

    /// A round trip that took `took`, and whether it succeeded; `None`:
    /// its caller's time ran out `took` after it was sent.
    #[inline]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn call(&self, took: Duration, ok: Option<bool>) {
        #[cfg(feature = "metrics")]
        if let Some(handles) = &self.handles {
            let histogram = match ok {
                Some(true) => &handles.ok,
                Some(false) => &handles.failed,
                None => &handles.timed_out,
            };
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
