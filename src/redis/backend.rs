//! What a Redis limiter talks through: the target, the connection in use,
//! its health, and the runtime its I/O runs on.

use std::future::Future;
use std::time::Duration;

use tokio::runtime::{Handle, Runtime, RuntimeFlavor};

use super::connection::{Connection, Link, Target};
use super::fallback::Health;
use crate::Error;
use crate::error::BackendError;

/// The runtime a limiter's Redis I/O and probe run on.
pub(crate) enum RuntimeRef {
    /// The runtime the limiter was built in.
    Borrowed(Handle),
    /// A runtime of its own (`build_blocking`); shut down on drop.
    Owned(Option<Runtime>),
}

impl RuntimeRef {
    pub(crate) fn handle(&self) -> Option<Handle> {
        match self {
            RuntimeRef::Borrowed(handle) => Some(handle.clone()),
            RuntimeRef::Owned(runtime) => runtime.as_ref().map(|r| r.handle().clone()),
        }
    }
}

impl Drop for RuntimeRef {
    fn drop(&mut self) {
        if let RuntimeRef::Owned(runtime) = self {
            if let Some(runtime) = runtime.take() {
                // Never blocks, so this is fine anywhere, even on one of the
                // runtime's own threads or inside another runtime.
                runtime.shutdown_background();
            }
        }
    }
}

/// One target, one connection, one health state, one runtime.
pub(crate) struct Backend {
    pub(crate) target: Target,
    pub(crate) link: Link,
    pub(crate) health: Health,
    pub(crate) runtime: RuntimeRef,
    pub(crate) response_timeout: Duration,
    pub(crate) probe_interval: Duration,
}

impl Backend {
    /// The connection calls use, or `None` if none has worked yet.
    pub(crate) fn connection(&self) -> Option<Connection> {
        self.link.get()
    }

    /// Runs `task` in the background on the backend's runtime (no-op once
    /// that runtime is gone).
    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        if let Some(handle) = self.runtime.handle() {
            handle.spawn(task);
        }
    }

    /// Runs `work` to completion from blocking code: the thread blocks while
    /// the backend's runtime drives `work`. Works from a plain thread, from
    /// `spawn_blocking`, and from a task of a multi-thread runtime (whose
    /// worker hands its other tasks to another thread first).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] on a thread of a current-thread runtime
    /// that the backend runs on, where blocking would stop the runtime that
    /// has to do the work. (Its `spawn_blocking` threads cannot be told
    /// apart from it, so they get the error too.)
    pub(crate) fn block_on<T: Send + 'static>(
        &self,
        work: impl Future<Output = T> + Send + 'static,
    ) -> Result<T, Error> {
        let Some(handle) = self.runtime.handle() else {
            return Err(shut_down());
        };
        if matches!(self.runtime, RuntimeRef::Borrowed(_))
            && Handle::try_current()
                .is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::CurrentThread)
        {
            return Err(Error::InvalidArgument(
                "a blocking call (acquire_blocking, try_acquire_blocking) cannot run on a \
                 thread of a current-thread Tokio runtime that the limiter uses: it would stop \
                 the runtime it waits for. Use the async method (e.g. acquire().await), or \
                 build the limiter with build_blocking()"
                    .to_owned(),
            ));
        }
        blocking_section(move || {
            let task = handle.spawn(work);
            futures::executor::block_on(task).map_err(|_| shut_down())
        })
    }
}

/// Runs `f`, which blocks the thread. On a task of a multi-thread runtime,
/// the worker first hands its queue (and its next-task slot) to another
/// thread, so tasks queued here, such as one `f` waits for, keep running.
/// (On a current-thread runtime's thread it runs `f` as is: only a limiter
/// with a runtime of its own gets there.)
pub(crate) fn blocking_section<T>(f: impl FnOnce() -> T) -> T {
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::CurrentThread) | Err(_) => f(),
        Ok(_) => tokio::task::block_in_place(f),
    }
}

/// The error for a backend whose runtime is gone.
pub(crate) fn shut_down() -> Error {
    Error::Backend(BackendError::new(
        "the limiter's Tokio runtime has shut down",
        None,
    ))
}
