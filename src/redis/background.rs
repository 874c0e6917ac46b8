//! What runs on a backend's runtime: its tasks in the background, and the
//! blocking calls that wait for it.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use super::backend::Backend;
use super::runtime::{RuntimeRef, blocking_section, shut_down};
use crate::Error;
use crate::error::BackendError;

/// Work handed to the runtime by [`Backend::block_on`]: not yet started,
/// started, or given up on by its caller (it then never starts).
const WAITING: u8 = 0;
const STARTED: u8 = 1;
const GIVEN_UP: u8 = 2;

/// The backend's runtime at work: tasks in the background, and blocking
/// calls that wait for it.
impl Backend {
    /// Runs `task` in the background on the backend's runtime (no-op once
    /// that runtime is gone).
    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        if let Some(handle) = self.runtime.handle() {
            handle.spawn(task);
        }
    }

    /// Runs `work` to completion from blocking code: the thread blocks while
    /// the backend's runtime drives `work`, at most `bound` (`None`: until
    /// it ends). Works from a plain thread, from `spawn_blocking`, and from
    /// a task of a multi-thread runtime (see [`blocking_section`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] on the thread that drives the
    /// current-thread runtime the backend runs on (see
    /// [`Driver`](super::runtime::Driver)), where blocking would stop the
    /// runtime that has to do the work; [`Error::Backend`] if that runtime
    /// has shut down, or has not run `work` within `bound` (a current-thread
    /// runtime that nothing drives any more).
    ///
    /// Work given up on before it started never runs, even if the runtime is
    /// driven again: its caller is answered another way (a call, by the
    /// fallback), so running it then would take for nobody. Work that had
    /// started is waited for once more as long (it is bounded itself).
    pub(crate) fn block_on<T: Send + 'static>(
        &self,
        work: impl Future<Output = T> + Send + 'static,
        bound: Option<Duration>,
    ) -> Result<T, Error> {
        self.may_block()?;
        let Some(handle) = self.runtime.handle() else {
            return Err(shut_down());
        };
        blocking_section(move || {
            let (done, result) = std::sync::mpsc::sync_channel(1);
            // Who moves first: the work, as it starts, or its caller, giving
            // up on it.
            let turn = Arc::new(AtomicU8::new(WAITING));
            let taken = Arc::clone(&turn);
            // (Dropped unrun, or with its runtime: the channel closes.)
            handle.spawn(async move {
                if taken
                    .compare_exchange(WAITING, STARTED, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    let _ = done.send(work.await);
                }
            });
            let Some(bound) = bound else {
                return result.recv().map_err(|_| shut_down());
            };
            let answer = match result.recv_timeout(bound) {
                Err(RecvTimeoutError::Timeout)
                    if turn
                        .compare_exchange(WAITING, GIVEN_UP, Ordering::AcqRel, Ordering::Acquire)
                        .is_err() =>
                {
                    result.recv_timeout(bound)
                }
                answer => answer,
            };
            answer.map_err(|error| match error {
                RecvTimeoutError::Disconnected => shut_down(),
                RecvTimeoutError::Timeout => Error::Backend(BackendError::new(format!(
                    "the limiter's Tokio runtime did not run the call within {bound:?}: \
                     is it still driven?"
                ))),
            })
        })
    }

    /// Whether this thread may block on the backend's runtime: not if it
    /// drives the current-thread runtime the backend runs on (see
    /// [`Driver`](super::runtime::Driver)), whether or not a call there
    /// would wait for that runtime, so that the answer is the same
    /// whatever the state of Redis.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] on that thread.
    pub(crate) fn may_block(&self) -> Result<(), Error> {
        match &self.runtime {
            RuntimeRef::Borrowed {
                driver: Some(driver),
                ..
            } if driver.is_current() => Err(Error::InvalidArgument(
                "a blocking call (acquire_blocking, try_acquire_blocking) cannot run on the \
                 thread that drives the current-thread Tokio runtime the limiter uses: it \
                 would stop the runtime it waits for. Use the async method (e.g. \
                 acquire().await), call it from spawn_blocking, or build the limiter with \
                 build_blocking()"
                    .to_owned(),
            )),
            _ => Ok(()),
        }
    }

    /// How long a blocking call waits for the backend's runtime to run it:
    /// twice the response timeout (a call may wait for a carry-back, then
    /// for its own round trip), and a second of slack for a busy runtime.
    pub(crate) fn blocking_bound(&self) -> Duration {
        // (Saturating: an endless response timeout waits endlessly.)
        let timeout = self.options.response_timeout;
        timeout
            .saturating_mul(2)
            .saturating_add(Duration::from_secs(1))
    }
}
