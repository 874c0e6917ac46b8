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
