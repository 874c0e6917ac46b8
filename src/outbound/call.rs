//! [`Call`]: one call to an upstream, its cost settled and its answer learned
//! from once it is back.

use std::fmt;
use std::time::Duration;

use super::{Feedback, Slot, Upstream};
use crate::Error;
use crate::clock::Clock;
use crate::core::{Cost, micros};
use crate::error::check_cost;
use crate::reservation::GiveBack;

/// One call to an upstream, made once its limiter's wait has passed: what
/// [`RateLimiter::call`](crate::RateLimiter::call) and
/// [`KeyedRateLimiter::call`](crate::KeyedRateLimiter::call) return.
///
/// It was charged its estimate, and holds its slot with a
/// [`Limit::concurrent`](crate::Limit::concurrent). Once the answer is back,
/// [`finish`](Call::finish) settles its real cost in place of the estimate
/// and feeds the answer to the limiter; [`settle`](Call::settle) and
/// [`learn`](Call::learn) do each alone (learn from the headers while the
/// body streams, settle once it has ended). Drop the call to end it at its
/// estimate, its slot free at once.
///
/// ```
/// use paceline::{Cost, Limit, RateLimiter};
/// use paceline::clock::FakeClock;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), paceline::Error> {
/// // 10 requests and 1 000 tokens per second, no burst.
/// let limiter = RateLimiter::builder()
///     .limit(Limit::per_second(10.0).burst(1))
///     .limit(Limit::per_second(1_000.0).burst(1))
///     .clock(FakeClock::new())
///     .build()?;
/// let call = limiter.call(Cost::each([1, 800])).await?;
/// // ... send the request; the answer says it used 200 tokens.
/// call.settle(Cost::each([1, 200]))?;
/// // The next call waits for 200 tokens at 1 000/s, not 800.
/// let next = limiter.call(Cost::each([1, 100])).await?;
/// assert_eq!(next.waited().as_millis(), 200);
/// # Ok(()) }
/// ```
#[must_use = "a call ends as soon as it is dropped: keep it until its answer is back"]
pub struct Call<'a> {
    pub(crate) waited: Duration,
    /// When it went, on its limiter's clock: a refusal of a call that
    /// went before the last pause ended lowers nothing.
    pub(crate) went: Duration,
    pub(crate) clock: &'a dyn Clock,
    pub(crate) pending: Option<GiveBack<'a>>,
    pub(crate) charged: Cost,
    pub(crate) limits: usize,
    pub(crate) upstream: &'a Upstream,
    /// Its slot, with a concurrent limit: given back after the rest.
    pub(crate) _slot: Slot<'a>,
}

impl<'a> Call<'a> {
    /// How long the call waited for its limiter before it could go: for a slot
    /// (with [`Limit::concurrent`](crate::Limit::concurrent)), then for its
    /// place in the schedule.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// What the call was charged: its estimate.
    pub fn estimate(&self) -> &Cost {
        &self.charged
    }

    /// Replaces the estimate with what the call really cost (0 is a cost: a
    /// call that failed at once), and ends the call. Through Redis the change
    /// is sent in the background.
    ///
    /// Exact while the limiter's log still holds the call (every request since
    /// the oldest call still open, up to 1 024 in this process and 128 per key
    /// in Redis, until a rate change, a pause or a learned rate empties it;
    /// a learned `remaining` is logged in its place, and leaves it exact):
    /// the limiter then holds what it would had the call reserved `actual`.
    /// After that, what `actual` counts past the estimate is charged at once
    /// (later callers wait for it), and what it counts less is not given back,
    /// erring towards limiting.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `actual` counts for a limit the limiter
    /// lacks; the call then ends at its estimate.
    pub fn settle(self, actual: impl Into<Cost>) -> Result<(), Error> {
        let actual = actual.into();
        check_cost(&actual, self.limits, false)?;
        if let Some(pending) = &self.pending {
            pending.owner.settle(&pending.taken, &self.charged, &actual);
        }
        Ok(())
    }

    /// Settles the call at `actual` (as [`settle`](Self::settle)), then
    /// learns from the upstream's answer (as [`learn`](Self::learn)): in
    /// this order, a refusal's pause, which empties the limiter's log,
    /// comes after the settle, which is then exact. So a refused call that
    /// cost nothing (`Cost::each([1, 0])` for a request and its tokens)
    /// gives its estimate back, where [`learn`](Self::learn) and then
    /// [`settle`](Self::settle) would leave it owed behind the pause.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `actual` counts for a limit the
    /// limiter lacks; the call then ends at its estimate, and the answer
    /// is learned from all the same.
    pub fn finish(self, feedback: &Feedback, actual: impl Into<Cost>) -> Result<(), Error> {
        let actual = actual.into();
        let checked = check_cost(&actual, self.limits, false);
        if let (Ok(()), Some(pending)) = (&checked, &self.pending) {
            pending.owner.settle(&pending.taken, &self.charged, &actual);
        }
        self.learn(feedback);
        checked
    }

    /// Feeds the upstream's answer to this call back to the limiter (of the
    /// key, on a keyed one), which learns from it for every caller as
    /// [`outbound`](crate::outbound) tells. Through Redis it is sent in the
    /// background. A refusal pauses the limiter and empties its log, so a
    /// [`settle`](Self::settle) after it gives nothing back: with the
    /// answer's cost known, [`finish`](Self::finish) settles first.
    pub fn learn(&self, feedback: &Feedback) {
        if let Some(pending) = &self.pending {
            let (mut lesson, learning) = self.upstream.lesson(feedback);
            lesson.sent_ago_micros = Some(micros(self.clock.now().saturating_sub(self.went)));
            pending.owner.metrics().upstream_answered(lesson.throttled);
            pending.owner.learn(&pending.taken, &lesson, &learning);
        }
    }
}

impl Call<'_> {
    /// Its request goes now: what [`learn`](Self::learn) tells the limiter
    /// of when it went counts from here. For a caller that sends later than
    /// the call was returned (the outbound layer, whose client is made ready
    /// again after the wait), so that a refusal of a request sent after a
    /// pause ended counts as the new one it is.
    #[cfg(feature = "http")]
    pub(crate) fn sending(&mut self) {
        self.went = self.clock.now();
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        if let Some(pending) = self.pending.take() {
            pending.owner.keep(pending.taken);
        }
    }
}

impl fmt::Debug for Call<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Call")
            .field("waited", &self.waited)
            .field("estimate", &self.charged)
            .finish_non_exhaustive()
    }
}
