//! The runtime a Redis limiter's I/O runs on, and blocking from a thread
//! that may be one of its workers.

use std::sync::{Arc, OnceLock};
use std::thread::{self, ThreadId};

use tokio::runtime::{Handle, Runtime, RuntimeFlavor};

use crate::Error;
use crate::error::BackendError;

/// The runtime a limiter's Redis I/O and probe run on.
pub(crate) enum RuntimeRef {
    /// The runtime the limiter was built in; for a current-thread runtime,
    /// the thread that drives it.
    Borrowed {
        handle: Handle,
        driver: Option<Arc<Driver>>,
    },
    /// A runtime of its own (`build_blocking`); shut down on drop.
    Owned(Option<Runtime>),
}

impl RuntimeRef {
    pub(crate) fn handle(&self) -> Option<Handle> {
        match self {
            RuntimeRef::Borrowed { handle, .. } => Some(handle.clone()),
            RuntimeRef::Owned(runtime) => runtime.as_ref().map(|r| r.handle().clone()),
        }
    }
}

/// The thread that drives a borrowed current-thread runtime (the one in
/// its `block_on`): a blocking call there would stop the runtime it waits
/// for. Other threads that see the runtime (its blocking pool's) may block,
/// and so may that thread once its `block_on` has returned.
pub(crate) struct Driver {
    /// The thread the limiter was built on: taken for the driver until a
    /// task of the runtime says which thread runs it.
    built_on: ThreadId,
    driven_by: OnceLock<ThreadId>,
}

impl Driver {
    /// Notes the thread `handle`'s runtime runs its tasks on, from the next
    /// moment it runs one.
    fn watch(handle: &Handle) -> Arc<Driver> {
        let driver = Arc::new(Driver {
            built_on: thread::current().id(),
            driven_by: OnceLock::new(),
        });
        let recorder = Arc::clone(&driver);
        handle.spawn(async move {
            let _ = recorder.driven_by.set(thread::current().id());
        });
        driver
    }

    /// Whether this thread drives the runtime now: it is the runtime's
    /// thread, inside a runtime (outside, its `block_on` has returned and
    /// nothing is stopped by blocking it).
    pub(crate) fn is_current(&self) -> bool {
        let me = thread::current().id();
        *self.driven_by.get().unwrap_or(&self.built_on) == me && Handle::try_current().is_ok()
    }
}

impl Drop for RuntimeRef {
    fn drop(&mut self) {
        if let RuntimeRef::Owned(runtime) = self
            && let Some(runtime) = runtime.take()
        {
            // Never blocks, so this is fine anywhere, even on one of the
            // runtime's own threads or inside another runtime.
            runtime.shutdown_background();
        }
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
    ))
}

/// The runtime of the calling task, for a backend built with `build()`.
pub(crate) fn current_runtime(builder: &str) -> Result<RuntimeRef, Error> {
    Handle::try_current()
        .map(|handle| {
            let driver = (handle.runtime_flavor() == RuntimeFlavor::CurrentThread)
                .then(|| Driver::watch(&handle));
            RuntimeRef::Borrowed { handle, driver }
        })
        .map_err(|_| {
            Error::InvalidArgument(format!(
                "{builder}::build() must run inside a Tokio runtime; \
             use build_blocking() in a program without one"
            ))
        })
}

/// A small runtime of the backend's own (one worker thread), for
/// `build_blocking()`.
pub(crate) fn own_runtime() -> Result<RuntimeRef, Error> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("paceline-redis")
        .enable_all()
        .build()
        .map(|runtime| RuntimeRef::Owned(Some(runtime)))
        .map_err(|e| {
            Error::Backend(BackendError::new("cannot start the limiter's runtime").with_source(e))
        })
}
