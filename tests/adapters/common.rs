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

/// Room for one request at a time in a service below a layer (a
/// concurrency limit, a bounded buffer): taken as the service is made
/// ready, used by its call (answered at once, it is free again), given
/// back by a ready service dropped uncalled; a clone holds none.
#[cfg(feature = "tower")]
pub struct Room {
    free: Arc<std::sync::atomic::AtomicBool>,
    holds: bool,
}

#[cfg(feature = "tower")]
impl Room {
    pub fn new() -> Room {
        Room {
            free: Arc::new(std::sync::atomic::AtomicBool::new(true)),
            holds: false,
        }
    }

    /// `poll_ready`'s answer: ready once the room is held.
    pub fn poll_take<E>(&mut self) -> Poll<Result<(), E>> {
        if !self.holds && !self.free.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        self.holds = true;
        Poll::Ready(Ok(()))
    }

    /// A call's use of the room, answered at once: free again.
    pub fn used(&mut self) {
        assert!(std::mem::take(&mut self.holds), "called before ready");
        self.free.store(true, Ordering::Release);
    }
}

/// A clone holds no room (readiness is not cloned).
#[cfg(feature = "tower")]
impl Clone for Room {
    fn clone(&self) -> Self {
        Room {
            free: Arc::clone(&self.free),
            holds: false,
        }
    }
}

#[cfg(feature = "tower")]
impl Drop for Room {
    fn drop(&mut self) {
        if self.holds {
            self.free.store(true, Ordering::Release);
        }
    }
}
