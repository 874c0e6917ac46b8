//! The tower layer: clones share one limiter, a permit reserved in
//! `poll_ready` (keyed, in the response future) is given back if the
//! service (the future) is dropped while it waits, the rejecting mode
//! answers at once with the wait, and the keyed mode limits each key alone.
#![cfg(feature = "tower")]

use std::future::poll_fn;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::Context;
use std::time::{Duration, Instant};

use paceline::Local;
use paceline::clock::{Clock, FakeClock};
use paceline::tower::{RateLimitLayer, Throttled};
use paceline::{KeyedRateLimiter, RateLimiter};
use tower_layer::Layer;
use tower_service::Service;

const MS: Duration = Duration::from_millis(1);

use crate::common::{Counter, Room};

fn limiter(clock: &FakeClock) -> Arc<RateLimiter<Local, FakeClock>> {
    Arc::new(
        RateLimiter::builder()
            .permits_per_second(10.0)
            .max_burst(Duration::ZERO)
            .clock(clock.clone())
            .build()
            .unwrap(),
    )
}

/// The same, one rate per key (the HTTP tests' limiter too).
pub(crate) fn keyed_limiter<K: std::hash::Hash + Eq + Clone + Send + Sync + 'static>(
    clock: &FakeClock,
) -> Arc<KeyedRateLimiter<K, Local, FakeClock>> {
    keyed_on(clock.clone())
}

/// The same on a [`Stopped`] clock: a key's request that waits, waits for
/// ever.
pub(crate) fn keyed_stopped<K: std::hash::Hash + Eq + Clone + Send + Sync + 'static>()
-> Arc<KeyedRateLimiter<K, Local, Stopped>> {
    keyed_on(Stopped::default())
}

fn keyed_on<K: std::hash::Hash + Eq + Clone + Send + Sync + 'static, C: Clock>(
    clock: C,
) -> Arc<KeyedRateLimiter<K, Local, C>> {
    Arc::new(
        KeyedRateLimiter::builder()
            .permits_per_second(10.0)
            .max_burst(Duration::ZERO)
            .clock(clock)
            .build()
            .unwrap(),
    )
}

async fn ready<S: Service<u32>>(service: &mut S) -> Result<(), S::Error> {
    poll_fn(|cx| service.poll_ready(cx)).await
}

#[tokio::test(flavor = "current_thread")]
async fn clones_share_one_limiter() {
    let clock = FakeClock::new();
    let counter = Counter::default();
    let service = RateLimitLayer::new(limiter(&clock)).layer(counter.clone());
    let mut clones = [service.clone(), service.clone(), service];
    for i in 0..20u32 {
        let service = &mut clones[i as usize % 3];
        ready(service).await.unwrap();
        assert_eq!(service.call(i).await.unwrap(), i);
    }
    // 20 calls at 10/s with no burst: 19 intervals, on the fake clock.
    assert_eq!(clock.now(), 1900 * MS);
    assert_eq!(counter.0.load(Ordering::Relaxed), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clones_share_one_limiter_on_the_real_clock() {
    let limiter = Arc::new(
        RateLimiter::builder()
            .permits_per_second(10.0)
            .max_burst(Duration::ZERO)
            .build()
            .unwrap(),
    );
    let service = RateLimitLayer::new(limiter).layer(Counter::default());
    let start = Instant::now();
    let tasks: Vec<_> = (0..3u32)
        .map(|t| {
            let mut service = service.clone();
            tokio::spawn(async move {
                for i in 0..(if t == 0 { 8 } else { 6 }) {
                    ready(&mut service).await.unwrap();
                    service.call(i).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let took = start.elapsed();
    // 20 calls: 1.9 s on the schedule, never less (one limiter, not one
    // per clone); late wake-ups only add (the upper bound only says nothing
    // stalls).
    assert!(
        took >= 1900 * MS - 5 * MS && took <= 10 * 1900 * MS,
        "20 calls at 10/s over 3 clones took {took:?}"
    );
}

/// A fake clock on which nothing that sleeps ever wakes: a service's
/// permit, reserved in `poll_ready` (or in a response future), stays ahead
/// of it.
#[derive(Clone, Default)]
pub(crate) struct Stopped(FakeClock);

impl Clock for Stopped {
    fn now(&self) -> Duration {
        self.0.now()
    }

    fn sleep_blocking(&self, _: Duration) {
        unreachable!("the tower layer does not block")
    }

    fn sleep(&self, _: Duration) -> paceline::clock::Sleep {
        Box::pin(std::future::pending())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_service_dropped_between_poll_ready_and_call_gives_its_permit_back() {
    let clock = Stopped::default();
    let limiter = Arc::new(
        RateLimiter::builder()
            .permits_per_second(10.0)
            .max_burst(Duration::ZERO)
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let layer = RateLimitLayer::new(Arc::clone(&limiter));
    let mut first = layer.layer(Counter::default());
    ready(&mut first).await.unwrap();
    first.call(1).await.unwrap();
    // The second reserves its permit in poll_ready and waits for it, then
    // is dropped.
    let mut second = layer.layer(Counter::default());
    let waker = std::task::Waker::noop();
    let pending = second.poll_ready(&mut Context::from_waker(waker));
    assert!(pending.is_pending());
    assert_eq!(limiter.snapshot().unwrap().wait(), 200 * MS);
    drop(second);
    // As if it had never reserved: the next permit is the second's.
    assert_eq!(limiter.snapshot().unwrap().wait(), 100 * MS);
}

/// The keyed layer reserves in the response future: one dropped while it
/// waits gives its key's permit back, and the inner service is not called,
/// with a bound on the wait or without.
#[tokio::test(flavor = "current_thread")]
async fn a_keyed_request_dropped_while_it_waits_gives_its_permit_back() {
    let keyed = keyed_stopped::<u32>();
    for (key, max_wait) in [(1, None), (2, Some(Duration::from_secs(1)))] {
        let counter = Counter::default();
        let layer = RateLimitLayer::keyed(Arc::clone(&keyed), |request: &u32| *request);
        let layer = match max_wait {
            Some(bound) => layer.max_wait(bound),
            None => layer,
        };
        let mut service = layer.layer(counter.clone());
        ready(&mut service).await.unwrap();
        assert_eq!(service.call(key).await.unwrap(), key);
        ready(&mut service).await.unwrap();
        {
            let mut second = std::pin::pin!(service.call(key));
            let waker = std::task::Waker::noop();
            let pending = second.as_mut().poll(&mut Context::from_waker(waker));
            assert!(pending.is_pending(), "key {key}");
            assert_eq!(keyed.snapshot(&key).unwrap().wait(), 200 * MS);
        }
        assert_eq!(keyed.snapshot(&key).unwrap().wait(), 100 * MS, "key {key}");
        assert_eq!(counter.0.load(Ordering::Relaxed), 1);
    }
}

/// Once its permit is due the service holds a permit whose moment has
/// passed, which counts as used, as every reservation's does: dropped
/// before `call`, it gives nothing back.
#[tokio::test(flavor = "current_thread")]
async fn a_service_dropped_once_its_permit_is_due_has_used_it() {
    let clock = FakeClock::new();
    let limiter = limiter(&clock);
    let layer = RateLimitLayer::new(Arc::clone(&limiter));
    let mut first = layer.layer(Counter::default());
    ready(&mut first).await.unwrap();
    first.call(1).await.unwrap();
    // The second waits its interval in poll_ready, then is dropped.
    let mut second = layer.layer(Counter::default());
    ready(&mut second).await.unwrap();
    assert_eq!(clock.now(), 100 * MS);
    drop(second);
    assert_eq!(limiter.snapshot().unwrap().wait(), 100 * MS);
}

#[tokio::test(flavor = "current_thread")]
async fn the_rejecting_mode_answers_at_once_with_the_wait() {
    let clock = FakeClock::new();
    let counter = Counter::default();
    let mut service = RateLimitLayer::new(limiter(&clock))
        .max_wait(Duration::ZERO)
        .layer(counter.clone());
    ready(&mut service).await.unwrap();
    assert_eq!(service.call(1).await.unwrap(), 1);
    ready(&mut service).await.unwrap();
    let error = service.call(2).await.unwrap_err();
    let throttled = error.downcast_ref::<Throttled>().expect("Throttled");
    assert_eq!(throttled.retry_after, 100 * MS);
    assert_eq!(
        counter.0.load(Ordering::Relaxed),
        1,
        "the inner service was called"
    );
    assert_eq!(clock.now(), Duration::ZERO, "the rejecting mode waited");
    clock.advance(100 * MS);
    ready(&mut service).await.unwrap();
    assert_eq!(service.call(3).await.unwrap(), 3);
}

#[tokio::test(flavor = "current_thread")]
async fn the_keyed_mode_limits_each_key_alone() {
    let clock = FakeClock::new();
    let keyed = keyed_limiter::<u32>(&clock);
    // The key is the request's parity.
    let mut service =
        RateLimitLayer::keyed(keyed, |request: &u32| request % 2).layer(Counter::default());
    for request in [0, 1, 2, 3] {
        ready(&mut service).await.unwrap();
        service.call(request).await.unwrap();
    }
    // Each key waited one interval for its second request; the waits of
    // the two keys did not add up.
    assert_eq!(clock.now(), 100 * MS);
}

/// What axum's `Router::layer`, `route_layer` and tonic ask of a layered
/// service: `Clone + Send + Sync + 'static`, with a `Send` response future.
fn fits_a_router<S, R>(service: &S)
where
    S: Service<R> + Clone + Send + Sync + 'static,
    S::Future: Send + 'static,
{
    let _ = service.clone();
}

/// Every service of the crate fits, whatever limiter it holds, and it is
/// used through such a bound: a clone is limited with the others.
#[tokio::test(flavor = "current_thread")]
async fn every_service_fits_a_router() {
    let clock = FakeClock::new();
    let waiting = RateLimitLayer::new(limiter(&clock)).layer(Counter::default());
    fits_a_router::<_, u32>(&waiting);
    fits_a_router::<_, u32>(
        &RateLimitLayer::new(limiter(&clock))
            .max_wait(Duration::ZERO)
            .layer(Counter::default()),
    );
    let keyed = Arc::new(KeyedRateLimiter::<u32>::bursty(10.0).unwrap());
    let by_key = RateLimitLayer::keyed(keyed, |request: &u32| *request % 4);
    fits_a_router::<_, u32>(&by_key.layer(Counter::default()));
    // Shared across tasks as a router shares it: one limiter for all.
    let start = clock.now_micros();
    let calls: Vec<_> = (0..3)
        .map(|i| {
            let mut service = waiting.clone();
            tokio::spawn(async move {
                ready(&mut service).await.unwrap();
                service.call(i).await.unwrap()
            })
        })
        .collect();
    for call in calls {
        call.await.unwrap();
    }
    // 10/s with no burst: the third permit was due 200 ms after the first.
    assert_eq!(clock.now_micros() - start, 200_000);
}

/// The same for the Redis limiters (no server needed: nothing is called).
#[cfg(feature = "redis")]
#[allow(dead_code)]
fn redis_services_fit_a_router(
    shared: Arc<paceline::RateLimiter<paceline::redis::Redis>>,
    keyed: Arc<paceline::KeyedRateLimiter<u32, paceline::redis::Redis>>,
) {
    fits_a_router::<_, u32>(&RateLimitLayer::new(Arc::clone(&shared)).layer(Counter::default()));
    fits_a_router::<_, u32>(
        &RateLimitLayer::new(shared)
            .max_wait(Duration::ZERO)
            .layer(Counter::default()),
    );
    let by_key = RateLimitLayer::keyed(keyed, |request: &u32| *request % 4);
    fits_a_router::<_, u32>(&by_key.layer(Counter::default()));
}

/// A bound on the wait: a request that would wait longer reserves nothing
/// and is refused at once with the wait it needed; within the bound, it
/// waits.
#[tokio::test(flavor = "current_thread")]
async fn a_bounded_wait_refuses_past_the_bound_and_waits_within_it() {
    let clock = FakeClock::new();
    let limiter = limiter(&clock);
    let counter = Counter::default();
    let layer = RateLimitLayer::new(Arc::clone(&limiter)).max_wait(50 * MS);
    let mut first = layer.layer(counter.clone());
    ready(&mut first).await.unwrap();
    first.call(1).await.unwrap();
    // The next permit is 100 ms away: refused, and nothing reserved.
    let mut second = layer.layer(counter.clone());
    ready(&mut second).await.unwrap();
    let error = second.call(2).await.unwrap_err();
    assert_eq!(
        error.downcast_ref::<Throttled>().unwrap().retry_after,
        100 * MS
    );
    assert_eq!(limiter.snapshot().unwrap().wait(), 100 * MS);
    assert_eq!(clock.now(), Duration::ZERO);
    // 40 ms away: within the bound, it waits.
    clock.advance(60 * MS);
    ready(&mut second).await.unwrap();
    assert_eq!(second.call(3).await.unwrap(), 3);
    assert_eq!(clock.now(), 100 * MS);
    assert_eq!(counter.0.load(Ordering::Relaxed), 2);
}

/// The keyed layer refuses per key: at once when rejecting, past the bound
/// with one; other keys are not affected, and a refusal reserves nothing.
#[tokio::test(flavor = "current_thread")]
async fn the_keyed_layer_refuses_per_key() {
    let clock = FakeClock::new();
    let keyed = keyed_limiter::<u32>(&clock);
    let counter = Counter::default();
    let parity = |request: &u32| request % 2;
    let mut rejecting = RateLimitLayer::keyed(Arc::clone(&keyed), parity)
        .max_wait(Duration::ZERO)
        .layer(counter.clone());
    for (request, refused) in [
        (0, None),
        (2, Some(100 * MS)),
        (1, None),
        (3, Some(100 * MS)),
    ] {
        ready(&mut rejecting).await.unwrap();
        let result = rejecting.call(request).await;
        let throttled = result
            .err()
            .map(|e| e.downcast_ref::<Throttled>().unwrap().retry_after);
        assert_eq!(throttled, refused, "request {request}");
    }
    assert_eq!(counter.0.load(Ordering::Relaxed), 2);
    assert_eq!(
        keyed.snapshot(&0).unwrap().wait(),
        100 * MS,
        "nothing reserved"
    );
    assert_eq!(clock.now(), Duration::ZERO);
    // With a bound: past it, refused; within it, waits.
    let mut bounded = RateLimitLayer::keyed(Arc::clone(&keyed), parity)
        .max_wait(50 * MS)
        .layer(counter.clone());
    ready(&mut bounded).await.unwrap();
    assert!(bounded.call(4).await.is_err());
    clock.advance(60 * MS);
    ready(&mut bounded).await.unwrap();
    assert_eq!(bounded.call(6).await.unwrap(), 6);
    assert_eq!(clock.now(), 100 * MS);
}

/// A service with room for one request at a time (see [`Room`]),
/// counting its calls.
#[derive(Clone)]
struct OneAtATime {
    room: Room,
    calls: Counter,
}

impl OneAtATime {
    fn new() -> Self {
        OneAtATime {
            room: Room::new(),
            calls: Counter::default(),
        }
    }
}

impl Service<u32> for OneAtATime {
    type Response = u32;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<u32, std::io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        self.room.poll_take()
    }

    fn call(&mut self, request: u32) -> Self::Future {
        self.room.used();
        self.calls.call(request)
    }
}

/// The keyed layer: a request that waits for its key's permit does not
/// hold the inner service's room meanwhile (it makes the inner service
/// ready once its wait is over), so a request of another key, free now,
/// goes at once. Each request through a fresh clone, as a router sends it.
#[tokio::test(flavor = "current_thread")]
async fn a_keyed_request_waiting_for_its_key_holds_no_room_of_the_inner_service() {
    let keyed = keyed_stopped::<u32>();
    let inner = OneAtATime::new();
    for max_wait in [None, Some(Duration::from_secs(1))] {
        let layer = RateLimitLayer::keyed(Arc::clone(&keyed), |request: &u32| *request);
        let layer = match max_wait {
            Some(bound) => layer.max_wait(bound),
            None => layer,
        };
        let service = layer.layer(inner.clone());
        let key = if max_wait.is_some() { 10 } else { 0 };
        let mut first = service.clone();
        ready(&mut first).await.unwrap();
        assert_eq!(first.call(key).await.unwrap(), key);
        // The key's second request waits (for ever, on this clock).
        let mut second = service.clone();
        ready(&mut second).await.unwrap();
        let mut waiting = std::pin::pin!(second.call(key));
        drop(second);
        let waker = std::task::Waker::noop();
        assert!(
            waiting
                .as_mut()
                .poll(&mut Context::from_waker(waker))
                .is_pending()
        );
        // Another key's request is free now: the inner service has room.
        let mut other = service.clone();
        let polled = other.poll_ready(&mut Context::from_waker(waker));
        assert!(
            matches!(polled, std::task::Poll::Ready(Ok(()))),
            "a request of another key waits for the inner service's room ({max_wait:?})"
        );
        assert_eq!(other.call(key + 1).await.unwrap(), key + 1);
    }
    assert_eq!(inner.calls.0.load(Ordering::Relaxed), 4);
}

/// The same on a clock that passes: once its wait is over, the request
/// makes the inner service ready and calls it.
#[tokio::test(flavor = "current_thread")]
async fn a_keyed_request_that_waited_makes_the_inner_service_ready_then_calls_it() {
    let clock = FakeClock::new();
    let inner = OneAtATime::new();
    let service =
        RateLimitLayer::keyed(keyed_limiter::<u32>(&clock), |_: &u32| 0).layer(inner.clone());
    for request in 0..3 {
        let mut clone = service.clone();
        ready(&mut clone).await.unwrap();
        assert_eq!(clone.call(request).await.unwrap(), request);
    }
    assert_eq!(clock.now(), 200 * MS);
    assert_eq!(inner.calls.0.load(Ordering::Relaxed), 3);
}
