//! Probes of the blocking forms, runtime interplay and the public traits:
//! a `Limiter` of the user's own (only the required methods) through the
//! provided methods and the adapters, reservations' accounting, the clocks'
//! sleeping, and extreme waits on the real clock.

use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use paceline::clock::{Clock, FakeClock, SystemClock};
use paceline::stream::ThrottleExt;
use paceline::{Error, Limiter, RateLimiter, Snapshot, async_trait};

/// A user's limiter: a plain schedule, one permit per `interval`, charged to
/// the next caller (as Guava does). Counts what it reserved.
struct Schedule<C> {
    clock: C,
    interval: Duration,
    state: Mutex<ScheduleState>,
}

#[derive(Default)]
struct ScheduleState {
    next_free: Duration,
    reserved: u64,
    calls: u64,
}

impl<C: Clock> Schedule<C> {
    fn new(clock: C, interval: Duration) -> Self {
        Schedule {
            clock,
            interval,
            state: Mutex::new(ScheduleState::default()),
        }
    }

    fn reserved(&self) -> u64 {
        self.state.lock().unwrap().reserved
    }

    fn wait_now(&self) -> Duration {
        let now = self.clock.now();
        self.state.lock().unwrap().next_free.saturating_sub(now)
    }

    fn take(&self, permits: u32, timeout: Option<Duration>) -> Result<Option<Duration>, Error> {
        if permits == 0 {
            return Err(Error::InvalidArgument("zero permits".into()));
        }
        let now = self.clock.now();
        let mut state = self.state.lock().unwrap();
        state.calls += 1;
        let wait = state.next_free.saturating_sub(now);
        if timeout.is_some_and(|timeout| wait > timeout) {
            return Ok(None);
        }
        state.next_free = state.next_free.max(now) + self.interval * permits;
        state.reserved += u64::from(permits);
        Ok(Some(wait))
    }
}

#[async_trait]
impl<C: Clock> Limiter for Schedule<C> {
    async fn reserve(&self, permits: u32) -> Result<Duration, Error> {
        Ok(self.take(permits, None)?.expect("no timeout"))
    }
    async fn try_reserve(
        &self,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Duration>, Error> {
        self.take(permits, Some(timeout))
    }
    async fn snapshot(&self) -> Result<Snapshot, Error> {
        Ok(Snapshot::waiting(
            self.wait_now(),
            1.0 / self.interval.as_secs_f64(),
        ))
    }
    fn set_rate(&self, _: f64) -> Result<(), Error> {
        Ok(())
    }
    fn rate(&self) -> f64 {
        1.0 / self.interval.as_secs_f64()
    }
    fn clock(&self) -> &dyn Clock {
        &self.clock
    }
}

/// A user's limiter whose every reservation waits `Duration::MAX`.
struct Forever<C>(C);

#[async_trait]
impl<C: Clock> Limiter for Forever<C> {
    async fn reserve(&self, _: u32) -> Result<Duration, Error> {
        Ok(Duration::MAX)
    }
    async fn try_reserve(&self, _: u32, timeout: Duration) -> Result<Option<Duration>, Error> {
        Ok((timeout == Duration::MAX).then_some(Duration::MAX))
    }
    async fn snapshot(&self) -> Result<Snapshot, Error> {
        Ok(Snapshot::waiting(Duration::MAX, 1.0))
    }
    fn set_rate(&self, _: f64) -> Result<(), Error> {
        Ok(())
    }
    fn rate(&self) -> f64 {
        1.0
    }
    fn clock(&self) -> &dyn Clock {
        &self.0
    }
}

fn fake_schedule(ms: u64) -> (Arc<Schedule<FakeClock>>, FakeClock) {
    let clock = FakeClock::new();
    (
        Arc::new(Schedule::new(clock.clone(), Duration::from_millis(ms))),
        clock,
    )
}

/// The provided methods, as their docs say: `reservation` cannot give back
/// (`can_give_back` false, a drop leaves the permits charged); a refused
/// `try_acquire` reserves nothing and sleeps not; `acquire` sleeps on the
/// limiter's clock; `take_now`, `snapshot_now` answer `None`; `stats` is all
/// zero; `slowest_rate` is `rate`.
#[tokio::test(flavor = "current_thread")]
async fn user_limiter_provided_methods_do_what_their_docs_say() {
    let (limiter, clock) = fake_schedule(100);
    assert!(limiter.take_now(1).is_none());
    assert!(limiter.take_now(0).is_none()); // documented: None by default
    assert!(limiter.snapshot_now().is_none());
    assert_eq!(limiter.stats(), paceline::Stats::default());
    assert_eq!(limiter.slowest_rate(), limiter.rate());

    assert_eq!(limiter.acquire(1).await.unwrap(), Duration::ZERO);
    let held = limiter.reservation(1).await.unwrap();
    assert_eq!(held.delay(), Duration::from_millis(100));
    assert!(!held.can_give_back());
    assert_eq!(held.limit(), Some(0));
    assert!(held.snapshot().is_none());
    drop(held); // cannot give back: still charged
    assert_eq!(limiter.reserved(), 2);
    assert_eq!(
        limiter.snapshot().await.unwrap().wait(),
        Duration::from_millis(200)
    );
    assert_eq!(clock.now(), Duration::ZERO);

    // Refused: nothing reserved, nothing slept.
    assert!(
        !limiter
            .try_acquire(1, Duration::from_millis(199))
            .await
            .unwrap()
    );
    assert!(
        limiter
            .try_reservation(1, Duration::from_millis(199))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(limiter.reserved(), 2);
    assert_eq!(clock.now(), Duration::ZERO);

    // Granted: sleeps on the limiter's (fake) clock.
    assert!(
        limiter
            .try_acquire(1, Duration::from_millis(200))
            .await
            .unwrap()
    );
    assert_eq!(clock.now(), Duration::from_millis(200));
    assert_eq!(
        limiter.acquire(1).await.unwrap(),
        Duration::from_millis(100)
    );
    assert_eq!(clock.now(), Duration::from_millis(300));
    assert_eq!(limiter.reserved(), 4);
    assert!(matches!(
        limiter.acquire(0).await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        limiter.try_acquire(0, Duration::MAX).await,
        Err(Error::InvalidArgument(_))
    ));
}

/// The same through `Arc<dyn Limiter>`, and `keep`, `wait_blocking` on a
/// reservation that cannot give back.
#[test]
fn user_limiter_as_dyn_and_reservations_without_give_back() {
    let (limiter, clock) = fake_schedule(100);
    let shared: Arc<dyn Limiter> = limiter.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        assert_eq!(
            shared.reservation(1).await.unwrap().wait().await,
            Duration::ZERO
        );
        let second = shared.reservation(1).await.unwrap();
        assert_eq!(second.keep(), Duration::from_millis(100));
        assert_eq!(clock.now(), Duration::ZERO); // keep does not wait
        let third = shared.reservation(1).await.unwrap();
        assert_eq!(third.delay(), Duration::from_millis(200));
        assert_eq!(third.wait_blocking(), Duration::from_millis(200));
        assert_eq!(clock.now(), Duration::from_millis(200));
    });
    assert_eq!(limiter.reserved(), 3);

    // without_give_back on a fake clock: wait advances it, keep and drop
    // do not.
    let fake = FakeClock::new();
    let r = paceline::Reservation::without_give_back(Duration::from_millis(5), &fake);
    assert!(!r.can_give_back());
    assert_eq!(r.limit(), Some(0));
    drop(r);
    assert_eq!(fake.now(), Duration::ZERO);
    let r = paceline::Reservation::without_give_back(Duration::from_millis(5), &fake);
    assert_eq!(r.keep(), Duration::from_millis(5));
    assert_eq!(fake.now(), Duration::ZERO);
    let r = paceline::Reservation::without_give_back(Duration::from_millis(5), &fake);
    assert_eq!(r.wait_blocking(), Duration::from_millis(5));
    assert_eq!(fake.now(), Duration::from_millis(5));
    let r = paceline::Reservation::without_give_back(Duration::ZERO, &fake);
    assert_eq!(r.limit(), None);
    assert_eq!(r.wait_blocking(), Duration::ZERO);
    assert_eq!(fake.now(), Duration::from_millis(5));
}

/// A user limiter through the stream adapter: `take_now` answers `None`, so
/// every item goes through a reservation, each waited for on its clock.
#[tokio::test(flavor = "current_thread")]
async fn user_limiter_through_stream_and_io() {
    let (limiter, clock) = fake_schedule(10);
    let items: Vec<u32> = futures::stream::iter(0..5)
        .throttle(limiter.clone())
        .try_collect()
        .await
        .unwrap();
    assert_eq!(items, vec![0, 1, 2, 3, 4]);
    assert_eq!(limiter.reserved(), 5);
    assert_eq!(clock.now(), Duration::from_millis(40));

    // io: chunks of rate × 10 ms = 1 byte at 100/s; 5 bytes, 5 reservations.
    use tokio::io::AsyncWriteExt;
    let shared: Arc<dyn Limiter> = limiter.clone();
    let mut writer = paceline::io::ThrottledWriter::new(Vec::new(), shared);
    writer.write_all(&[1, 2, 3, 4, 5]).await.unwrap();
    assert_eq!(writer.into_inner(), vec![1, 2, 3, 4, 5]);
    assert_eq!(limiter.reserved(), 10);
    assert_eq!(clock.now(), Duration::from_millis(90));
}

/// A user limiter through the tower layer, waiting and rejecting.
#[cfg(feature = "tower")]
#[tokio::test(flavor = "current_thread")]
async fn user_limiter_through_tower() {
    use tower::{Service, ServiceExt};
    let (limiter, clock) = fake_schedule(100);
    let layer = paceline::tower::RateLimitLayer::new(limiter.clone());
    let mut service = tower::ServiceBuilder::new()
        .layer(layer)
        .service_fn(|x: u32| async move { Ok::<_, std::convert::Infallible>(x) });
    for i in 0..3 {
        assert_eq!(service.ready().await.unwrap().call(i).await.unwrap(), i);
    }
    assert_eq!(limiter.reserved(), 3);
    assert_eq!(clock.now(), Duration::from_millis(200));

    // Rejecting: a refused try reserves nothing and says the wait.
    let rejecting = paceline::tower::RateLimitLayer::new(limiter.clone()).max_wait(Duration::ZERO);
    let mut service = tower::ServiceBuilder::new()
        .layer(rejecting)
        .service_fn(|x: u32| async move { Ok::<_, std::convert::Infallible>(x) });
    let refused = service
        .ready()
        .await
        .unwrap()
        .call(9)
        .await
        .expect_err("refused");
    let throttled = refused
        .downcast_ref::<paceline::tower::Throttled>()
        .expect("Throttled");
    assert_eq!(throttled.retry_after, Duration::from_millis(100));
    assert_eq!(limiter.reserved(), 3);
}

/// A user limiter whose reservations wait `Duration::MAX`: on a fake clock
/// `acquire` returns at once (the clock saturates); on the real clock it
/// waits (bounded here by a timeout) without panicking, and the refusal
/// path of `try_acquire` returns at once.
#[tokio::test(flavor = "current_thread")]
async fn user_limiter_waiting_forever() {
    let fake = Forever(FakeClock::new());
    assert_eq!(fake.acquire(1).await.unwrap(), Duration::MAX);
    assert!(!fake.try_acquire(1, Duration::from_secs(1)).await.unwrap());
    assert!(fake.try_acquire(1, Duration::MAX).await.unwrap());
    assert_eq!(
        fake.reservation(1).await.unwrap().wait_blocking(),
        Duration::MAX
    );

    let real = Forever(SystemClock::new());
    let started = Instant::now();
    assert!(!real.try_acquire(1, Duration::from_secs(1)).await.unwrap());
    assert!(
        tokio::time::timeout(Duration::from_millis(50), real.acquire(1))
            .await
            .is_err()
    );
    assert!(
        tokio::time::timeout(
            Duration::from_millis(50),
            real.try_acquire(1, Duration::MAX)
        )
        .await
        .is_err()
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// Keep, drop, wait and wait_blocking on this crate's limiter: drop gives
/// back, the other three keep the permits charged.
#[tokio::test(flavor = "current_thread")]
async fn reservation_keep_drop_wait_accounting() {
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .permits_per_second(10.0)
        .max_burst(Duration::ZERO)
        .clock(clock.clone())
        .build()
        .unwrap();
    limiter.reservation(1).unwrap().wait_blocking();
    // dropped: given back
    let r = limiter.reservation(1).unwrap();
    assert!(r.can_give_back());
    assert_eq!(r.delay(), Duration::from_millis(100));
    drop(r);
    // kept: charged, the clock does not move
    let r = limiter.reservation(1).unwrap();
    assert_eq!(r.delay(), Duration::from_millis(100));
    assert_eq!(r.keep(), Duration::from_millis(100));
    assert_eq!(clock.now(), Duration::ZERO);
    // waited (blocking): charged, the clock moves
    let r = limiter.reservation(1).unwrap();
    assert_eq!(r.delay(), Duration::from_millis(200));
    assert_eq!(r.wait_blocking(), Duration::from_millis(200));
    assert_eq!(clock.now(), Duration::from_millis(200));
    // waited (async): charged
    let r = limiter.reservation(1).unwrap();
    assert_eq!(r.delay(), Duration::from_millis(100));
    assert_eq!(r.wait().await, Duration::from_millis(100));
    assert_eq!(clock.now(), Duration::from_millis(300));
    assert_eq!(
        limiter.snapshot().unwrap().wait(),
        Duration::from_millis(100)
    );
    // Kept, then a later one dropped: the kept one stays charged.
    let kept = limiter.reservation(1).unwrap();
    let later = limiter.reservation(1).unwrap();
    assert_eq!(later.delay(), Duration::from_millis(200));
    kept.keep();
    drop(later);
    assert_eq!(
        limiter.snapshot().unwrap().wait(),
        Duration::from_millis(200)
    );
}

/// A FakeClock moves by every sleep on it, even concurrent ones: two tasks
/// whose moments are 100 and 200 ms move it by their sum (documented: "the
/// sleep returns at once and the clock moves by its length").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_clock_concurrent_sleeps_add_up() {
    let clock = FakeClock::new();
    let limiter = Arc::new(
        RateLimiter::builder()
            .permits_per_second(10.0)
            .max_burst(Duration::ZERO)
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    limiter.acquire(1).await.unwrap();
    let a = limiter.reservation(1).unwrap();
    let b = limiter.reservation(1).unwrap();
    assert_eq!(
        (a.delay(), b.delay()),
        (Duration::from_millis(100), Duration::from_millis(200))
    );
    let (x, y) = tokio::join!(a.wait(), b.wait());
    assert_eq!(
        (x, y),
        (Duration::from_millis(100), Duration::from_millis(200))
    );
    assert_eq!(clock.now(), Duration::from_millis(300));
}

/// `acquire(u32::MAX)` on the real clock at 1/s: the first goes at once and
/// charges ~136 years to the next; `try_acquire(1, Duration::MAX)` then
/// reserves and sleeps (bounded here by a timeout, whose drop gives its
/// permit back); the blocking try refuses promptly; nothing panics.
#[tokio::test(flavor = "current_thread")]
async fn real_clock_extremes_return_or_wait_as_documented() {
    let limiter = RateLimiter::bursty(1.0).unwrap();
    let started = Instant::now();
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), limiter.acquire(u32::MAX))
            .await
            .expect("the first request goes at once")
            .unwrap(),
        Duration::ZERO
    );
    let owed = limiter.snapshot().unwrap().wait();
    assert!(owed > Duration::from_secs(100 * 365 * 86_400), "{owed:?}");
    assert!(
        tokio::time::timeout(
            Duration::from_millis(50),
            limiter.try_acquire(1, Duration::MAX)
        )
        .await
        .is_err()
    );
    let after = limiter.snapshot().unwrap().wait();
    assert!(after <= owed, "the timed-out try gave its permit back");
    assert!(
        !limiter
            .try_acquire(1, Duration::from_secs(1))
            .await
            .unwrap()
    );
    assert!(
        !limiter
            .try_acquire_blocking(1, Duration::from_secs(1))
            .unwrap()
    );
    assert!(limiter.try_reserve(1, Duration::ZERO).unwrap().is_none());
    assert!(started.elapsed() < Duration::from_secs(5));

    // acquire_blocking of u32::MAX on a fresh limiter returns at once too.
    let limiter = RateLimiter::bursty(1.0).unwrap();
    assert_eq!(limiter.acquire_blocking(u32::MAX).unwrap(), Duration::ZERO);
    assert!(!limiter.try_acquire_blocking(1, Duration::ZERO).unwrap());
}
