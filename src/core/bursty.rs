//! The bursty policy: stored permits are free.

use std::time::Duration;

use super::micros;

/// Stored permits cost nothing: an idle limiter lets its
/// `max_permits = max_burst × rate` stored permits go at once, and one request
/// more at the ticket, before falling back to the stable rate. An idle limiter
/// stores one permit per stable interval.
///
/// ```
/// # #[cfg(feature = "internals")] {
/// use std::time::Duration;
/// use paceline::core::Bursty;
///
/// let b = Bursty::new(Duration::from_secs(2));
/// assert_eq!(b.max_burst_micros, 2_000_000);
/// assert_eq!(Bursty::default().max_burst_micros, 1_000_000);
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bursty {
    /// How much idle time is remembered, in microseconds (capped at
    /// [`MAX_MICROS`](super::MAX_MICROS)).
    pub max_burst_micros: u64,
}

impl Bursty {
    /// Remembers at most `max_burst` of idle time.
    pub fn new(max_burst: Duration) -> Self {
        Bursty {
            max_burst_micros: micros(max_burst),
        }
    }

    /// `max_burst × rate`, kept finite; nothing is stored at an infinite rate
    /// (every request is free anyway).
    pub(super) fn max_permits(&self, permits_per_second: f64) -> f64 {
        if permits_per_second.is_infinite() {
            0.0
        } else {
            (self.max_burst_micros as f64 * permits_per_second / 1_000_000.0).min(f64::MAX)
        }
    }
}

impl Default for Bursty {
    /// One second of burst.
    fn default() -> Self {
        Bursty::new(Duration::from_secs(1))
    }
}
