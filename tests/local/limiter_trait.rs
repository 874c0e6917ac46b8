//! The `Limiter` trait: object safe, and its provided methods sleep on the
//! limiter's clock.

use crate::support::fake;

use std::sync::Arc;
use std::time::Duration;

use paceline::Local;
use paceline::clock::{Clock, FakeClock};
use paceline::{Error, Limiter, RateLimiter};

fn as_dyn(rate: f64) -> (Arc<dyn Limiter>, FakeClock) {
    let (limiter, clock) = fake::bursty(rate);
    (Arc::new(limiter), clock)
}

#[tokio::test]
async fn acquire_through_the_trait_sleeps_on_the_limiter_clock() {
    let (limiter, clock) = as_dyn(4.0);
    assert_eq!(limiter.acquire(1).await.unwrap(), Duration::ZERO);
    assert_eq!(
        limiter.acquire(1).await.unwrap(),
        Duration::from_millis(250)
    );
    assert_eq!(clock.now(), Duration::from_millis(250));
    assert_eq!(limiter.clock().now(), Duration::from_millis(250));
}

#[tokio::test]
async fn try_acquire_through_the_trait() {
    let (limiter, clock) = as_dyn(4.0);
    assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());
    assert!(
        !limiter
            .try_acquire(1, Duration::from_millis(249))
            .await
            .unwrap()
    );
    assert_eq!(
        limiter.snapshot().await.unwrap().wait(),
        Duration::from_millis(250)
    );
    assert!(
        limiter
            .try_acquire(1, Duration::from_millis(250))
            .await
            .unwrap()
    );
    assert_eq!(clock.now(), Duration::from_millis(250));
}

#[tokio::test]
async fn reserve_rate_and_errors_through_the_trait() {
    let (limiter, _) = as_dyn(4.0);
    assert_eq!(limiter.reserve(2).await.unwrap(), Duration::ZERO);
    assert_eq!(
        limiter
            .try_reserve(1, Duration::from_secs(1))
            .await
            .unwrap(),
        Some(Duration::from_millis(500))
    );
    limiter.set_rate(8.0).unwrap();
    assert_eq!(limiter.rate(), 8.0);
    assert!(matches!(
        limiter.reserve(0).await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        limiter.set_rate(f64::NAN),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn limiters_are_send_sync_and_shareable() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<RateLimiter>();
    assert_send_sync::<RateLimiter<Local, FakeClock>>();
    assert_send_sync::<Arc<dyn Limiter>>();
}

/// Every future of a limiter is `Send`, so a task can be spawned with it on
/// a multi-thread runtime: each method, with and without a key (a `String`
/// key asked with `&String` or `&str`), on the limiter and through the
/// traits, the reservations and calls held across an await.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_future_can_be_spawned() {
    let single = Arc::new(RateLimiter::bursty(1e6).unwrap());
    let keyed = Arc::new(paceline::KeyedRateLimiter::<String>::bursty(1e6).unwrap());
    let shared: Arc<dyn Limiter> = single.clone();
    let shared_keyed: Arc<dyn paceline::KeyedLimiter<String>> = keyed.clone();
    let zero = Duration::ZERO;
    let tasks = vec![
        tokio::spawn(async move {
            single.acquire(1).await?;
            single.try_acquire(1, zero).await?;
            let reservation = single.reservation(1)?;
            tokio::task::yield_now().await;
            reservation.wait().await;
            let call = single.call(1).await?;
            tokio::task::yield_now().await;
            drop(single.try_call(1, zero).await?);
            call.settle(1)
        }),
        tokio::spawn(async move {
            let key = String::from("alice");
            keyed.acquire(&key, 1).await?;
            keyed.try_acquire(key.as_str(), 1, zero).await?;
            let reservation = keyed.reservation(&key, 1)?;
            tokio::task::yield_now().await;
            reservation.wait().await;
            let call = keyed.call(key.as_str(), 1).await?;
            tokio::task::yield_now().await;
            drop(keyed.try_call(&key, 1, zero).await?);
            call.settle(1)
        }),
        tokio::spawn(async move {
            shared.acquire(1).await?;
            shared.try_acquire(1, zero).await?;
            let reservation = shared.reservation(1).await?;
            tokio::task::yield_now().await;
            reservation.wait().await;
            shared.snapshot().await.map(drop)
        }),
        tokio::spawn(async move {
            let key = String::from("bob");
            shared_keyed.acquire(&key, 1).await?;
            shared_keyed.try_acquire(&key, 1, zero).await?;
            let reservation = shared_keyed.reservation(&key, 1).await?;
            tokio::task::yield_now().await;
            reservation.wait().await;
            shared_keyed.snapshot(&key).await.map(drop)
        }),
    ];
    for task in tasks {
        task.await.unwrap().unwrap();
    }
}

/// What a limiter counts reads the same through the traits as on the
/// limiter: calls in flight, keys held.
#[tokio::test(flavor = "current_thread")]
async fn stats_through_the_traits() {
    let limiter = Arc::new(
        RateLimiter::builder()
            .limit(paceline::Limit::per_second(100.0))
            .limit(paceline::Limit::concurrent(2))
            .clock(FakeClock::new())
            .build()
            .unwrap(),
    );
    let call = limiter.call(1).await.unwrap();
    let shared: Arc<dyn Limiter> = limiter.clone();
    assert_eq!(shared.stats().in_flight, 1);
    drop(call);
    assert_eq!(shared.stats(), limiter.stats());
    assert_eq!(shared.stats().in_flight, 0);

    let keyed = Arc::new(
        paceline::KeyedRateLimiter::<u64>::builder()
            .permits_per_second(5.0)
            .clock(FakeClock::new())
            .build()
            .unwrap(),
    );
    let shared: Arc<dyn paceline::KeyedLimiter<u64>> = keyed.clone();
    for key in 0..3 {
        shared.reserve(&key, 5).await.unwrap();
    }
    assert_eq!(shared.stats().keys, 3);
    assert_eq!(shared.stats(), keyed.stats());
}
