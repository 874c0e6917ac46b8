//! Several limits that every request must satisfy together: [`Limits`].

use std::collections::VecDeque;

use super::learn::Learned;
use super::{Cost, InvalidRate, State};

/// How many requests [`Limits`] keeps in its log by default.
pub const LOG_CAPACITY: usize = 1024;

/// The most requests an empty log keeps room for: a longer log's memory
/// goes once it empties, so that limits held for long (a keyed limiter's
/// key) cost what they hold, not what their longest log took.
const LOG_ROOM_KEPT: usize = 16;

/// Several limits that every request must satisfy together: 10 per second with
/// a burst of 20 *and* 1 000 per hour, all or nothing.
///
/// # The rule
///
/// Each limit is a [`State`] of its own. A request at `now` goes at the
/// earliest moment every limit allows, `M = max(now, every ticket)`, and every
/// limit is charged *as if it had arrived at `M`*: each resyncs to `M`
/// (storing idle time up to then) and pushes its ticket from there. The wait
/// is `M − now`; the limit whose ticket set `M` bound it.
///
/// Charging at `M` rather than at `now` keeps every limit whole: a limit that
/// does not bind sees its requests arrive at `M`, in order, each of its
/// tickets at or before the next `M`, so it makes exactly the grants it would
/// make alone, at the same moments, and in no window grants more. (Charged at
/// `now`, a limit of 1 per second behind one in debt until `t = 5` s would let
/// five requests made at `0` through together at `5`, its tickets `0` to `4`
/// spent while nobody could use them.) With one limit, `M` is the core's own
/// moment.
///
/// A refused try charges no limit.
///
/// # Giving a reservation back, exactly
///
/// The log of the [module docs](super#giving-a-reservation-back) spans every
/// limit: a give-back replays the rest without the reservation, whichever
/// limit bound what, with the caps on what a limit stores that an
/// upstream's lessons put in between ([`learn`](Self::learn)), each at its
/// place.
///
/// Callers already waiting keep their moments. With bursty limits these are at
/// or after the replay's (removing a request never makes another earlier). A
/// warming-up limit that the replay leaves idle for longer goes colder, its
/// stored permits dearer, so a caller already waiting may hold a moment before
/// the replay's: it was granted by the limits as they were, and the replay
/// changes only what comes next.
///
/// ```
/// # #[cfg(feature = "internals")] {
/// use paceline::core::{Bursty, Limits, Policy, State};
///
/// // 10 per second storing up to 2 permits, and 3 per minute up to 3.
/// let per_second = State::new(Policy::Bursty(Bursty::new(std::time::Duration::from_millis(200))), 10.0, 0).unwrap();
/// let per_minute = State::new(Policy::Bursty(Bursty::new(std::time::Duration::from_secs(60))), 3.0 / 60.0, 0).unwrap();
/// let mut limits = Limits::new(vec![per_second, per_minute]).unwrap();
/// // Neither has stored anything yet: the first goes at once, then each
/// // request waits for the per-minute limit, which binds.
/// assert_eq!(limits.reserve(1, 0, false).wait_micros, 0);
/// let second = limits.reserve(1, 0, false);
/// assert_eq!((second.wait_micros, second.bound_by), (20_000_000, Some(1)));
/// // A try that would wait longer than its timeout charges neither limit.
/// assert_eq!(limits.try_reserve(1, 0, 1_000_000, false), None);
/// # }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    pub(super) states: Vec<State>,
    log: Log,
    /// What [`learn`](Limits::learn) learned from an upstream; `None` until it
    /// first does.
    pub(super) learned: Option<Box<Learned>>,
}

/// The give-back log; see [`Limits`].
#[derive(Debug, Clone, PartialEq, Default)]
struct Log {
    /// The states before the first logged request (empty with the log).
    base: Vec<State>,
    requests: VecDeque<Logged>,
    next_id: u64,
    capacity: usize,
}

#[derive(Debug, Clone, PartialEq)]
struct Logged {
    /// The id a held reservation was given; `None` for the others (and for
    /// a cap).
    id: Option<u64>,
    /// An open call's ([`Limits::open`]): it stays past its moment, until
    /// kept.
    open: bool,
    step: Step,
    now_micros: u64,
    /// The moment it was granted for: it leaves the log once this passes
    /// (a cap's: its now).
    moment_micros: u64,
}

/// What a logged entry does to the limits, replayed at its place.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    /// A request's cost, charged at the moment every limit allows it.
    Charge(Cost),
    /// What an upstream said is left of limit `limit`
    /// ([`Limits::learn`]): [`State::keep_stored_at_most`] at its now.
    Cap { limit: usize, permits: u64 },
}

/// A request granted by [`Limits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Granted {
    /// When its permits may be used.
    pub moment_micros: u64,
    /// `moment_micros − now`.
    pub wait_micros: u64,
    /// The limit (its index) that made it wait; `None` if it did not wait.
    pub bound_by: Option<usize>,
    /// What [`Limits::give_back`] and [`Limits::keep`] take, for a held
    /// reservation that waits.
    pub id: Option<u64>,
}

impl Limits {
    /// The limits, in the order [`Granted::bound_by`] counts them; `None` if
    /// there are none.
    pub fn new(states: Vec<State>) -> Option<Self> {
        Self::with_capacity(states, LOG_CAPACITY)
    }

    /// [`new`](Self::new), keeping at most `capacity` requests in the
    /// give-back log (at least 1).
    pub fn with_capacity(states: Vec<State>, capacity: usize) -> Option<Self> {
        (!states.is_empty()).then(|| Limits {
            states,
            log: Log {
                capacity: capacity.max(1),
                ..Log::default()
            },
            learned: None,
        })
    }

    /// The limits' states.
    pub fn states(&self) -> &[State] {
        &self.states
    }

    /// The limits' states, to load numbers held elsewhere (the lock-free
    /// word's, a keyed entry's): only while the log, which a change to the
    /// states would void, is empty.
    pub(crate) fn states_mut(&mut self) -> &mut [State] {
        debug_assert!(self.log_is_empty(), "the states change under a log");
        &mut self.states
    }

    /// Whether the log is empty: nothing can be given back.
    pub(crate) fn log_is_empty(&self) -> bool {
        self.log.requests.is_empty()
    }

    /// Whether the states alone are the whole of the limits (nothing logged,
    /// nothing learned): only such limits may be held as a word.
    pub(crate) fn is_plain(&self) -> bool {
        self.log.requests.is_empty() && self.learned.is_none()
    }

    /// The moment a request at `now_micros` would go, and the limit that would
    /// make it wait.
    #[cfg(any(test, feature = "internals"))]
    pub fn earliest(&self, now_micros: u64) -> (u64, Option<usize>) {
        earliest(&self.states, now_micros)
    }

    /// Reserves `permits` at `now_micros` ([the rule](Limits#the-rule)). A
    /// `held` reservation that has to wait gets an id to give it back with.
    #[cfg(any(test, feature = "internals"))]
    pub fn reserve(&mut self, permits: u32, now_micros: u64, held: bool) -> Granted {
        self.try_reserve(permits, now_micros, u64::MAX, held)
            .expect("every wait fits in u64::MAX")
    }

    /// [`reserve`](Self::reserve) if the wait fits in `timeout_micros`;
    /// `None`, charging nothing, otherwise.
    #[inline]
    pub fn try_reserve(
        &mut self,
        permits: u32,
        now_micros: u64,
        timeout_micros: u64,
        held: bool,
    ) -> Option<Granted> {
        let (moment, bound_by) = earliest(&self.states, now_micros);
        let hold = if held { Hold::Held } else { Hold::Plain };
        (moment - now_micros <= timeout_micros)
            .then(|| self.reserve_at(&Cost::new(permits), now_micros, moment, bound_by, hold))
    }

    /// Reserves `cost` at `now_micros` for an *open call*, as
    /// [`try_reserve`](Self::try_reserve) does a held one, but it always gets
    /// an id and stays in the log past its moment until [`keep`](Self::keep),
    /// so that [`settle`](Self::settle) can replace its cost with what the
    /// call turned out to cost. Until its moment it can be given back.
    pub fn open(&mut self, cost: &Cost, now_micros: u64, timeout_micros: u64) -> Option<Granted> {
        let (moment, bound_by) = earliest(&self.states, now_micros);
        (moment - now_micros <= timeout_micros)
            .then(|| self.reserve_at(cost, now_micros, moment, bound_by, Hold::Open))
    }

    /// Reserves at `moment`, which `earliest` gave for `now_micros`.
    #[inline]
    fn reserve_at(
        &mut self,
        cost: &Cost,
        now_micros: u64,
        moment: u64,
        bound_by: Option<usize>,
        hold: Hold,
    ) -> Granted {
        if !self.log.requests.is_empty() {
            self.expire(now_micros);
        }
        let logs = match hold {
            Hold::Plain => false,
            Hold::Held => moment > now_micros,
            Hold::Open => true,
        };
        let id = logs.then(|| {
            self.log.next_id += 1;
            self.log.next_id
        });
        if id.is_some() || !self.log.requests.is_empty() {
            let step = Step::Charge(cost.clone());
            self.log_request(id, hold == Hold::Open, step, now_micros, moment);
        }
        charge(&mut self.states, cost, moment);
        Granted {
            moment_micros: moment,
            wait_micros: moment - now_micros,
            bound_by,
            id,
        }
    }

    /// Logs a request about to be charged, or a cap about to be applied
    /// (only one with an id starts a log).
    fn log_request(
        &mut self,
        id: Option<u64>,
        open: bool,
        step: Step,
        now_micros: u64,
        moment: u64,
    ) {
        if self.log.requests.len() == self.log.capacity {
            // The oldest leaves and can no longer be given back, nor can what
            // follows it up to the next that can.
            self.fold_oldest();
            self.expire(now_micros);
        }
        if self.log.requests.is_empty() {
            if id.is_none() {
                return;
            }
            self.log.base.clone_from(&self.states);
        }
        self.log.requests.push_back(Logged {
            id,
            open,
            step,
            now_micros,
            moment_micros: moment,
        });
    }

    /// Keeps at most `permits` stored in limit `limit` at `now_micros`
    /// ([`State::keep_stored_at_most`]: what an upstream says is left, see
    /// [`learn`](Self::learn)). While the log holds anything the cap is
    /// logged too, an entry without an id, so that a give-back or a settle
    /// that replays the log caps at the same place: a replay from the base
    /// without it would undo a cap that took permits away, and miss one
    /// that took none at the time where a request given back leaves more
    /// stored.
    pub(super) fn keep_stored_at_most(&mut self, limit: usize, permits: u64, now_micros: u64) {
        if !self.log.requests.is_empty() {
            self.expire(now_micros);
            let step = Step::Cap { limit, permits };
            self.log_request(None, false, step, now_micros, now_micros);
        }
        self.states[limit].keep_stored_at_most(permits, now_micros);
    }

    /// Gives back the held reservation `id` at `now_micros`: the limits become
    /// what they would be had it never been made. `false`, changing nothing,
    /// if it can no longer be given back (its moment has passed, the log
    /// dropped it, a rate change came since, or it was given back).
    pub fn give_back(&mut self, id: u64, now_micros: u64) -> bool {
        self.expire(now_micros);
        // After a give-back a moment can fall behind an earlier one's, so a
        // request whose moment has passed may still sit in the log: it has
        // been used all the same.
        let Some(place) = self
            .log
            .requests
            .iter()
            .position(|r| r.id == Some(id) && r.moment_micros > now_micros)
        else {
            // An open call whose moment has passed was made: it is kept.
            self.keep(id, now_micros);
            return false;
        };
        self.log.requests.remove(place);
        self.replay();
        // What now heads the log may be what can no longer be given back.
        self.expire(now_micros);
        true
    }

    /// Settles the open call `id`, charged `charged` so far, at `actual` at
    /// `now_micros`, so that the limits hold what they would had it reserved
    /// `actual` in the first place.
    ///
    /// While the log holds the call this is exact (`true`): its cost is
    /// replaced and the log replayed. Once the log has let it go (it filled,
    /// or a rate changed), what `actual` charges past `charged` is charged
    /// now, as a request that does not wait (the next callers wait for it),
    /// and what it charges less is not given back (`false`): where the limiter
    /// sat idle since, that could let later callers in before the exact answer
    /// would. Either way the call stays open until [`keep`](Self::keep).
    pub fn settle(&mut self, id: u64, charged: &Cost, actual: &Cost, now_micros: u64) -> bool {
        self.expire(now_micros);
        if let Some(request) = self
            .log
            .requests
            .iter_mut()
            .find(|r| r.id == Some(id) && r.open)
        {
            request.step = Step::Charge(actual.clone());
            self.replay();
            return true;
        }
        let more = actual.more_than(charged, self.states.len());
        if !more.is_zero(self.states.len()) {
            let (moment, bound_by) = earliest(&self.states, now_micros);
            self.reserve_at(&more, now_micros, moment, bound_by, Hold::Plain);
        }
        false
    }

    /// Rebuilds the states from the log's base, replaying every logged
    /// request and cap.
    fn replay(&mut self) {
        self.states.clone_from(&self.log.base);
        for request in &self.log.requests {
            request.apply(&mut self.states);
        }
    }

    /// The held reservation `id` will not be given back (its permits are used,
    /// or it was committed): the log stops holding it open, and empties once
    /// nothing in it may be given back. `false` if the log no longer holds it.
    /// Changes no state.
    pub fn keep(&mut self, id: u64, now_micros: u64) -> bool {
        let Some(request) = self.log.requests.iter_mut().find(|r| r.id == Some(id)) else {
            return false;
        };
        request.id = None;
        request.open = false;
        self.expire(now_micros);
        true
    }

    /// [`State::resume`] for each limit, with its debt in `debts_micros` (a
    /// missing one is 0). The log empties: what waits gives nothing back
    /// (erring towards limiting).
    #[cfg(feature = "internals")]
    pub fn resume(&mut self, debts_micros: &[u64], now_micros: u64) {
        self.clear_log();
        for (i, state) in self.states.iter_mut().enumerate() {
            state.resume(debts_micros.get(i).copied().unwrap_or(0), now_micros);
        }
    }

    /// Changes the rate of limit `index` (every limit with `None`) at
    /// `now_micros`, as [`State::set_rate`]. A limit already at that rate is
    /// left as it is; if any changes, the log empties (its requests were
    /// charged at the old rates). Out-of-range indexes change nothing.
    pub fn set_rate(
        &mut self,
        index: Option<usize>,
        permits_per_second: f64,
        now_micros: u64,
    ) -> Result<(), InvalidRate> {
        super::stable_interval_micros(permits_per_second)?;
        let mut rates = self.ceilings();
        for (i, rate) in rates.iter_mut().enumerate() {
            if index.is_none_or(|index| index == i) {
                *rate = permits_per_second;
            }
        }
        self.set_rates(&rates, now_micros)
    }

    /// A limiter's `set_rate`, from its shape (the rates it keeps as last
    /// given one by one; see [`Shape`]): the first limit's rate becomes
    /// `permits_per_second`, exactly, and the others are scaled by as much,
    /// keeping their proportions; if that is not a valid rate for some
    /// limit (scaled to zero or NaN, or a finite rate scaled to infinity),
    /// every limit gets `permits_per_second`. Otherwise as
    /// [`set_rate`](Self::set_rate); an invalid rate changes nothing.
    pub fn set_first_rate(
        &mut self,
        shape: &[f64],
        permits_per_second: f64,
        now_micros: u64,
    ) -> Result<(), InvalidRate> {
        match shape {
            [_] => self.set_rate(None, permits_per_second, now_micros),
            [] => Ok(()),
            rates => {
                super::stable_interval_micros(permits_per_second)?;
                let rates = first_rate_scaled(rates, permits_per_second);
                self.set_rates(&rates, now_micros)
            }
        }
    }

    /// Sets each limit's rate (all valid) to `rates` at `now_micros`, as
    /// [`set_rate`](Self::set_rate) does one. A keyed limiter applies one
    /// change to every key so, all its keys being at the same rates.
    pub(crate) fn set_rates(&mut self, rates: &[f64], now_micros: u64) -> Result<(), InvalidRate> {
        let rates = self.learned_rates(rates);
        self.apply_rates(&rates, now_micros)
    }

    /// [`set_rates`](Self::set_rates) as given, leaving learning's ceilings
    /// unchanged.
    pub(super) fn apply_rates(
        &mut self,
        rates: &[f64],
        now_micros: u64,
    ) -> Result<(), InvalidRate> {
        let changes = |(state, rate): (&State, &f64)| state.permits_per_second != *rate;
        if !self.states.iter().zip(rates).any(changes) {
            return Ok(());
        }
        self.clear_log();
        for (state, &rate) in self.states.iter_mut().zip(rates) {
            if state.permits_per_second != rate {
                state.set_rate(rate, now_micros)?;
            }
        }
        Ok(())
    }

    /// Whether every limit reads as full at `now_micros` (no debt, every
    /// permit it can store stored) and nothing can be given back: the state a
    /// key never seen starts in, so a keyed limiter can forget it.
    pub fn reads_as_full(&self, now_micros: u64) -> bool {
        self.log.requests.is_empty()
            && self
                .states
                .iter()
                .all(|state| state.reads_as_full(now_micros))
    }

    /// When every limit reads as full if nothing more is reserved (µs): the
    /// order in which a keyed limiter at its cap forgets keys, those that
    /// lose the least first.
    pub(crate) fn full_at(&self) -> u64 {
        self.states.iter().map(State::full_at).max().unwrap_or(0)
    }

    /// The latest ticket of any limit: when the limits were last used, to
    /// choose which to forget.
    pub(crate) fn last_used(&self) -> u64 {
        self.states
            .iter()
            .map(|s| s.next_free_micros)
            .max()
            .unwrap_or(0)
    }

    /// Takes off the head of the log the requests that can no longer be given
    /// back at `now_micros` (moment passed, or no id), up to the first that
    /// still can. Every call does it first; a caller sees no change (a keyed
    /// limiter's sweep does it to find what it may drop).
    pub(crate) fn expire(&mut self, now_micros: u64) {
        while self
            .log
            .requests
            .front()
            .is_some_and(|r| r.id.is_none() || (!r.open && r.moment_micros <= now_micros))
        {
            self.fold_oldest();
        }
        self.forget_if_empty();
    }

    /// Applies the oldest logged request (or cap) to the saved states and
    /// drops it.
    fn fold_oldest(&mut self) {
        if let Some(request) = self.log.requests.pop_front() {
            request.apply(&mut self.log.base);
        }
    }

    /// Empties the log: what it held can no longer be given back. Also undoes
    /// a request that started the log (the local limiter's attempt whose
    /// compare-and-swap lost).
    pub(crate) fn clear_log(&mut self) {
        self.log.requests.clear();
        self.forget_if_empty();
    }

    fn forget_if_empty(&mut self) {
        if self.log.requests.is_empty() {
            self.log.base.clear();
            if self.log.requests.capacity() > LOG_ROOM_KEPT {
                self.log.requests = VecDeque::new();
            }
        }
    }
}

impl Logged {
    /// Applies it to `states` as it was applied to the limits: a request
    /// charged at the moment they allow it at its now, a cap at its now.
    fn apply(&self, states: &mut [State]) {
        match &self.step {
            Step::Charge(cost) => {
                let (moment, _) = earliest(states, self.now_micros);
                charge(states, cost, moment);
            }
            Step::Cap { limit, permits } => {
                states[*limit].keep_stored_at_most(*permits, self.now_micros);
            }
        }
    }
}

/// The moment every limit allows a request at `now_micros`, and the first
/// limit whose ticket is that moment if it lies after `now_micros`.
#[inline]
fn earliest(states: &[State], now_micros: u64) -> (u64, Option<usize>) {
    let mut moment = now_micros;
    let mut bound_by = None;
    for (i, state) in states.iter().enumerate() {
        if state.next_free_micros > moment {
            moment = state.next_free_micros;
            bound_by = Some(i);
        }
    }
    (moment, bound_by)
}

/// `rates` times `factor`, or `otherwise` for each if one is not a valid rate
/// ([`Limits::set_first_rate`]). A finite rate scaled to infinity is not, unless
/// `otherwise` is infinite: the factor overflowed (from a tiny rate back up),
/// and would lift every limit.
pub(crate) fn scaled_rates(rates: &[f64], factor: f64, otherwise: f64) -> Vec<f64> {
    let scaled: Vec<f64> = rates.iter().map(|rate| rate * factor).collect();
    let valid = |(&rate, &scaled): (&f64, &f64)| {
        super::stable_interval_micros(scaled).is_ok()
            && (scaled.is_finite() || rate.is_infinite() || otherwise.is_infinite())
    };
    if rates.iter().zip(&scaled).all(valid) {
        scaled
    } else {
        vec![otherwise; rates.len()]
    }
}

/// `rates` with the first one `first`, exactly, and the others scaled by as
/// much ([`scaled_rates`], `first` for each if that is not valid): a
/// limiter's `set_rate`. (The first one scaled, `rate × (first / rate)`, is
/// a rounding off `first` for about one rate in ten.)
pub(crate) fn first_rate_scaled(rates: &[f64], first: f64) -> Vec<f64> {
    let mut rates = match rates.first() {
        Some(&rate) => scaled_rates(rates, first / rate, first),
        None => return Vec::new(),
    };
    rates[0] = first;
    rates
}

/// What a limiter's `set_rate` scales: its limits' rates as last set one by
/// one (as built, then by each `set_limit_rate` that leaves the first rate
/// finite), not as a `set_rate` left them. A change to an infinite rate
/// makes every limit infinite, and one whose scaling underflows gives every
/// limit that rate: from those, the limits' own rates could not be told
/// again (10/s with 1 000 an hour, through `set_rate(f64::INFINITY)` and
/// back to 10/s, came back as 10/s twice, the hourly quota lost). The
/// limiter holds it, and one change at a time, behind its lock;
/// [`first_rate_scaled`] of it is a `set_rate`.
pub(crate) type Shape = std::sync::Mutex<Box<[f64]>>;

/// Keeps `rates`, set one by one, as the limiter's shape, if the first is
/// finite (the others are in proportion to it; an infinite one stays so).
pub(crate) fn reshape(shape: &mut Box<[f64]>, rates: &[f64]) {
    if rates.first().is_some_and(|rate| rate.is_finite()) {
        *shape = rates.into();
    }
}

/// Charges `cost` to every limit as if requested at `moment` (at or after
/// every ticket).
#[inline]
fn charge(states: &mut [State], cost: &Cost, moment: u64) {
    for (i, state) in states.iter_mut().enumerate() {
        state.reserve_earliest_available(cost.get(i), moment);
    }
}

/// How a reservation is held: plain (the caller's at once), held (given back
/// if dropped before its moment; logged only if it waits), or an open call
/// (logged, settled after its moment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    Plain,
    Held,
    Open,
}

#[cfg(test)]
mod tests;
