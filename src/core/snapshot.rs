//! What a limiter holds at one moment, read without reserving: [`Snapshot`].

use std::time::Duration;

use super::word::{self, Config};
use super::{Limits, MAX_MICROS, Policy, State};

/// What a limiter (or one key of it) holds at one moment, read without
/// reserving anything: its rate and burst, its stored permits and its debt. It
/// answers what a client is told: how many requests would go now
/// ([`remaining`](Self::remaining)), how long until one would
/// ([`wait`](Self::wait)) or until `n` would ([`wait_for`](Self::wait_for)),
/// and how long until the limiter is full again ([`full_in`](Self::full_in)).
///
/// Every limiter reads one with `snapshot()`: the local ones at once, a Redis
/// limiter in one round trip, on the server's clock.
///
/// With several limits, a snapshot is of the limit that binds now (see
/// [`limit`](Self::limit)): its rate, burst and stored permits; what it
/// says of time and requests ([`remaining`](Self::remaining),
/// [`wait`](Self::wait), [`wait_for`](Self::wait_for),
/// [`full_in`](Self::full_in)) is the limiter's, every limit counted.
///
/// ```
/// use std::time::Duration;
/// use paceline::RateLimiter;
/// use paceline::clock::FakeClock;
///
/// // 10 per second, half a second (5 permits) stored: a burst of 6, idle.
/// let clock = FakeClock::new();
/// let limiter = RateLimiter::builder()
///     .permits_per_second(10.0)
///     .max_burst(Duration::from_millis(500))
///     .clock(clock.clone())
///     .build()?;
/// clock.advance(Duration::from_secs(1));
/// let now = limiter.snapshot()?;
/// assert_eq!((now.remaining(), now.burst(), now.wait()), (6, 6, Duration::ZERO));
///
/// // Six requests go at once; the next one would wait 100 ms.
/// for _ in 0..6 {
///     assert!(limiter.try_reserve(1, Duration::ZERO)?.is_some());
/// }
/// let now = limiter.snapshot()?;
/// assert_eq!((now.remaining(), now.wait()), (0, Duration::from_millis(100)));
/// assert_eq!(now.wait_for(3), Some(Duration::from_millis(300)));
/// assert_eq!(now.full_in(), Duration::from_millis(600));
/// # Ok::<(), paceline::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    rate: f64,
    max_stored: f64,
    stored: f64,
    wait_micros: u64,
    bursty: bool,
    /// Idle time per stored permit, µs.
    cool_down_micros: f64,
    limit: usize,
    /// With several limits, every limit's snapshot (this one's among
    /// them): what `wait_for` and `full_in` count.
    all: Option<std::sync::Arc<[Snapshot]>>,
}

impl Snapshot {
    /// The snapshot of `state` at `now_micros` (resynced on a copy); `limit`
    /// is its index.
    pub(crate) fn of(state: &State, now_micros: u64, limit: usize) -> Snapshot {
        let mut state = state.clone();
        state.resync(now_micros);
        Snapshot {
            rate: state.permits_per_second,
            max_stored: state.max_permits,
            stored: state.stored_permits,
            wait_micros: state.next_free_micros.saturating_sub(now_micros),
            bursty: matches!(state.policy, Policy::Bursty(_)),
            cool_down_micros: state
                .policy
                .cool_down_interval_micros(state.stable_interval_micros, state.max_permits),
            limit,
            all: None,
        }
    }

    /// The snapshot of the state `word` (not mutex mode) stands for at
    /// `now_micros`, under `config`, the configuration of `template`.
    pub(crate) fn of_word(
        word: u64,
        now_micros: u64,
        config: &Config,
        template: &State,
    ) -> Snapshot {
        let mut state = template.clone();
        word::decode_into(word, now_micros, config, &mut state);
        Snapshot::of(&state, now_micros, 0)
    }

    /// The snapshot of several limits at `now_micros`: the one that binds now
    /// ([`binding`]), whose [`remaining`](Self::remaining) and
    /// [`wait`](Self::wait) are those of all the limits together.
    ///
    /// [`binding`]: Self::binding
    pub(crate) fn of_limits(limits: &Limits, now_micros: u64) -> Snapshot {
        Snapshot::binding(
            limits
                .states()
                .iter()
                .enumerate()
                .map(|(i, state)| Snapshot::of(state, now_micros, i)),
        )
        .expect("limits are never empty")
    }

    /// Of several limits' snapshots, the one that binds: the fewest requests
    /// remaining, then the longest wait, then the longest until full (with
    /// every limit's, for what it says of time); `None` if there are none.
    pub(crate) fn binding(snapshots: impl IntoIterator<Item = Snapshot>) -> Option<Snapshot> {
        let mut snapshots = snapshots.into_iter();
        let first = snapshots.next()?;
        let Some(second) = snapshots.next() else {
            return Some(first);
        };
        let all: std::sync::Arc<[Snapshot]> =
            [first, second].into_iter().chain(snapshots).collect();
        let mut binding = all
            .iter()
            .min_by(|a, b| {
                a.remaining()
                    .cmp(&b.remaining())
                    .then(b.wait_micros.cmp(&a.wait_micros))
                    .then(b.full_in().cmp(&a.full_in()))
            })?
            .clone();
        binding.all = Some(all);
        Some(binding)
    }

    /// The snapshot as it reads `elapsed` later if nothing is reserved
    /// meanwhile: the wait that much shorter, the idle time past it
    /// stored (a request answered after it waited reads its state then).
    #[cfg(feature = "http")]
    pub(crate) fn aged(&self, elapsed: Duration) -> Snapshot {
        let elapsed = super::micros(elapsed);
        let age = |one: &Snapshot| {
            let idle = elapsed.saturating_sub(one.wait_micros) as f64;
            let stored = match one.cool_down_micros > 0.0 {
                true => one.stored + idle / one.cool_down_micros,
                false => one.max_stored,
            };
            Snapshot {
                wait_micros: one.wait_micros.saturating_sub(elapsed),
                stored: stored.min(one.max_stored),
                all: None,
                ..one.clone()
            }
        };
        let mut aged = age(self);
        aged.all = self.all.as_ref().map(|all| all.iter().map(age).collect());
        aged
    }

    /// Each limit's snapshot: this one, or every one of several.
    fn each(&self) -> &[Snapshot] {
        self.all.as_deref().unwrap_or(std::slice::from_ref(self))
    }

    /// What a limiter that knows only its wait and its rate can tell, for a
    /// [`Limiter`](crate::Limiter) written outside this crate: nothing stored,
    /// no burst. A rate that is none (zero, negative, NaN) reads as the
    /// slowest there is, never as no limit (`f64::INFINITY` is that).
    ///
    /// ```
    /// use std::time::Duration;
    /// use paceline::Snapshot;
    ///
    /// let snapshot = Snapshot::waiting(Duration::from_millis(300), 10.0);
    /// assert_eq!((snapshot.wait(), snapshot.remaining()), (Duration::from_millis(300), 0));
    /// // No rate: the slowest there is, a permit in about 285 years.
    /// let none = Snapshot::waiting(Duration::ZERO, f64::NAN);
    /// assert!(none.rate() > 0.0 && none.rate() < 1e-9);
    /// ```
    pub fn waiting(wait: Duration, permits_per_second: f64) -> Snapshot {
        // `!(> 0)` so that NaN is none too.
        let rate = if permits_per_second > 0.0 {
            permits_per_second
        } else {
            1e6 / MAX_MICROS as f64
        };
        Snapshot {
            rate,
            max_stored: 0.0,
            stored: 0.0,
            wait_micros: super::micros(wait),
            bursty: true,
            cool_down_micros: super::stable_interval_micros(permits_per_second)
                .unwrap_or(MAX_MICROS as f64),
            limit: 0,
            all: None,
        }
    }

    /// The stable rate, in permits per second.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Permits stored now (saved while idle): up to the burst past the one
    /// request that goes when nothing is owed (bursty), or the permits of a
    /// cold limiter (warming-up).
    pub fn stored(&self) -> f64 {
        self.stored
    }

    /// How long a request made now would wait (zero: it would go now).
    pub fn wait(&self) -> Duration {
        Duration::from_micros(self.wait_micros)
    }

    /// With several limits, which one this is (from 0, in the order they were
    /// given); 0 with one.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// How many requests of one permit would go now, one after another,
    /// without waiting: none while something is owed; otherwise one per whole
    /// stored permit and one more (bursty), or one (warming-up, where a stored
    /// permit costs time); `u64::MAX` at an infinite rate.
    ///
    /// Waits are whole microseconds: a request goes at once while what is
    /// owed before it is under one. Up to 10^6 per second this counts that
    /// in (one more where what the stored count's fraction lacks of a whole
    /// permit costs under a microsecond, as the limiter charges it).
    /// Above, where a permit costs under a microsecond, a few more go than
    /// this says.
    pub fn remaining(&self) -> u64 {
        if self.wait_micros > 0 {
            0
        } else {
            self.at_most(self.stored)
        }
    }

    /// How many requests of one permit a full, idle limiter lets through at
    /// once: [`remaining`](Self::remaining) when [`stored`](Self::stored) is
    /// at its most (with several limits, this limit's).
    pub fn burst(&self) -> u64 {
        self.at_most(self.max_stored)
    }

    /// How many requests of one permit go at once with `stored` permits and
    /// nothing owed.
    fn at_most(&self, stored: f64) -> u64 {
        if self.cool_down_micros == 0.0 {
            u64::MAX
        } else if self.bursty && self.cool_down_micros >= 1.0 {
            // Those whose debt before them is under a microsecond: one per
            // whole stored permit and the one the ticket lets go, then one
            // more if what the stored fraction lacks of a whole permit
            // costs under a microsecond, as the ticket charges it (to the
            // nearest 2^-20 µs: `State::charge`), not as the exact sum says
            // (at 400 000/s with 2.6 stored, `2.6 + 0.4` reads a hair over
            // 3, where the fourth owes a whole microsecond). Saturating: a
            // stored count past u64 is all of them.
            let whole = stored.floor();
            let owed = (1.0 - (stored - whole)) * self.cool_down_micros;
            let more = owed * super::FRACTION_ONE as f64 + 0.5 < super::FRACTION_ONE as f64;
            (whole as u64).saturating_add(1 + u64::from(more))
        } else if self.bursty {
            (stored.floor() as u64).saturating_add(1)
        } else {
            1
        }
    }

    /// How long until `requests` requests of one permit would all go at once
    /// ([`remaining`](Self::remaining) reaching `requests`) if nothing else is
    /// reserved meanwhile; `None` if they never would (more than
    /// [`burst`](Self::burst), or, with several limits, than any limit's).
    /// Zero requests: zero.
    pub fn wait_for(&self, requests: u64) -> Option<Duration> {
        self.each().iter().try_fold(Duration::ZERO, |most, one| {
            Some(most.max(one.wait_for_one(requests)?))
        })
    }

    /// [`wait_for`](Self::wait_for) of this limit alone.
    fn wait_for_one(&self, requests: u64) -> Option<Duration> {
        if requests == 0 {
            return Some(Duration::ZERO);
        }
        if requests > self.burst() {
            return None;
        }
        if requests <= self.remaining() {
            return Some(Duration::ZERO);
        }
        // Stored permits needed past the one the ticket lets go: one per
        // cool-down after the debt.
        let missing = if self.bursty {
            ((requests - 1) as f64 - self.stored).max(0.0)
        } else {
            0.0
        };
        Some(self.after_debt(missing))
    }

    /// How long until the limiter is full again (nothing owed, every permit it
    /// can store stored: with several limits, every limit), if nothing is
    /// reserved meanwhile.
    pub fn full_in(&self) -> Duration {
        let full_in = |one: &Snapshot| one.after_debt((one.max_stored - one.stored).max(0.0));
        self.each().iter().map(full_in).max().unwrap_or_default()
    }

    /// The wait, then `permits` more cool-downs, rounded up to the µs.
    fn after_debt(&self, permits: f64) -> Duration {
        let idle = super::to_micros((permits * self.cool_down_micros).ceil());
        Duration::from_micros(self.wait_micros.saturating_add(idle).min(MAX_MICROS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Bursty, WarmingUp};

    fn bursty(rate: f64, burst_ms: u64) -> State {
        State::new(
            Policy::Bursty(Bursty::new(Duration::from_millis(burst_ms))),
            rate,
            0,
        )
        .unwrap()
    }

    /// Counts the requests of one permit a copy of `state` grants at `now`
    /// with no wait.
    fn granted_at_once(state: &State, now: u64) -> u64 {
        let mut state = state.clone();
        let mut n = 0;
        while state.try_reserve(1, now, 0).is_some() {
            n += 1;
            if n > 10_000 {
                break;
            }
        }
        n
    }

    #[test]
    fn remaining_is_what_tries_at_once_are_granted() {
        for (rate, burst_ms) in [(10.0, 0), (10.0, 1_000), (3.0, 2_500), (1000.0, 7)] {
            let mut state = bursty(rate, burst_ms);
            for step in 0..60u64 {
                let now = step * 37_000;
                let snapshot = Snapshot::of(&state, now, 0);
                assert_eq!(
                    snapshot.remaining(),
                    granted_at_once(&state, now),
                    "rate {rate} burst {burst_ms} ms at {now}"
                );
                assert!(snapshot.remaining() <= snapshot.burst());
                // Use some of it.
                for _ in 0..step % 4 {
                    state.reserve(1, now);
                }
            }
        }
        let warm = State::new(
            Policy::WarmingUp(WarmingUp::new(Duration::from_secs(1), 3.0)),
            10.0,
            0,
        )
        .unwrap();
        let snapshot = Snapshot::of(&warm, 5_000_000, 0);
        assert_eq!(snapshot.remaining(), granted_at_once(&warm, 5_000_000));
        assert_eq!((snapshot.remaining(), snapshot.burst()), (1, 1));
    }

    #[test]
    fn remaining_is_what_tries_at_once_are_granted_at_a_microsecond_a_permit_or_less() {
        // Between 10^5 and 10^6 a second the last request that goes at once
        // owes under a microsecond, as the ticket charges it: at 400 000/s
        // with 2.6 stored, remaining read 4 where 3 went (`2.6 + 0.4` is a
        // hair over 3 in floating point; the fourth owes a whole µs).
        let mut wrong = Vec::new();
        for rate in [1e5, 3.3e5, 4e5, 5e5, 654_321.0, 777_777.0, 999_999.0, 1e6] {
            for burst_us in [0, 1, 3, 13, 50] {
                let burst = Bursty::new(Duration::from_micros(burst_us));
                let mut state = State::new(Policy::Bursty(burst), rate, 0).unwrap();
                let mut now = 0;
                for step in 0..300u64 {
                    now += step % 7;
                    let snapshot = Snapshot::of(&state, now, 0);
                    let granted = granted_at_once(&state, now);
                    if snapshot.remaining() != granted {
                        wrong.push((rate, burst_us, now, snapshot.remaining(), granted));
                    }
                    for n in 1..=snapshot.remaining() {
                        assert_eq!(snapshot.wait_for(n), Some(Duration::ZERO));
                    }
                    for _ in 0..step % 3 {
                        state.reserve(1, now);
                    }
                }
            }
        }
        assert_eq!(wrong, [], "(rate, burst µs, now, remaining, granted)");
    }

    #[test]
    fn wait_for_is_when_that_many_go_at_once() {
        let mut state = bursty(10.0, 1_000);
        state.reserve(1, 0); // 100 ms owed
        let snapshot = Snapshot::of(&state, 0, 0);
        assert_eq!(snapshot.remaining(), 0);
        assert_eq!(snapshot.wait_for(1), Some(Duration::from_millis(100)));
        assert_eq!(snapshot.wait_for(4), Some(Duration::from_millis(400)));
        assert_eq!(snapshot.wait_for(11), Some(Duration::from_millis(1_100)));
        assert_eq!(snapshot.wait_for(12), None);
        assert_eq!(snapshot.full_in(), Duration::from_millis(1_100));
        // At each of those moments, that many go at once.
        for n in 1..=11u64 {
            let at = super::super::micros(snapshot.wait_for(n).unwrap());
            assert!(granted_at_once(&state, at) >= n, "{n}");
            assert!(granted_at_once(&state, at - 1) < n, "{n}");
        }
    }

    #[test]
    fn an_infinite_rate_has_no_end() {
        let state = bursty(f64::INFINITY, 1_000);
        let snapshot = Snapshot::of(&state, 7, 0);
        assert_eq!(
            (snapshot.remaining(), snapshot.burst()),
            (u64::MAX, u64::MAX)
        );
        assert_eq!(snapshot.full_in(), Duration::ZERO);
    }

    #[test]
    fn a_waiting_snapshot_at_a_rate_that_is_none_is_not_unlimited() {
        for rate in [0.0, -1.0, f64::NAN, f64::NEG_INFINITY] {
            let snapshot = Snapshot::waiting(Duration::ZERO, rate);
            assert_eq!((snapshot.remaining(), snapshot.burst()), (1, 1), "{rate}");
            let owing = Snapshot::waiting(Duration::from_secs(1), rate);
            assert_eq!(owing.remaining(), 0, "{rate}");
        }
        let unlimited = Snapshot::waiting(Duration::ZERO, f64::INFINITY);
        assert_eq!(unlimited.remaining(), u64::MAX);
    }

    #[test]
    fn several_limits_read_as_the_binding_one() {
        let per_second = bursty(10.0, 1_000);
        let per_minute = bursty(3.0 / 60.0, 60_000);
        let mut limits = Limits::new(vec![per_second, per_minute]).unwrap();
        // One request each remains; the per-minute limit is the longer to
        // fill.
        let first = Snapshot::of_limits(&limits, 0);
        assert_eq!((first.remaining(), first.limit()), (1, 1));
        limits.reserve(1, 0, false);
        let after = Snapshot::of_limits(&limits, 0);
        // The per-minute limit owes 20 s: nothing remains, and it says so.
        assert_eq!((after.remaining(), after.limit()), (0, 1));
        assert_eq!(after.wait(), Duration::from_secs(20));
    }
}
