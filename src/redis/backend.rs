//! What a Redis limiter talks through: the target, the connection in use,
//! its health, and the runtime its I/O runs on.

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::runtime::{Handle, Runtime, RuntimeFlavor};

use super::connection::{Connection, Link, Target};
use super::fallback::Health;
use super::script::{self, Call, ScriptArgs};
use crate::Error;
use crate::core::{Bursty, Policy};
use crate::error::BackendError;

/// The key a backend probes before any limiter has failed on it: outside
/// the `throttler:` prefix, so that it can be no limiter's.
const BACKEND_PROBE_KEY: &str = "throttler-probe";

/// Where the probe runs the script: the key of the limiter whose call
/// failed (on a cluster, that key's own node), with that limiter's
/// arguments.
#[derive(Clone)]
pub(crate) struct ProbeTarget {
    pub(crate) key: Arc<str>,
    pub(crate) script_args: Arc<ScriptArgs>,
    pub(crate) rate: f64,
}

impl ProbeTarget {
    /// The backend's own probe key, with arguments that describe an idle
    /// limiter (its probe writes a missing key with a TTL of a few ms).
    pub(crate) fn backend() -> ProbeTarget {
        ProbeTarget {
            key: BACKEND_PROBE_KEY.into(),
            script_args: Arc::new(ScriptArgs::new(&Policy::Bursty(Bursty::default()), 1.0)),
            rate: 1.0,
        }
    }
}

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

/// One target, one connection, one health state, one probe, one runtime,
/// shared by every limiter made from it.
pub(crate) struct Backend {
    pub(crate) target: Target,
    pub(crate) link: Link,
    pub(crate) health: Health,
    pub(crate) runtime: RuntimeRef,
    pub(crate) response_timeout: Duration,
    pub(crate) probe_interval: Duration,
}

impl Backend {
    pub(crate) fn new(
        target: Target,
        runtime: RuntimeRef,
        response_timeout: Duration,
        probe_interval: Duration,
    ) -> Backend {
        Backend {
            target,
            link: Link::default(),
            health: Health::default(),
            runtime,
            response_timeout,
            probe_interval,
        }
    }

    /// The first attempt to reach Redis: a fresh connection and the
    /// script's probe on it, on `target`. On failure the backend starts
    /// degraded (its probe running), or, when `require` is set, the failure
    /// is returned.
    pub(crate) async fn start(
        self: &Arc<Self>,
        require: bool,
        target: ProbeTarget,
    ) -> Result<(), Error> {
        match self.try_probe(&target).await {
            Ok(()) => Ok(()),
            Err(failure) if require => Err(Error::Backend(failure)),
            Err(failure) => {
                self.degrade(&failure, target);
                Ok(())
            }
        }
    }

    /// Marks the backend degraded after `failure` (once: later failures
    /// while degraded change nothing) and starts the probe on `target`.
    /// Every limiter of the backend then serves from its fallback.
    pub(crate) fn degrade(self: &Arc<Self>, failure: &BackendError, target: ProbeTarget) {
        if !self.health.degrade(&failure.to_string()) {
            return;
        }
        tracing::warn!(
            target = %self.target.describe(),
            key = %target.key,
            error = %failure,
            "Redis is unavailable; limiters serve from their fallbacks until the script works again"
        );
        self.spawn(probe(Arc::downgrade(self), target));
    }

    /// One probe: a fresh connection and the script's probe mode on it
    /// (which reserves nothing, but writes: a server that refuses writes
    /// fails it). On success the connection replaces the one in use. A
    /// call the script rejects for the key's data is not an outage.
    async fn try_probe(&self, target: &ProbeTarget) -> Result<(), BackendError> {
        let mut connection = self.target.connect(self.response_timeout).await?;
        let probe = script::invoke(
            &mut connection,
            &target.key,
            &Call::Probe,
            target.rate,
            &target.script_args,
        );
        match tokio::time::timeout(self.response_timeout, probe).await {
            Ok(Ok(_)) => {
                self.link.replace(connection);
                Ok(())
            }
            Ok(Err(e)) if script::is_data_error(&e) => {
                self.link.replace(connection);
                Ok(())
            }
            Ok(Err(e)) => Err(BackendError::new(
                format!("the probe's script failed on key {}", target.key),
                Some(Box::new(e)),
            )),
            Err(_) => Err(BackendError::timeout(format!(
                "the probe's script did not answer within {:?} (key {})",
                self.response_timeout, target.key
            ))),
        }
    }

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

/// Probes every `probe_interval` until the script works on a fresh
/// connection, then marks the backend healthy. Ends when the backend is
/// dropped (with its last limiter and handle).
async fn probe(backend: Weak<Backend>, target: ProbeTarget) {
    loop {
        let Some(interval) = backend.upgrade().map(|b| b.probe_interval) else {
            return;
        };
        tokio::time::sleep(interval).await;
        let Some(backend) = backend.upgrade() else {
            return;
        };
        match backend.try_probe(&target).await {
            Ok(()) => {
                backend.health.recover();
                tracing::info!(
                    target = %backend.target.describe(),
                    "the limiters' script works again; back on Redis"
                );
                return;
            }
            Err(e) => backend.health.set_last_error(&e.to_string()),
        }
    }
}

/// The runtime of the calling task, for a backend built with `build()`.
pub(crate) fn current_runtime(builder: &str) -> Result<RuntimeRef, Error> {
    Handle::try_current()
        .map(RuntimeRef::Borrowed)
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
        .thread_name("throttler-redis")
        .enable_all()
        .build()
        .map(|runtime| RuntimeRef::Owned(Some(runtime)))
        .map_err(|e| {
            Error::Backend(BackendError::new(
                "cannot start the limiter's runtime",
                Some(Box::new(e)),
            ))
        })
}
