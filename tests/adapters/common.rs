//! What several of the adapters' test files share: a service that counts
//! its calls, a limiter on a manual clock, and one poll of a future.

use std::sync::Arc;
#[cfg(feature = "tower")]
use std::sync::atomic::{AtomicU32, Ordering};
#[cfg(feature = "tower")]
use std::task::Poll;
use std::task::{Context, Waker};
use std::time::Duration;

use paceline::clock::Clock;
use paceline::{Local, RateLimiter};

use crate::support::manual::ManualClock;

/// A context whose waker does nothing.
pub fn noop() -> Context<'static> {
    Context::from_waker(Waker::noop())
}

/// Polls `future` once, with a waker that does nothing.
#[cfg(feature = "tower")]
pub fn poll_once<F: std::future::Future + ?Sized>(
    future: std::pin::Pin<&mut F>,
) -> Poll<F::Output> {
    future.poll(&mut noop())
}

/// A limiter at `rate` with no burst, on a manual clock.
pub fn manual(rate: f64) -> (Arc<RateLimiter<Local, ManualClock>>, ManualClock) {
    on(rate, ManualClock::default())
}

/// A limiter at `rate` with no burst, on `clock`.
pub fn on<C: Clock + Clone>(rate: f64, clock: C) -> (Arc<RateLimiter<Local, C>>, C) {
    let limiter = RateLimiter::builder()
        .permits_per_second(rate)
        .max_burst(Duration::ZERO)
        .clock(clock.clone())
        .build()
        .unwrap();
    (Arc::new(limiter), clock)
}

/// A service that answers at once and counts its calls.
#[cfg(feature = "tower")]
#[derive(Clone, Default)]
pub struct Counter(pub Arc<AtomicU32>);

#[cfg(feature = "tower")]
impl tower_service::Service<u32> for Counter {
    type Response = u32;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<u32, std::io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: u32) -> Self::Future {
        self.0.fetch_add(1, Ordering::Relaxed);
        std::future::ready(Ok(request))
    }
}
