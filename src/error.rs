//! The crate's one error type.

use std::fmt;

/// Everything that can go wrong in this crate.
///
/// Being throttled is not an error:
/// [`try_acquire`](crate::RateLimiter::try_acquire) returns `Ok(false)` and
/// [`try_reserve`](crate::RateLimiter::try_reserve) `Ok(None)`. Errors are for
/// bad input and broken backends.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// An argument or a configuration value is out of range (zero permits, a
    /// rate that is zero, negative or NaN, a cold factor below 1, options that
    /// contradict each other); the message says which and what was given.
    InvalidArgument(String),
    /// The backend (Redis) could not serve the call: it was unreachable, did
    /// not answer in time, or answered with an error. The underlying error, if
    /// any, is the [`source`](std::error::Error::source).
    Backend(BackendError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument(message) => write!(f, "invalid argument: {message}"),
            Error::Backend(error) => write!(f, "backend error: {error}"),
        }
    }
}

impl From<crate::core::InvalidRate> for Error {
    fn from(error: crate::core::InvalidRate) -> Self {
        Error::InvalidArgument(error.to_string())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::InvalidArgument(_) => None,
            Error::Backend(error) => std::error::Error::source(error),
        }
    }
}

/// What went wrong with a backend, with the backend's own error as the source.
///
/// The Redis limiters make these; a [`KeyedLimiter`](crate::KeyedLimiter) or
/// [`Limiter`](crate::Limiter) written outside the crate makes its own for a
/// store it cannot reach, so that callers (the HTTP layer answers
/// `503 Service Unavailable`) tell a broken backend from a bad argument.
///
/// ```
/// use paceline::{BackendError, Error};
///
/// let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
/// let error = Error::Backend(BackendError::new("cannot reach the quota store").with_source(refused));
/// assert_eq!(error.to_string(), "backend error: cannot reach the quota store: connection refused");
/// assert!(std::error::Error::source(&error).is_some());
///
/// let late = BackendError::new("the quota store did not answer in 50 ms").with_timeout(true);
/// assert!(late.is_timeout());
/// ```
pub struct BackendError(Box<Backend>);

/// What a [`BackendError`] holds, boxed, so that an `Error` is a word or
/// three, cheap to move through every call's `Result`.
#[derive(Debug)]
struct Backend {
    message: String,
    timed_out: bool,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl BackendError {
    /// The backend failed as `message` says (what was asked of which backend):
    /// it answered with an error, or could not be reached.
    pub fn new(message: impl Into<String>) -> Self {
        BackendError(Box::new(Backend {
            message: message.into(),
            timed_out: false,
            source: None,
        }))
    }

    /// The backend's own error, which caused this one: the
    /// [`source`](std::error::Error::source), and part of the message.
    #[must_use]
    pub fn with_source(
        mut self,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        self.0.source = Some(source.into());
        self
    }

    /// Marks the error as a timeout (the backend did not answer in time), or
    /// not.
    #[must_use]
    pub fn with_timeout(mut self, timed_out: bool) -> Self {
        self.0.timed_out = timed_out;
        self
    }

    /// Whether the backend failed to answer in time (rather than answering
    /// with an error or refusing the connection).
    pub fn is_timeout(&self) -> bool {
        self.0.timed_out
    }
}

/// As the fields it holds, without the box.
impl fmt::Debug for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Backend {
            message,
            timed_out,
            source,
        } = &*self.0;
        f.debug_struct("BackendError")
            .field("message", message)
            .field("timed_out", timed_out)
            .field("source", source)
            .finish()
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0.source {
            Some(source) => write!(f, "{}: {source}", self.0.message),
            None => f.write_str(&self.0.message),
        }
    }
}

/// The backend's own error, if there was one (e.g. a `redis::RedisError`).
impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0
            .source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// `permits` must be at least 1.
#[inline]
pub(crate) fn check_permits(permits: u32) -> Result<(), Error> {
    if permits == 0 {
        Err(zero_permits())
    } else {
        Ok(())
    }
}

/// `Err` unless `cost` fits a limiter of `limits` limits: no count for a
/// limit it lacks, and (for a reservation, `reserving`) some count above 0.
pub(crate) fn check_cost(
    cost: &crate::core::Cost,
    limits: usize,
    reserving: bool,
) -> Result<(), Error> {
    if let Some(len) = cost.len().filter(|len| *len > limits) {
        return invalid(format!(
            "a cost of {len} counts for a limiter of {limits} limits"
        ));
    }
    if reserving && cost.is_zero(limits) {
        return invalid("a call must cost at least 1 permit of some limit (got none)");
    }
    Ok(())
}

/// `Err` unless a limiter with `count` limits has a limit `index`.
pub(crate) fn check_limit(index: usize, count: usize) -> Result<(), Error> {
    if index < count {
        Ok(())
    } else {
        invalid(format!(
            "no limit {index}: this limiter has {count} (counted from 0)"
        ))
    }
}

/// An [`Error::InvalidArgument`] saying `message`.
#[cold]
pub(crate) fn invalid<T>(message: impl Into<String>) -> Result<T, Error> {
    Err(Error::InvalidArgument(message.into()))
}

#[cold]
fn zero_permits() -> Error {
    Error::InvalidArgument("permits must be at least 1 (got 0)".to_owned())
}
