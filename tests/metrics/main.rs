//! Metrics through the `metrics` facade, recorded by a small recorder of
//! this test's own (installed once for this test binary) and checked by
//! value: grants, refusals, give-backs and waits per limiter name, keys
//! held, and a Redis backend's round trips, degraded state and fallback
//! switches around a real outage.
#![cfg(feature = "metrics")]

#[path = "../support/mod.rs"]
mod support;

mod documented;
mod pauses;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata,
    SharedString, Unit,
};
use paceline::clock::{Clock, FakeClock};
use paceline::metrics::{GIVEN_BACK, KEYS, RATE, REQUESTS, TIME_IN_QUEUE, UPSTREAM_REFUSED};
use paceline::{KeyedRateLimiter, RateLimiter};

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

/// Every value recorded so far: a counter's total, a gauge's value, a
/// histogram's samples not yet looked at.
#[derive(Default)]
struct Values {
    counters: HashMap<Id, u64>,
    gauges: HashMap<Id, f64>,
    histograms: HashMap<Id, Vec<f64>>,
}

fn values() -> MutexGuard<'static, Values> {
    static VALUES: OnceLock<Mutex<Values>> = OnceLock::new();
    VALUES
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// One metric, as the recorder hands it to the crate: each update goes
/// straight into `values()`.
struct Handle(Id);

impl CounterFn for Handle {
    fn increment(&self, n: u64) {
        *values().counters.entry(self.0.clone()).or_default() += n;
    }
    fn absolute(&self, n: u64) {
        values().counters.insert(self.0.clone(), n);
    }
}

impl GaugeFn for Handle {
    fn increment(&self, x: f64) {
        *values().gauges.entry(self.0.clone()).or_default() += x;
    }
    fn decrement(&self, x: f64) {
        *values().gauges.entry(self.0.clone()).or_default() -= x;
    }
    fn set(&self, x: f64) {
        values().gauges.insert(self.0.clone(), x);
    }
}

impl HistogramFn for Handle {
    fn record(&self, x: f64) {
        values()
            .histograms
            .entry(self.0.clone())
            .or_default()
            .push(x);
    }
}

struct Recorder;

impl Recorder {
    fn handle(key: &Key) -> Arc<Handle> {
        let labels: Vec<(&str, &str)> = key.labels().map(|l| (l.key(), l.value())).collect();
        Arc::new(Handle(id(key.name(), &labels)))
    }
}

impl metrics::Recorder for Recorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(Recorder::handle(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(Recorder::handle(key))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(Recorder::handle(key))
    }
}

/// What a test reads. Holding it is the test's turn: one test at a time
/// reads and drains the values.
struct Seen {
    _turn: MutexGuard<'static, ()>,
}

impl Seen {
    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        values()
            .counters
            .get(&id(name, labels))
            .copied()
            .unwrap_or(0)
    }

    /// A gauge's value, if it was ever moved or set.
    fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        values().gauges.get(&id(name, labels)).copied()
    }

    /// A histogram's samples since the last look, taken out.
    fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        values()
            .histograms
            .remove(&id(name, labels))
            .unwrap_or_default()
    }

    /// Every metric's labels that were recorded so far.
    fn labels(&self) -> Vec<(String, String)> {
        let values = values();
        let ids = values.counters.keys().chain(values.gauges.keys());
        ids.flat_map(|(_, labels)| labels.iter().cloned()).collect()
    }
}

/// The recorder (installed on first use), and this test's turn.
fn recorder() -> Seen {
    static TURN: Mutex<()> = Mutex::new(());
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| metrics::set_global_recorder(Recorder).expect("the only recorder"));
    Seen {
        _turn: TURN.lock().unwrap_or_else(PoisonError::into_inner),
    }
}

#[test]
fn a_local_limiter_counts_grants_refusals_give_backs_and_waits() {
    let seen = recorder();
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
    assert_eq!(seen.counter(REQUESTS, &acquired), 4);
}

#[test]
fn a_limiter_fed_an_upstreams_answers_counts_its_refusals_and_its_rate() {
    let seen = recorder();
    let limiter = RateLimiter::builder()
        .permits_per_second(100.0)
        .name("upstream")
        .clock(FakeClock::new())
        .build()
        .unwrap();
    let refused = paceline::outbound::Feedback::new(429);
    futures::executor::block_on(async {
        let call = limiter.call(1).await.unwrap();
        call.learn(&refused);
        drop(call);
        let call = limiter.call(1).await.unwrap();
        call.learn(&paceline::outbound::Feedback::new(200));
        drop(call);
    });
    let upstream = [("limiter", "upstream")];
    assert_eq!(seen.counter(UPSTREAM_REFUSED, &upstream), 1);
    assert_eq!(seen.gauge(RATE, &upstream), Some(70.0));
}

#[test]
fn a_keyed_limiter_counts_its_keys_never_by_key() {
    let seen = recorder();
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
    assert_eq!(limiter.stats().keys, 10);
    assert_eq!(seen.gauge(KEYS, &per_user), Some(10.0));
    // Many more keys than the cap: the gauge follows what is held.
    for user in 0..1_000 {
        limiter.reserve(&format!("flood-{user}"), 1).unwrap();
        clock.advance(Duration::from_micros(10));
    }
    assert_eq!(
        seen.gauge(KEYS, &per_user),
        Some(limiter.stats().keys as f64)
    );
    assert!(limiter.stats().keys <= 64);
    assert_eq!(
        seen.counter(REQUESTS, &[("limiter", "per-user"), ("result", "acquired")]),
        1_010
    );
    // No metric carries a user's key.
    let labelled_by_key = seen
        .labels()
        .into_iter()
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

    let seen = recorder();
    let mut server = RedisServer::start();
    let backend = backend(server.client()).await;
    let limiter = KeyedRateLimiter::<String>::builder()
        .permits_per_second(1000.0)
        .redis(&backend, "api")
        .build()
        .unwrap();
    let ok = [
        ("db.system.name", "redis"),
        ("db.operation.name", "EVALSHA"),
    ];
    let _ = seen.histogram(REDIS_CALL_DURATION, &ok);
    for user in ["a", "b", "c"] {
        limiter.reserve(&user.to_owned(), 1).await.unwrap();
    }
    let calls = seen.histogram(REDIS_CALL_DURATION, &ok);
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert!(calls.iter().all(|s| *s > 0.0 && *s < 1.0), "{calls:?}");
    let acquired = [("limiter", "paceline:v1:api"), ("result", "acquired")];
    assert_eq!(seen.counter(REQUESTS, &acquired), 3);

    // Down: one switch to the fallbacks, degraded; back: one switch back
    // (counted from here: another test's outage counts in the same names).
    let to_local = seen.counter(REDIS_FALLBACK_SWITCHES, &[("to", "local")]);
    let to_redis = seen.counter(REDIS_FALLBACK_SWITCHES, &[("to", "redis")]);
    server.kill();
    limiter.reserve(&"a".to_owned(), 1).await.unwrap();
    assert_eq!(seen.gauge(REDIS_DEGRADED, &[]), Some(1.0));
    assert_eq!(
        seen.counter(REDIS_FALLBACK_SWITCHES, &[("to", "local")]),
        to_local + 1
    );
    server.restart();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while backend.stats().degraded && std::time::Instant::now() < deadline {
        tokio::time::sleep(PROBE_INTERVAL).await;
    }
    assert!(!backend.stats().degraded);
    assert_eq!(seen.gauge(REDIS_DEGRADED, &[]), Some(0.0));
    assert_eq!(
        seen.counter(REDIS_FALLBACK_SWITCHES, &[("to", "redis")]),
        to_redis + 1
    );
    let _ = RESPONSE_TIMEOUT;
}

/// A round trip that outlives the response timeout is a failed one, timed
/// out, recorded once at its deadline: its caller was served by the
/// fallback. (Its reply, come late, is no success to record.)
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::await_holding_lock)]
async fn a_redis_round_trip_past_its_deadline_is_one_failure() {
    use paceline::metrics::REDIS_CALL_DURATION;
    use paceline::redis::Fallback;
    use support::poll::{RESPONSE_TIMEOUT, backend};
    use support::proxy::Proxy;
    use support::redis_server::RedisServer;

    let seen = recorder();
    let server = RedisServer::start();
    let proxy = Proxy::in_front_of(&server);
    let backend = backend(proxy.client()).await;
    let limiter = KeyedRateLimiter::<String>::builder()
        .permits_per_second(1000.0)
        .redis(&backend, "late-replies")
        .fallback(Fallback::FailOpen)
        .build()
        .unwrap();
    let ok = [
        ("db.system.name", "redis"),
        ("db.operation.name", "EVALSHA"),
    ];
    let timed_out = [
        ("db.system.name", "redis"),
        ("db.operation.name", "EVALSHA"),
        ("error.type", "timeout"),
    ];
    limiter.reserve(&"a".to_owned(), 1).await.unwrap();
    let _ = (
        seen.histogram(REDIS_CALL_DURATION, &ok),
        seen.histogram(REDIS_CALL_DURATION, &timed_out),
    );
    // 400 ms each way: the reply comes 800 ms after the call, long after
    // its 100 ms.
    proxy.set_latency(Duration::from_millis(400));
    limiter.reserve(&"b".to_owned(), 1).await.unwrap();
    assert!(limiter.stats().degraded);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let late = seen.histogram(REDIS_CALL_DURATION, &timed_out);
    assert_eq!(late.len(), 1, "{late:?}");
    assert!(
        late[0] >= RESPONSE_TIMEOUT.as_secs_f64() && late[0] < 0.5,
        "{late:?}"
    );
    let ok = seen.histogram(REDIS_CALL_DURATION, &ok);
    assert!(ok.is_empty(), "{ok:?}");
}
