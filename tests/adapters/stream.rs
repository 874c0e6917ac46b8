//! `paceline::stream::ThrottleExt`: items released at their turn, in order,
//! the right permits charged, nothing owed after a dropped stream, errors
//! yielded with their item.

use crate::support::fake;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::stream::{self, FusedStream};
use futures::{Stream, StreamExt, TryStreamExt};
use paceline::clock::{Clock, FakeClock, Sleep};
use paceline::stream::ThrottleExt;
use paceline::{Error, KeyedRateLimiter, Limiter, RateLimiter};

/// Drains `throttled`, returning each item with the fake clock's time at its
/// release.
async fn release_times<T>(
    throttled: impl Stream<Item = Result<T, paceline::stream::ThrottleError<T>>>,
    clock: &FakeClock,
) -> Vec<(T, Duration)> {
    throttled
        .map(|item| (item.expect("a local limiter does not fail"), clock.now()))
        .collect()
        .await
}

#[tokio::test]
async fn twenty_items_at_50_per_second_are_20_ms_apart_on_a_fake_clock() {
    let (limiter, clock) = fake::bursty(50.0);
    let released = release_times(stream::iter(0..20).throttle(&limiter), &clock).await;

    let items: Vec<i32> = released.iter().map(|&(item, _)| item).collect();
    assert_eq!(items, (0..20).collect::<Vec<_>>());
    let times: Vec<Duration> = released.iter().map(|&(_, at)| at).collect();
    assert_eq!(times[0], Duration::ZERO);
    for pair in times.windows(2) {
        assert_eq!(pair[1] - pair[0], Duration::from_millis(20));
    }
    assert_eq!(clock.now(), Duration::from_millis(380));
}

#[tokio::test]
async fn throttle_by_charges_each_item_its_permits() {
    let (limiter, clock) = fake::bursty(10.0);
    let permits = [1u32, 3, 2, 0, 5];
    let released = release_times(
        stream::iter(permits).throttle_by(&limiter, |&p: &u32| p),
        &clock,
    )
    .await;

    let ms = |ms| Duration::from_millis(ms);
    // Each item waits for what the one before it charged; 0 is free.
    assert_eq!(
        released,
        [
            (1, ms(0)),
            (3, ms(100)),
            (2, ms(400)),
            (0, ms(400)),
            (5, ms(600)),
        ]
    );
    // The last item's 5 permits are owed to the next caller.
    assert_eq!(limiter.snapshot().unwrap().wait(), ms(500));
}

#[tokio::test]
async fn items_keep_their_order() {
    let (limiter, clock) = fake::bursty(1000.0);
    let items: Vec<u32> = (0..200).map(|i| (i * 7919) % 13).collect();
    let released = release_times(
        stream::iter(items.clone()).throttle_by(Arc::new(limiter), |&p: &u32| p),
        &clock,
    )
    .await;
    let got: Vec<u32> = released.iter().map(|&(item, _)| item).collect();
    assert_eq!(got, items);
    // Times never go backwards, and the total is what was charged before the
    // last item (at 1 ms per permit).
    assert!(released.windows(2).all(|w| w[0].1 <= w[1].1));
    let charged: u32 = items[..items.len() - 1].iter().sum();
    assert_eq!(clock.now(), Duration::from_millis(u64::from(charged)));
}

/// A fake clock whose sleeps never end: a wait on it stays pending, so a
/// test can drop a stream mid-wait.
#[derive(Clone)]
struct StuckClock(FakeClock);

impl Clock for StuckClock {
    fn now(&self) -> Duration {
        self.0.now()
    }

    fn sleep_blocking(&self, _: Duration) {
        unreachable!("the stream sleeps asynchronously")
    }

    fn sleep(&self, _: Duration) -> Sleep {
        Box::pin(std::future::pending())
    }
}

#[test]
fn a_stream_dropped_mid_wait_leaves_no_debt() {
    let limiter: Arc<dyn Limiter> = Arc::new(
        RateLimiter::builder()
            .permits_per_second(10.0)
            .clock(StuckClock(FakeClock::new()))
            .build()
            .unwrap(),
    );
    let mut throttled = stream::iter(0..10).throttle_by(limiter.clone(), |_: &i32| 3);
    let waker = futures::task::noop_waker();
    let mut cx = Context::from_waker(&waker);

    // The first item goes at once and owes 300 ms.
    assert!(matches!(
        throttled.poll_next_unpin(&mut cx),
        Poll::Ready(Some(Ok(0)))
    ));
    let owed = futures::executor::block_on(limiter.snapshot())
        .unwrap()
        .wait();
    assert_eq!(owed, Duration::from_millis(300));

    // The second reserves its 3 permits and waits for ever.
    assert!(throttled.poll_next_unpin(&mut cx).is_pending());
    let with_pending = futures::executor::block_on(limiter.snapshot())
        .unwrap()
        .wait();
    assert_eq!(with_pending, Duration::from_millis(600));

    // Dropping the stream gives them back: only the first item's debt is left.
    drop(throttled);
    let after = futures::executor::block_on(limiter.snapshot())
        .unwrap()
        .wait();
    assert_eq!(after, owed);
}

/// A stream dropped while an item of `u32::MAX` permits waits (13 years'
/// worth at 10 a second) gives every one of them back.
#[test]
fn a_stream_dropped_while_a_huge_item_waits_gives_it_back() {
    let limiter = Arc::new(
        RateLimiter::builder()
            .permits_per_second(10.0)
            .max_burst(Duration::ZERO)
            .clock(StuckClock(FakeClock::new()))
            .build()
            .unwrap(),
    );
    // The next item waits 100 ms.
    limiter.reserve(1).unwrap();
    let owed = limiter.snapshot().unwrap().wait();
    let mut throttled = stream::iter([u32::MAX]).throttle_by(limiter.clone(), |n: &u32| *n);
    let waker = futures::task::noop_waker();
    assert!(
        throttled
            .poll_next_unpin(&mut Context::from_waker(&waker))
            .is_pending()
    );
    let with_pending = limiter.snapshot().unwrap().wait();
    assert!(
        with_pending > Duration::from_secs(400_000_000),
        "{with_pending:?}"
    );
    drop(throttled);
    assert_eq!(limiter.snapshot().unwrap().wait(), owed);
}

#[tokio::test]
async fn a_stream_dropped_by_a_timeout_leaves_no_debt_on_the_real_clock() {
    let limiter = Arc::new(RateLimiter::bursty(10.0).unwrap());
    let mut throttled = stream::iter(0..10).throttle(limiter.clone());
    assert_eq!(throttled.next().await.unwrap().unwrap(), 0);
    // The second item is 100 ms away: give up after 20 ms.
    let timed_out = tokio::time::timeout(Duration::from_millis(20), throttled.next()).await;
    assert!(timed_out.is_err());
    drop(throttled);
    // Only the first item's permit is owed: at most 80 ms of it is left.
    let left = limiter.snapshot().unwrap().wait();
    assert!(left <= Duration::from_millis(80), "{left:?}");
}

#[tokio::test]
async fn keyed_items_wait_for_their_own_key_in_order() {
    let clock = FakeClock::new();
    let per_user = KeyedRateLimiter::<&str>::builder()
        .permits_per_second(10.0)
        .max_burst(Duration::ZERO) // a new key starts with nothing stored
        .clock(clock.clone())
        .build()
        .unwrap();
    let requests = [
        ("alice", 1),
        ("bob", 2),
        ("alice", 1),
        ("bob", 0),
        ("bob", 1),
    ];
    let released = release_times(
        stream::iter(requests)
            .throttle_keyed(&per_user, |&(user, permits): &(&str, u32)| (user, permits)),
        &clock,
    )
    .await;
    let ms = |ms| Duration::from_millis(ms);
    assert_eq!(
        released,
        [
            (("alice", 1), ms(0)),
            (("bob", 2), ms(0)),
            (("alice", 1), ms(100)),
            (("bob", 0), ms(100)),
            (("bob", 1), ms(200)),
        ]
    );
    assert_eq!(per_user.snapshot(&"alice").unwrap().wait(), ms(0)); // its debt was paid at 200 ms
    assert_eq!(per_user.snapshot(&"bob").unwrap().wait(), ms(100));
}

/// A limiter whose every other reservation fails.
struct Flaky {
    calls: AtomicU32,
    clock: FakeClock,
}

#[async_trait]
impl Limiter for Flaky {
    async fn reserve(&self, _permits: u32) -> Result<Duration, Error> {
        if self.calls.fetch_add(1, Ordering::Relaxed) % 2 == 1 {
            Err(Error::InvalidArgument("backend down".to_owned()))
        } else {
            Ok(Duration::from_millis(10))
        }
    }

    async fn try_reserve(&self, permits: u32, _: Duration) -> Result<Option<Duration>, Error> {
        self.reserve(permits).await.map(Some)
    }

    async fn snapshot(&self) -> Result<paceline::Snapshot, Error> {
        Ok(paceline::Snapshot::waiting(Duration::ZERO, self.rate()))
    }

    fn set_rate(&self, _: f64) -> Result<(), Error> {
        Ok(())
    }

    fn rate(&self) -> f64 {
        100.0
    }

    fn clock(&self) -> &dyn Clock {
        &self.clock
    }
}

#[tokio::test]
async fn a_limiter_error_yields_the_item_and_the_stream_goes_on() {
    let clock = FakeClock::new();
    let limiter: Box<dyn Limiter> = Box::new(Flaky {
        calls: AtomicU32::new(0),
        clock: clock.clone(),
    });
    let mut throttled = stream::iter(0..4).throttle(limiter);
    let mut outcomes = Vec::new();
    while let Some(next) = throttled.next().await {
        outcomes.push(match next {
            Ok(item) => Ok(item),
            Err(error) => {
                assert!(error.to_string().contains("backend down"));
                let (item, error) = error.into_parts();
                assert!(matches!(error, Error::InvalidArgument(_)));
                Err(item)
            }
        });
    }
    assert_eq!(outcomes, [Ok(0), Err(1), Ok(2), Err(3)]);
    // Only the two granted items slept.
    assert_eq!(clock.now(), Duration::from_millis(20));
    assert!(throttled.is_terminated());
    assert!(throttled.next().await.is_none());

    // `?` turns the error into the crate's error.
    let limiter = Flaky {
        calls: AtomicU32::new(0),
        clock,
    };
    let all: Result<Vec<i32>, Error> = stream::iter(0..4)
        .throttle(&limiter)
        .map_err(Error::from)
        .try_collect()
        .await;
    assert!(all.is_err());
}

#[test]
fn throttled_streams_are_send_with_a_shared_limiter() {
    fn assert_send<T: Send>(_: &T) {}
    let limiter: Arc<dyn Limiter> = Arc::new(RateLimiter::bursty(10.0).unwrap());
    let throttled = stream::iter(0..3).throttle(limiter);
    assert_send(&throttled);
    assert_eq!(throttled.size_hint(), (3, Some(3)));
}

/// A body type that boxes its stream (`Body::wrap_stream`, `BoxBody`) asks
/// for `Send + Sync`: a throttled stream is both, keyed or not, whatever
/// future its pending item waits on.
#[test]
fn throttled_streams_are_sync_for_bodies_that_ask_it() {
    fn assert_send_sync<T: Send + Sync + 'static>(_: &T) {}
    let limiter: Arc<dyn Limiter> = Arc::new(RateLimiter::bursty(10.0).unwrap());
    assert_send_sync(&stream::iter(0..3).throttle(limiter));
    let per_user = Arc::new(KeyedRateLimiter::<String>::bursty(10.0).unwrap());
    let keyed =
        stream::iter(["a", "b"]).throttle_keyed(per_user, |user: &&str| (user.to_string(), 1));
    assert_send_sync(&keyed);
}

#[tokio::test]
async fn twenty_items_at_50_per_second_take_380_ms_on_the_real_clock() {
    let limiter = Arc::new(RateLimiter::bursty(50.0).unwrap());
    let start = Instant::now();
    let count = stream::iter(0..20)
        .throttle(limiter)
        .try_fold(0, |count, _| async move { Ok(count + 1) })
        .await
        .unwrap();
    let took = start.elapsed().as_secs_f64();
    assert_eq!(count, 20);
    // 19 intervals of 20 ms after the first, which a new limiter lets go
    // at once: never less (but for the two clocks' rounding); late
    // wake-ups only add (a loaded machine's may add much, so the upper
    // bound only says nothing stalls).
    assert!((0.379..=5.0).contains(&took), "took {took} s");
}
