//! [`ManualClock`]: a clock whose time moves only when the test moves it,
//! and whose sleeps end only then (a `FakeClock`'s sleep returns at once,
//! moving time itself: no test could act during it).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use paceline::clock::{Clock, Sleep};

/// A clock at zero that the test moves ([`advance`](Self::advance),
/// [`set_ms`](Self::set_ms)); a sleep on it ends once the time reaches its
/// end, its task woken then.
#[derive(Clone, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
    sleepers: Arc<Mutex<Vec<Waker>>>,
}

impl ManualClock {
    /// Moves time forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.nanos.fetch_add(by.as_nanos() as u64, Ordering::AcqRel);
        self.wake();
    }

    /// Sets the time to `ms` milliseconds.
    pub fn set_ms(&self, ms: u64) {
        self.nanos.store(ms * 1_000_000, Ordering::Release);
        self.wake();
    }

    /// The time, in whole milliseconds.
    pub fn ms(&self) -> u64 {
        self.nanos.load(Ordering::Acquire) / 1_000_000
    }

    fn wake(&self) {
        for waker in self.sleepers.lock().unwrap().drain(..) {
            waker.wake();
        }
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Acquire))
    }

    /// Blocks until another thread moves the time past the sleep's end.
    fn sleep_blocking(&self, duration: Duration) {
        let deadline = self.now() + duration;
        while self.now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        let clock = self.clone();
        let deadline = self.now() + duration;
        Box::pin(std::future::poll_fn(move |cx| {
            if clock.now() >= deadline {
                Poll::Ready(())
            } else {
                clock.sleepers.lock().unwrap().push(cx.waker().clone());
                Poll::Pending
            }
        }))
    }
}

/// A future the test polls by hand, as time moves on a [`ManualClock`].
pub type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// Polls `future` once (no waker to wake): its output, if ready.
pub fn poll<T>(future: &mut Boxed<'_, T>) -> Option<T> {
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(out) => Some(out),
        Poll::Pending => None,
    }
}

/// Polls a future that must be ready at once: its output (a panic if it
/// waits).
pub fn at_once<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("waited"),
    }
}
