//! Pacing calls to someone else's rate-limited API: costs settled once the
//! answer says what a call cost, and the upstream's limit learned from its
//! answers.
//!
//! A client that calls an upstream with limits of its own (requests and
//! tokens per minute, say) reserves each call's estimate with
//! [`RateLimiter::call`](crate::RateLimiter::call) (or
//! [`KeyedRateLimiter::call`](crate::KeyedRateLimiter::call), one key per
//! upstream), sends it once the [`Call`] is returned, then feeds the answer
//! back ([`Call::learn`], with the [`Feedback`] read from its status and
//! headers) and settles its real cost ([`Call::settle`]).
//!
//! [`Feedback`] reads the status, `Retry-After`, the IETF
//! `RateLimit-Policy` and `RateLimit` headers (and their older forms) and
//! the common `X-RateLimit-*` headers. What the limiter does with it is
//! [`Learning`]'s policy:
//!
//! * a refusal (429, or 503 with `Retry-After`) pauses every caller of the
//!   limiter until its `Retry-After`, and multiplies its rates by 0.7 (once
//!   per pause, down to 0.05 of the configured rates); after the pause the
//!   callers go one interval apart at the lowered rate, never as a burst;
//! * each second of successes after the pause adds back 0.05 of the
//!   configured rates, up to them;
//! * a rate the upstream reports for a limit (a quota over its window)
//!   caps that limit at 0.97 of it, never above the configured rate; a
//!   limit it reports spent (`remaining` 0) waits for its reset.
//!
//! The upstream's names for its limits (`requests`, `tokens`) reach the
//! limits [named](crate::Limit::named) so; what it reports without a name
//! reaches the first unnamed limit. Through Redis, what a limiter learns
//! lives in the key it shares: one refusal seen by one worker slows the
//! whole fleet, and a new worker starts at the learned rate.

mod call;
mod feedback;
#[cfg(feature = "http")]
mod layer;
mod lesson;

pub use crate::core::Learning;
pub use call::Call;
pub use feedback::{Feedback, Quota};
#[cfg(feature = "http")]
pub use layer::{Actual, Estimate, Estimated, Outbound, OutboundFuture, OutboundLayer, Unit};

/// What a limiter knows of the upstream it paces calls to: how it learns,
/// and which of its limits each of the upstream's is.
#[derive(Debug, Clone, Default)]
pub(crate) struct Upstream {
    pub(crate) learning: Learning,
    /// Each limit's name, in order, to match the names the upstream gives
    /// its limits (`None`: unnamed).
    pub(crate) names: Box<[Option<Box<str>>]>,
}
