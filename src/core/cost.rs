//! [`Cost`]: what one request counts against each limit.

use std::fmt;

/// What one request counts against each of a limiter's limits: the same
/// number of permits for every limit (from a plain `u32`), or
/// a number per limit ([`Cost::each`]) when the limits count different
/// things, such as requests and tokens. A request waits for every limit,
/// those it counts 0 against included: 0 charges a limit nothing, and the
/// request still goes only once what that limit owes is paid for (so a
/// call whose tokens only its answer tells, estimated at 0 and
/// [settled](crate::outbound::Call::settle) after, goes once the tokens of
/// the calls before it are).
///
/// ```
/// use paceline::Cost;
///
/// // One request and about 800 tokens, against "3 500 requests a minute"
/// // (the first limit) and "90 000 tokens a minute" (the second).
/// let estimate = Cost::each([1, 800]);
/// assert_eq!((estimate.get(0), estimate.get(1), estimate.get(2)), (1, 800, 0));
/// // The same count for every limit.
/// assert_eq!(Cost::from(3).get(1), 3);
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Cost(Repr);

#[derive(Clone, PartialEq, Eq, Hash)]
enum Repr {
    Same(u32),
    Each(Box<[u32]>),
}

impl Cost {
    /// `permits` for every limit.
    #[inline]
    pub(crate) const fn new(permits: u32) -> Cost {
        Cost(Repr::Same(permits))
    }

    /// One count per limit, in the order the limiter was given its limits
    /// (see [`Builder::limit`](crate::Builder::limit)); a limit past the
    /// end counts 0.
    pub fn each(counts: impl IntoIterator<Item = u32>) -> Cost {
        Cost(Repr::Each(counts.into_iter().collect()))
    }

    /// What this cost counts against limit `limit` (from 0).
    #[inline(always)]
    pub fn get(&self, limit: usize) -> u32 {
        match &self.0 {
            Repr::Same(permits) => *permits,
            Repr::Each(counts) => counts.get(limit).copied().unwrap_or(0),
        }
    }

    /// How many counts it was given: `None` for the same count everywhere.
    pub(crate) fn len(&self) -> Option<usize> {
        match &self.0 {
            Repr::Same(_) => None,
            Repr::Each(counts) => Some(counts.len()),
        }
    }

    /// Whether it counts nothing against any of `limits` limits.
    pub(crate) fn is_zero(&self, limits: usize) -> bool {
        (0..limits).all(|i| self.get(i) == 0)
    }

    /// Per limit of `limits`, what `self` counts past `other` (0 where it
    /// counts no more).
    pub(crate) fn more_than(&self, other: &Cost, limits: usize) -> Cost {
        Cost::each((0..limits).map(|i| self.get(i).saturating_sub(other.get(i))))
    }
}

impl Default for Cost {
    /// One permit for every limit.
    fn default() -> Self {
        Cost::new(1)
    }
}

impl From<u32> for Cost {
    #[inline]
    fn from(permits: u32) -> Cost {
        Cost::new(permits)
    }
}

impl<const N: usize> From<[u32; N]> for Cost {
    fn from(counts: [u32; N]) -> Cost {
        Cost::each(counts)
    }
}

impl From<&[u32]> for Cost {
    fn from(counts: &[u32]) -> Cost {
        Cost::each(counts.iter().copied())
    }
}

impl fmt::Debug for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Repr::Same(permits) => write!(f, "Cost({permits})"),
            Repr::Each(counts) => write!(f, "Cost({counts:?})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_limit_and_zero_past_the_end() {
        let cost = Cost::each([1, 800]);
        assert_eq!((cost.get(0), cost.get(1), cost.get(5)), (1, 800, 0));
        assert_eq!(cost.len(), Some(2));
        assert_eq!(Cost::new(4).get(9), 4);
        assert_eq!(Cost::new(4).len(), None);
        assert!(Cost::each([0, 0]).is_zero(3));
        assert!(!Cost::each([0, 1]).is_zero(2));
        assert!(Cost::each([0, 1]).is_zero(1));
    }

    #[test]
    fn more_than_counts_what_one_charges_past_the_other() {
        let more = Cost::each([2, 500]).more_than(&Cost::each([1, 800]), 2);
        assert_eq!((more.get(0), more.get(1)), (1, 0));
        let more = Cost::new(3).more_than(&Cost::each([1, 5]), 2);
        assert_eq!((more.get(0), more.get(1), more.get(2)), (2, 0, 0));
    }
}
