//! Pacing calls to someone else's rate-limited API: costs settled once the
//! answer says what a call cost, and the upstream's limit learned from its
//! answers.
//!
//! A client that calls an upstream with limits of its own (requests and
//! tokens per minute, say) reserves each call's estimate with
//! [`RateLimiter::call`](crate::RateLimiter::call) (or
//! [`KeyedRateLimiter::call`](crate::KeyedRateLimiter::call), one limiter
//! per upstream), sends it once the [`Call`] is returned, then settles
//! its real cost and feeds the answer back.

mod call;

pub use crate::core::Learning;
pub use call::Call;

/// What a limiter knows of the upstream it paces calls to: how it learns,
/// and which of its limits each of the upstream's is.
#[derive(Debug, Clone, Default)]
pub(crate) struct Upstream {
    pub(crate) learning: Learning,
    /// Each limit's name, in order, to match the names the upstream gives
    /// its limits (`None`: the unnamed one, for the first limit). (Read
    /// once answers are digested into lessons.)
    #[allow(dead_code)]
    pub(crate) names: Box<[Option<Box<str>>]>,
}
