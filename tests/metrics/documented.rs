//! Probes of the metrics' promises: each counter, gauge and histogram by
//! value, on the paths the main tests leave out.

use std::time::Duration;

use paceline::clock::FakeClock;
use paceline::metrics::{GIVEN_BACK, KEYS, RATE, REQUESTS, TIME_IN_QUEUE, UPSTREAM_REFUSED};
use paceline::outbound::Feedback;
use paceline::{KeyedRateLimiter, Limit, RateLimiter};

use super::recorder;

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// `given_back` counts reservations given back *before their wait ended*;
/// one dropped after its moment gives nothing back (it keeps its permits)
/// and is no give-back.
#[test]
fn a_reservation_dropped_after_its_moment_is_not_given_back() {
    let seen = recorder();
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .permits_per_second(10.0)
        .max_burst(Duration::ZERO)
        .name("probe-late-drop")
        .clock(clock.clone())
        .build()
        .unwrap();
    let label = [("limiter", "probe-late-drop")];
    limiter.reserve(1).unwrap();
    let late = limiter.reservation(1).unwrap();
    assert_eq!(late.delay(), ms(100));
    clock.advance(ms(500));
    drop(late);
    // It kept its permits: the next waits for nothing (its moment passed),
    // and the one after for one interval.
    assert_eq!(limiter.reserve(1).unwrap(), Duration::ZERO);
    assert_eq!(limiter.reserve(1).unwrap(), ms(100));
    assert_eq!(seen.counter(GIVEN_BACK, &label), 0);
}

/// A call ended (dropped or settled) is no give-back; a call future
/// dropped while it waits is one.
#[test]
fn calls_given_back_only_while_they_wait() {
    use crate::support::manual::ManualClock;
    use std::future::Future;
    use std::task::{Context, Waker};
    let seen = recorder();
    let clock = ManualClock::default();
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(10.0).burst(1))
        .name("probe-calls")
        .clock(clock.clone())
        .build()
        .unwrap();
    let label = [("limiter", "probe-calls")];
    let acquired = [("limiter", "probe-calls"), ("result", "acquired")];
    let first = futures::executor::block_on(limiter.call(1)).unwrap();
    drop(first);
    let mut waiting = Box::pin(limiter.call(1));
    let mut cx = Context::from_waker(Waker::noop());
    assert!(waiting.as_mut().poll(&mut cx).is_pending());
    drop(waiting);
    assert_eq!(seen.counter(GIVEN_BACK, &label), 1);
    assert_eq!(seen.counter(REQUESTS, &acquired), 2);
    assert_eq!(seen.histogram(TIME_IN_QUEUE, &label), [0.0, 0.1]);
    // Given back: the next goes at 100 ms, not 200.
    assert_eq!(limiter.snapshot().unwrap().wait(), ms(100));
}

/// A keyed limiter's keys gauge follows what it holds through rate changes
/// (which may change how keys are held), sweeps and the cap, and comes back
/// to 0 once every key is forgotten.
#[test]
fn the_keys_gauge_follows_rate_changes_and_sweeps() {
    let seen = recorder();
    let clock = FakeClock::new();
    let limiter = KeyedRateLimiter::<String>::builder()
        .permits_per_second(10.0)
        .name("probe-keys")
        .clock(clock.clone())
        .build()
        .unwrap();
    let label = [("limiter", "probe-keys")];
    let check = |step: &str| {
        let held = limiter.stats().keys as f64;
        assert_eq!(seen.gauge(KEYS, &label).unwrap_or(0.0), held, "{step}");
    };
    for user in 0..50 {
        limiter.reserve(&format!("u{user}"), 3).unwrap();
    }
    check("50 keys");
    limiter.set_rate(f64::INFINITY).unwrap();
    check("infinite");
    for user in 50..60 {
        limiter.reserve(&format!("u{user}"), 3).unwrap();
    }
    check("infinite, more keys");
    limiter.set_rate(5.0).unwrap();
    check("back to 5/s");
    for user in 0..60 {
        limiter.reserve(&format!("u{user}"), 1).unwrap();
    }
    check("reused");
    // Idle long enough for every key to read as full: swept.
    clock.advance(Duration::from_secs(120));
    for round in 0..3 {
        limiter.reserve(&format!("fresh{round}"), 1).unwrap();
        clock.advance(Duration::from_secs(60));
    }
    check("after sweeps");
    assert!(limiter.stats().keys < 60, "{}", limiter.stats().keys);
    let gauge = seen.gauge(KEYS, &label).unwrap();
    assert!(gauge >= 0.0, "{gauge}");
}

/// The keys gauge never goes negative nor drifts with a warming-up policy,
/// several limits, and keys forgotten by the cap.
#[test]
fn the_keys_gauge_with_several_limits_and_a_cap() {
    let seen = recorder();
    let clock = FakeClock::new();
    let limiter = KeyedRateLimiter::<u64>::builder()
        .limit(Limit::per_second(10.0))
        .limit(Limit::per(100.0, Duration::from_secs(60)))
        .max_keys(8)
        .name("probe-keys-2")
        .clock(clock.clone())
        .build()
        .unwrap();
    let label = [("limiter", "probe-keys-2")];
    for key in 0..100u64 {
        limiter.reserve(&key, 1).unwrap();
        clock.advance(ms(1));
        assert_eq!(
            seen.gauge(KEYS, &label).unwrap_or(0.0),
            limiter.stats().keys as f64,
            "after {key}"
        );
    }
    limiter.set_limit_rate(1, 1000.0).unwrap();
    clock.advance(Duration::from_secs(600));
    limiter.reserve(&1000, 1).unwrap();
    assert_eq!(
        seen.gauge(KEYS, &label).unwrap_or(0.0),
        limiter.stats().keys as f64
    );
}

/// A keyed limiter dropped holds no key: the gauge of its name should not
/// keep its keys (a limiter rebuilt under the same name, on a config
/// reload, would otherwise add its keys on top, forever).
#[test]
fn a_dropped_keyed_limiter_takes_its_keys_off_the_gauge() {
    let seen = recorder();
    let label = [("limiter", "probe-reloaded")];
    for _reload in 0..3 {
        let limiter = KeyedRateLimiter::<String>::builder()
            .permits_per_second(10.0)
            .name("probe-reloaded")
            .clock(FakeClock::new())
            .build()
            .unwrap();
        for user in 0..10 {
            limiter.reserve(&format!("user-{user}"), 1).unwrap();
        }
        assert_eq!(limiter.stats().keys, 10);
    }
    assert_eq!(seen.gauge(KEYS, &label), Some(0.0));
}

/// A 503 with `Retry-After` is a refusal (counted); one without, and a 200,
/// are not. A keyed limiter counts its upstream's refusals too, and its
/// learning sets no rate gauge (the gauge is for a limiter without keys).
#[test]
fn upstream_refusals_counted_as_the_docs_define_them() {
    let seen = recorder();
    let limiter = RateLimiter::builder()
        .permits_per_second(100.0)
        .name("probe-upstream")
        .clock(FakeClock::new())
        .build()
        .unwrap();
    let label = [("limiter", "probe-upstream")];
    let feed = |feedback: Feedback| {
        futures::executor::block_on(async {
            limiter.call(1).await.unwrap().learn(&feedback);
        })
    };
    feed(Feedback::new(503));
    feed(Feedback::new(200));
    assert_eq!(seen.counter(UPSTREAM_REFUSED, &label), 0);
    feed(Feedback::new(503).with_retry_after(ms(10)));
    assert_eq!(seen.counter(UPSTREAM_REFUSED, &label), 1);
    assert_eq!(seen.gauge(RATE, &label), Some(70.0));

    let keyed = KeyedRateLimiter::<String>::builder()
        .permits_per_second(100.0)
        .name("probe-upstream-keyed")
        .clock(FakeClock::new())
        .build()
        .unwrap();
    let label = [("limiter", "probe-upstream-keyed")];
    futures::executor::block_on(async {
        let call = keyed.call(&"secret-key".to_owned(), 1).await.unwrap();
        call.learn(&Feedback::new(429));
    });
    assert_eq!(seen.counter(UPSTREAM_REFUSED, &label), 1);
    assert_eq!(seen.gauge(RATE, &label), None);
    let by_key = seen
        .labels()
        .into_iter()
        .any(|(_, value)| value.contains("secret-key"));
    assert!(!by_key);
}

/// The rate gauge is the first *rate* limit's, with a concurrent limit
/// given first; and it follows a learned cap.
#[test]
fn the_rate_gauge_with_a_concurrent_limit_first() {
    let seen = recorder();
    let limiter = RateLimiter::builder()
        .limit(Limit::concurrent(2))
        .limit(Limit::per_second(40.0))
        .limit(Limit::per_second(1000.0))
        .name("probe-rate")
        .clock(FakeClock::new())
        .build()
        .unwrap();
    let label = [("limiter", "probe-rate")];
    futures::executor::block_on(async {
        limiter.call(1).await.unwrap().learn(&Feedback::new(429));
    });
    assert_eq!(seen.gauge(RATE, &label), Some(28.0));
    assert_eq!(limiter.rate(), 28.0);
}

/// A try_call refused for want of a slot counts one refusal and nothing
/// acquired.
#[test]
fn a_try_call_refused_for_a_slot_counts_one_refusal() {
    let seen = recorder();
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(100.0))
        .limit(Limit::concurrent(1))
        .name("probe-slot")
        .clock(FakeClock::new())
        .build()
        .unwrap();
    let acquired = [("limiter", "probe-slot"), ("result", "acquired")];
    let refused = [("limiter", "probe-slot"), ("result", "refused")];
    futures::executor::block_on(async {
        let held = limiter.call(1).await.unwrap();
        assert!(limiter.try_call(1, Duration::ZERO).await.unwrap().is_none());
        drop(held);
    });
    assert_eq!(seen.counter(REQUESTS, &acquired), 1);
    assert_eq!(seen.counter(REQUESTS, &refused), 1);
}

/// A Redis keyed limiter whose Redis is down holds its keys in its fallback,
/// in this process: the keys gauge (keys a keyed limiter holds in this
/// process) should count them.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::await_holding_lock)]
async fn a_redis_keyed_limiters_fallback_keys_on_the_gauge() {
    use crate::support::poll::backend;
    use crate::support::redis_server::RedisServer;
    let seen = recorder();
    let mut server = RedisServer::start();
    let backend = backend(server.client()).await;
    let limiter = KeyedRateLimiter::<String>::builder()
        .permits_per_second(1000.0)
        .redis(&backend, "probe-fallback")
        .build()
        .unwrap();
    limiter.reserve(&"a".to_owned(), 1).await.unwrap();
    server.kill();
    for user in ["a", "b", "c"] {
        limiter.reserve(&user.to_owned(), 1).await.unwrap();
    }
    let held = limiter.stats().keys;
    eprintln!(
        "held {held}, gauge {:?}",
        seen.gauge(KEYS, &[("limiter", "paceline:v1:probe-fallback")])
    );
    assert!(held > 0);
    assert_eq!(
        seen.gauge(KEYS, &[("limiter", "paceline:v1:probe-fallback")]),
        Some(held as f64)
    );
}

/// The HTTP layer's refusals are tries refused: a request refused at once
/// (the default, no wait) counts one, as one refused past its `max_wait`
/// does; a request let through counts one acquired.
#[cfg(feature = "http")]
#[tokio::test(flavor = "current_thread")]
async fn the_http_layers_refusals_are_counted() {
    use std::convert::Infallible;
    use std::future::{Ready, poll_fn, ready};
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use ::http::{Request, Response, StatusCode};
    use paceline::http::{Global, RateLimitLayer};
    use tower_layer::Layer;
    use tower_service::Service;

    #[derive(Clone)]
    struct Ok200;

    impl Service<Request<()>> for Ok200 {
        type Response = Response<String>;
        type Error = Infallible;
        type Future = Ready<Result<Response<String>, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<()>) -> Self::Future {
            ready(Ok(Response::new(String::new())))
        }
    }

    let seen = recorder();
    let limiter = Arc::new(
        KeyedRateLimiter::<()>::builder()
            .permits_per_second(10.0)
            .max_burst(Duration::ZERO)
            .name("http-layer")
            .clock(FakeClock::new())
            .build()
            .unwrap(),
    );
    let acquired = [("limiter", "http-layer"), ("result", "acquired")];
    let refused = [("limiter", "http-layer"), ("result", "refused")];
    let send = |max_wait| {
        let mut service = RateLimitLayer::new(Arc::clone(&limiter), Global)
            .max_wait(max_wait)
            .layer(Ok200);
        async move {
            poll_fn(|cx| service.poll_ready(cx)).await.unwrap();
            service.call(Request::new(())).await.unwrap().status()
        }
    };
    assert_eq!(send(Duration::ZERO).await, StatusCode::OK);
    // The next permit is 100 ms away: refused at once, then past a bound.
    assert_eq!(send(Duration::ZERO).await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(seen.counter(REQUESTS, &refused), 1);
    assert_eq!(send(ms(50)).await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(seen.counter(REQUESTS, &refused), 2);
    assert_eq!(seen.counter(REQUESTS, &acquired), 1);
}

/// The rate gauge is the rate the limiter runs its first limit at: once
/// learned, a `set_rate` or a `set_limit_rate` of the first limit moves it
/// too. (It kept the learned rate: 70 while the limiter ran at 7.)
#[test]
fn the_rate_gauge_follows_set_rate_after_learning() {
    let seen = recorder();
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(100.0))
        .limit(Limit::per_second(1000.0))
        .name("probe-rate-set")
        .clock(FakeClock::new())
        .build()
        .unwrap();
    let label = [("limiter", "probe-rate-set")];
    futures::executor::block_on(async {
        limiter.call(1).await.unwrap().learn(&Feedback::new(429));
    });
    assert_eq!(seen.gauge(RATE, &label), Some(70.0));
    limiter.set_rate(10.0).unwrap();
    assert_eq!(limiter.rate(), 7.0);
    assert_eq!(seen.gauge(RATE, &label), Some(limiter.rate()));
    limiter.set_limit_rate(0, 20.0).unwrap();
    assert_eq!(seen.gauge(RATE, &label), Some(limiter.rate()));
    limiter.set_limit_rate(1, 5.0).unwrap();
    assert_eq!(seen.gauge(RATE, &label), Some(limiter.rate()));
}
