//! The crate's one error type.

use std::fmt;

/// Everything that can go wrong in this crate.
///
/// Being throttled is not an error: [`try_acquire`](crate::RateLimiter::try_acquire)
/// returns `Ok(false)` and [`try_reserve`](crate::RateLimiter::try_reserve)
/// returns `Ok(None)`. Errors are for bad input and broken backends.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// An argument or a configuration value is out of range: zero permits, a
    /// rate that is zero, negative or NaN, a cold factor below 1, options that
    /// contradict each other. The message says which and what was given.
    InvalidArgument(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument(message) => write!(f, "invalid argument: {message}"),
        }
    }
}

impl std::error::Error for Error {}

/// `permits` must be at least 1.
pub(crate) fn check_permits(permits: u32) -> Result<(), Error> {
    if permits == 0 {
        Err(Error::InvalidArgument(
            "permits must be at least 1 (got 0)".to_owned(),
        ))
    } else {
        Ok(())
    }
}
