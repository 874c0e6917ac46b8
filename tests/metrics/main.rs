//! Metrics through the `metrics` facade, recorded by its debugging
//! recorder (installed once for this test binary) and checked by value:
//! grants, refusals, give-backs and waits per limiter name, keys held, and
//! a Redis backend's round trips, degraded state and fallback switches
//! around a real outage.
#![cfg(feature = "metrics")]

#[path = "../support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use paceline::clock::{Clock, FakeClock};
use paceline::metrics::{GIVEN_BACK, KEYS, REQUESTS, TIME_IN_QUEUE};
use paceline::{KeyedRateLimiter, RateLimiter};

/// What the recorder has seen, summed over its snapshots (a snapshot of
/// the debugging recorder hands over what was recorded since the last one
/// and resets it: counts and gauge moves add up; a gauge that is set reads
/// as its value in the snapshot after it was set).
#[derive(Default)]
struct Seen {
    snapshotter: Option<Snapshotter>,
    counters: HashMap<Id, u64>,
    gauges: HashMap<Id, f64>,
    last_set: HashMap<Id, f64>,
    histograms: HashMap<Id, Vec<f64>>,
}

/// A metric's name and its labels, sorted.
type Id = (String, Vec<(String, String)>);

fn id(name: &str, labels: &[(&str, &str)]) -> Id {
    let mut labels: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    labels.sort();
    (name.to_owned(), labels)
}

impl Seen {
    /// Takes what was recorded since the last look.
    fn take(&mut self) -> &mut Seen {
        let snapshot = self.snapshotter.as_ref().expect("installed").snapshot();
        for (key, _, _, value) in snapshot.into_vec() {
            let labels: Vec<(&str, &str)> =
                key.key().labels().map(|l| (l.key(), l.value())).collect();
            let id = id(key.key().name(), &labels);
            match value {
                DebugValue::Counter(n) => *self.counters.entry(id).or_default() += n,
                DebugValue::Gauge(x) => {
                    *self.gauges.entry(id.clone()).or_default() += x.into_inner();
                    self.last_set.insert(id, x.into_inner());
                }
                DebugValue::Histogram(xs) => self
                    .histograms
                    .entry(id)
                    .or_default()
                    .extend(xs.into_iter().map(|x| x.into_inner())),
            }
        }
        self
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.counters.get(&id(name, labels)).copied().unwrap_or(0)
    }

    /// A gauge moved by increments and decrements.
    fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.gauges.get(&id(name, labels)).copied().unwrap_or(0.0)
    }

    /// A gauge that is set, as the last look read it.
    fn last_set(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.last_set.get(&id(name, labels)).copied()
    }

    /// A histogram's values, taken out.
    fn histogram(&mut self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        self.histograms
            .remove(&id(name, labels))
            .unwrap_or_default()
    }
}

/// The recorder (installed on first use) and what it has seen, one test at
/// a time.
fn recorder() -> MutexGuard<'static, Seen> {
    static SEEN: OnceLock<Mutex<Seen>> = OnceLock::new();
    let seen = SEEN.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().expect("the only recorder");
        Mutex::new(Seen {
            snapshotter: Some(snapshotter),
            ..Seen::default()
        })
    });
    seen.lock().unwrap_or_else(PoisonError::into_inner)
}

#[test]
fn a_local_limiter_counts_grants_refusals_give_backs_and_waits() {
    let mut seen = recorder();
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .permits_per_second(10.0)
        .max_burst(Duration::ZERO)
        .name("outbound")
        .clock(clock.clone())
        .build()
        .unwrap();
    assert_eq!(limiter.reserve(1).unwrap(), Duration::ZERO);
    assert_eq!(limiter.reserve(1).unwrap(), Duration::from_millis(100));
    assert!(limiter.try_reserve(1, Duration::ZERO).unwrap().is_none());
    // A reservation dropped before its wait is given back.
    drop(limiter.reservation(1).unwrap());
    let seen = seen.take();
    let outbound = [("limiter", "outbound")];
    let acquired = [("limiter", "outbound"), ("result", "acquired")];
    let refused = [("limiter", "outbound"), ("result", "refused")];
    assert_eq!(seen.counter(REQUESTS, &acquired), 3);
    assert_eq!(seen.counter(REQUESTS, &refused), 1);
    assert_eq!(seen.counter(GIVEN_BACK, &outbound), 1);
    assert_eq!(seen.histogram(TIME_IN_QUEUE, &outbound), [0.0, 0.1, 0.2]);
    // The blocking and async paths count as well.
    clock.advance(Duration::from_secs(1));
    assert!(limiter.try_acquire_blocking(1, Duration::ZERO).unwrap());
    assert_eq!(seen.take().counter(REQUESTS, &acquired), 4);
}

#[test]
fn a_keyed_limiter_counts_its_keys_never_by_key() {
    let mut seen = recorder();
    let clock = FakeClock::new();
    let limiter = KeyedRateLimiter::<String>::builder()
        .permits_per_second(10.0)
        .max_keys(64)
        .name("per-user")
        .clock(clock.clone())
        .build()
        .unwrap();
    let per_user = [("limiter", "per-user")];
    for user in 0..10 {
        limiter.reserve(&format!("user-{user}"), 1).unwrap();
    }
    assert_eq!(limiter.len(), 10);
    assert_eq!(seen.take().gauge(KEYS, &per_user), 10.0);
    // Many more keys than the cap: the gauge follows what is held.
    for user in 0..1_000 {
        limiter.reserve(&format!("flood-{user}"), 1).unwrap();
        clock.advance(Duration::from_micros(10));
    }
    assert_eq!(seen.take().gauge(KEYS, &per_user), limiter.len() as f64);
    assert!(limiter.len() <= 64);
    assert_eq!(
        seen.counter(REQUESTS, &[("limiter", "per-user"), ("result", "acquired")]),
        1_010
    );
    // No metric carries a user's key.
    let labelled_by_key = seen
        .counters
        .keys()
        .chain(seen.gauges.keys())
        .flat_map(|(_, labels)| labels)
        .any(|(_, value)| value.starts_with("user-") || value.starts_with("flood-"));
    assert!(!labelled_by_key);
    let _ = clock.now();
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The lock keeps the other tests (on other threads) from draining the
// recorder meanwhile; nothing on this test's runtime takes it.
#[allow(clippy::await_holding_lock)]
async fn redis_round_trips_outages_and_switches() {
    use paceline::metrics::{REDIS_CALL_DURATION, REDIS_DEGRADED, REDIS_FALLBACK_SWITCHES};
    use support::poll::{PROBE_INTERVAL, RESPONSE_TIMEOUT, backend};
    use support::redis_server::RedisServer;

    let mut seen = recorder();
    let mut server = RedisServer::start();
    let backend = backend(server.client()).await;
    let limiter = backend
        .keyed_limiter::<String>("api")
        .permits_per_second(1000.0)
        .build()
        .unwrap();
    let ok = [
        ("db.system.name", "redis"),
        ("db.operation.name", "EVALSHA"),
    ];
    let _ = seen.take().histogram(REDIS_CALL_DURATION, &ok);
    for user in ["a", "b", "c"] {
        limiter.reserve(&user.to_owned(), 1).await.unwrap();
    }
    let calls = seen.take().histogram(REDIS_CALL_DURATION, &ok);
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert!(calls.iter().all(|s| *s > 0.0 && *s < 1.0), "{calls:?}");
    let acquired = [("limiter", "paceline:api"), ("result", "acquired")];
    assert_eq!(seen.counter(REQUESTS, &acquired), 3);

    // Down: one switch to the fallbacks, degraded; back: one switch back.
    server.kill();
    limiter.reserve(&"a".to_owned(), 1).await.unwrap();
    seen.take();
    assert_eq!(seen.last_set(REDIS_DEGRADED, &[]), Some(1.0));
    assert_eq!(seen.counter(REDIS_FALLBACK_SWITCHES, &[("to", "local")]), 1);
    server.restart();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while backend.is_degraded() && std::time::Instant::now() < deadline {
        tokio::time::sleep(PROBE_INTERVAL).await;
    }
    assert!(!backend.is_degraded());
    seen.take();
    assert_eq!(seen.last_set(REDIS_DEGRADED, &[]), Some(0.0));
    assert_eq!(seen.counter(REDIS_FALLBACK_SWITCHES, &[("to", "redis")]), 1);
    let _ = RESPONSE_TIMEOUT;
}
