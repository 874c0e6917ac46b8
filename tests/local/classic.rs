//! The limiter against the classic algorithm's formulas (SmoothBursty and
//! SmoothWarmingUp), to the microsecond, on a fake clock.
//!
//! `Model` below is written from the published formulas (not from any code):
//! a ticket and stored permits, resync at `cool_down` per permit, stored
//! permits free (bursty) or priced by the trapezoid above `threshold`
//! (warming-up), rate changes rescaling stored permits by
//! `max_new / max_old`, and a try that reserves only if
//! `ticket − timeout <= now`. The one documented departure it models is
//! exactness: costs are not truncated to whole microseconds (paceline carries
//! the fraction), so its ticket is a float and a wait may differ from the
//! model's by the fraction, under a microsecond.

use crate::support::fake;
use crate::support::rng::Rng;

use std::time::Duration;

use fake::{bursty, micros, pause_ms, waits, waits_n, warming_up};
use paceline::clock::{Clock, FakeClock};
use paceline::{KeyedRateLimiter, Limit, Local, RateLimiter};

const US: Duration = Duration::from_micros(1);

#[derive(Debug, Clone, Copy)]
enum Kind {
    /// `max_burst` in seconds.
    Bursty(f64),
    /// `warmup` in µs, cold factor.
    Warm(f64, f64),
}

/// The classic algorithm, from its formulas, with a float ticket.
#[derive(Debug, Clone)]
struct Model {
    kind: Kind,
    stored: f64,
    max: f64,
    stable: f64,
    threshold: f64,
    slope: f64,
    ticket: f64,
}

impl Model {
    /// A limiter created at `now`, as the classic factory makes it: max 0,
    /// then the rate set (bursty: nothing stored; warming-up: cold).
    fn new(kind: Kind, rate: f64, now: f64) -> Model {
        let mut m = Model {
            kind,
            stored: 0.0,
            max: 0.0,
            stable: 0.0,
            threshold: 0.0,
            slope: 0.0,
            ticket: now,
        };
        m.set_rate(rate, now);
        m
    }

    fn cool_down(&self) -> f64 {
        if self.max == f64::INFINITY {
            return 0.0;
        }
        match self.kind {
            Kind::Bursty(_) => self.stable,
            Kind::Warm(warmup, _) => warmup / self.max,
        }
    }

    fn resync(&mut self, now: f64) {
        if now > self.ticket {
            if self.max != f64::INFINITY {
                let new = (now - self.ticket) / self.cool_down();
                self.stored = (self.stored + new).min(self.max);
            }
            self.ticket = now;
        }
    }

    fn price(&self, above: f64) -> f64 {
        self.stable + above * self.slope
    }

    fn stored_cost(&self, take: f64) -> f64 {
        match self.kind {
            Kind::Bursty(_) => 0.0,
            Kind::Warm(..) => {
                let above = self.stored - self.threshold;
                let mut take = take;
                let mut micros = 0.0;
                if above > 0.0 {
                    let t = above.min(take);
                    micros = t * (self.price(above) + self.price(above - t)) / 2.0;
                    take -= t;
                }
                micros + self.stable * take
            }
        }
    }

    /// Reserves; the wait (float µs).
    fn reserve(&mut self, permits: u32, now: f64) -> f64 {
        self.resync(now);
        let moment = self.ticket;
        let p = f64::from(permits);
        let spend = p.min(self.stored);
        let mut cost = self.stored_cost(spend) + (p - spend) * self.stable;
        if cost >= 4_294_967_296.0 {
            // Documented: charged in whole µs, truncated, from 2^32 µs.
            cost = cost.trunc();
        }
        self.ticket += cost;
        self.stored -= spend;
        (moment - now).max(0.0)
    }

    /// `ticket − timeout − now`: a try is granted iff this is `<= 0`.
    fn try_margin(&self, now: f64, timeout: f64) -> f64 {
        self.ticket - timeout - now
    }

    fn set_rate(&mut self, rate: f64, now: f64) {
        self.resync(now);
        let was_infinite = self.stable == 0.0 && self.max == f64::INFINITY;
        self.stable = 1e6 / rate;
        let old_max = self.max;
        if rate.is_infinite() {
            // The classic max is infinite here; every permit is free.
            self.max = f64::INFINITY;
            self.stored = 0.0;
            self.threshold = 0.0;
            self.slope = 0.0;
            return;
        }
        match self.kind {
            Kind::Bursty(seconds) => {
                self.max = seconds * rate;
                self.stored = if was_infinite {
                    self.max
                } else if old_max == 0.0 {
                    0.0
                } else {
                    self.stored * self.max / old_max
                };
            }
            Kind::Warm(warmup, cold_factor) => {
                let cold = self.stable * cold_factor;
                self.threshold = 0.5 * warmup / self.stable;
                self.max = self.threshold + 2.0 * warmup / (self.stable + cold);
                self.slope = (cold - self.stable) / (self.max - self.threshold);
                self.stored = if was_infinite {
                    0.0
                } else if old_max == 0.0 {
                    self.max
                } else {
                    self.stored * self.max / old_max
                };
            }
        }
    }
}

fn now_us(clock: &FakeClock) -> f64 {
    clock.now_micros() as f64
}

/// A limiter built with `permits_per_second` and the policy's option.
fn local(kind: Kind, rate: f64) -> (RateLimiter<Local, FakeClock>, FakeClock) {
    match subject(kind, rate, Make::Builder) {
        (Subject::Local(limiter), clock) => (limiter, clock),
        _ => unreachable!(),
    }
}

/// What is checked against the model: a limiter of one limit, made one way.
// A test's two subjects, side by side: their sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Subject {
    Local(RateLimiter<Local, FakeClock>),
    Keyed(KeyedRateLimiter<u32, Local, FakeClock>),
}

impl Subject {
    fn reserve(&self, permits: u32) -> u64 {
        micros(match self {
            Subject::Local(l) => l.reserve(permits).unwrap(),
            Subject::Keyed(l) => l.reserve(&7, permits).unwrap(),
        })
    }

    fn try_reserve(&self, permits: u32, timeout: Duration) -> Option<u64> {
        match self {
            Subject::Local(l) => l.try_reserve(permits, timeout).unwrap(),
            Subject::Keyed(l) => l.try_reserve(&7, permits, timeout).unwrap(),
        }
        .map(micros)
    }

    fn acquire(&self, permits: u32) -> u64 {
        micros(match self {
            Subject::Local(l) => l.acquire_blocking(permits).unwrap(),
            Subject::Keyed(l) => l.acquire_blocking(&7, permits).unwrap(),
        })
    }

    fn try_acquire(&self, permits: u32, timeout: Duration) -> bool {
        match self {
            Subject::Local(l) => l.try_acquire_blocking(permits, timeout).unwrap(),
            Subject::Keyed(l) => l.try_acquire_blocking(&7, permits, timeout).unwrap(),
        }
    }

    fn wait(&self) -> u64 {
        micros(match self {
            Subject::Local(l) => l.snapshot().unwrap().wait(),
            Subject::Keyed(l) => l.snapshot(&7).unwrap().wait(),
        })
    }

    fn stored(&self) -> f64 {
        match self {
            Subject::Local(l) => l.snapshot().unwrap().stored(),
            Subject::Keyed(l) => l.snapshot(&7).unwrap().stored(),
        }
    }

    fn set_rate(&self, rate: f64) {
        match self {
            Subject::Local(l) => l.set_rate(rate).unwrap(),
            Subject::Keyed(l) => l.set_rate(rate).unwrap(),
        }
    }
}

/// How the subject is built.
#[derive(Debug, Clone, Copy)]
enum Make {
    /// `RateLimiter::builder().permits_per_second(..)` with `max_burst` or
    /// `warmup`.
    Builder,
    /// `.limit(Limit::per_second(..).warmup(..))` (warming-up only).
    LimitWarmup,
    /// A keyed limiter's key (starts full: documented).
    Keyed,
}

fn subject(kind: Kind, rate: f64, make: Make) -> (Subject, FakeClock) {
    let clock = FakeClock::new();
    macro_rules! builder {
        ($b:expr) => {
            match kind {
                Kind::Bursty(seconds) => $b
                    .permits_per_second(rate)
                    .max_burst(Duration::from_secs_f64(seconds)),
                Kind::Warm(warmup, cold) => $b.limit(
                    Limit::per_second(rate)
                        .warmup(Duration::from_micros(warmup as u64))
                        .cold_factor(cold),
                ),
            }
        };
    }
    let subject = match make {
        Make::Builder => Subject::Local(
            builder!(RateLimiter::builder().clock(clock.clone()))
                .build()
                .unwrap(),
        ),
        Make::LimitWarmup => {
            let Kind::Warm(warmup, cold) = kind else {
                panic!("LimitWarmup is warming-up")
            };
            Subject::Local(
                RateLimiter::builder()
                    .limit(
                        Limit::per_second(rate)
                            .warmup(Duration::from_micros(warmup as u64))
                            .cold_factor(cold),
                    )
                    .clock(clock.clone())
                    .build()
                    .unwrap(),
            )
        }
        Make::Keyed => Subject::Keyed(
            builder!(KeyedRateLimiter::<u32>::builder().clock(clock.clone()))
                .build()
                .unwrap(),
        ),
    };
    (subject, clock)
}

/// Random sequences of pauses, reservations and acquisitions (1 to 200
/// permits), tries with timeouts and rate changes; every wait within a
/// microsecond of the model's, every try decided as the model decides
/// (unless the margin is under 2 µs, where rounding may decide; the model
/// then follows the limiter).
fn differential(kind: Kind, make: Make, seed: u64, steps: usize) {
    let mut rng = Rng::new(seed);
    let rates = [
        0.5,
        1.0,
        2.0,
        3.0,
        5.0,
        7.3,
        10.0,
        64.0,
        333.0,
        0.01,
        f64::INFINITY,
    ];
    let rate = *rng.pick(&rates[..9]);
    let (limiter, clock) = subject(kind, rate, make);
    let mut model = Model::new(kind, rate, now_us(&clock));
    if let Make::Keyed = make {
        // A key starts full (documented); warming-up: cold, as the classic.
        model.stored = model.max;
    }
    let mut log = vec![format!("new {kind:?} {make:?} rate {rate}")];
    for _ in 0..steps {
        match rng.below(12) {
            0..=2 => {
                let ms = *rng.pick(&[0, 1, 50, 100, 333, 700, 1500, 4000, 20_000]);
                clock.advance(Duration::from_micros(ms * 1000 + rng.below(1000)));
                log.push(format!("advance to {}", clock.now_micros()));
            }
            3..=6 => {
                let permits = *rng.pick(&[1, 1, 1, 2, 3, 7, 50, 200]);
                let now = now_us(&clock);
                let sleep = rng.chance(0.3);
                let got = if sleep {
                    limiter.acquire(permits)
                } else {
                    limiter.reserve(permits)
                } as f64;
                let want = model.reserve(permits, now);
                log.push(format!(
                    "{} {permits} at {now}: {got} vs {want}",
                    if sleep { "acquire" } else { "reserve" }
                ));
                assert!(
                    (got - want).abs() < 2.0,
                    "seed {seed}: {got} µs, classic {want} µs\n{}",
                    log.join("\n")
                );
            }
            7..=9 => {
                let permits = *rng.pick(&[1, 1, 2, 10]);
                let now = now_us(&clock);
                let margin_now = model.ticket - now;
                let timeout = if rng.chance(0.5) && margin_now > 3.0 {
                    // Just below, at or above the debt.
                    (margin_now as u64).saturating_add_signed(rng.range(0, 6) as i64 - 3)
                } else {
                    rng.below(3_000_000)
                };
                let margin = model.try_margin(now, timeout as f64);
                let sleep = rng.chance(0.3);
                let got = if sleep {
                    let before = clock.now_micros();
                    limiter
                        .try_acquire(permits, Duration::from_micros(timeout))
                        .then(|| clock.now_micros() - before)
                } else {
                    limiter.try_reserve(permits, Duration::from_micros(timeout))
                };
                log.push(format!(
                    "try {permits} at {now} timeout {timeout}: {got:?} (margin {margin})"
                ));
                if margin.abs() >= 2.0 {
                    assert_eq!(
                        got.is_some(),
                        margin <= 0.0,
                        "seed {seed}: try decided otherwise\n{}",
                        log.join("\n")
                    );
                }
                if let Some(got) = got {
                    let want = model.reserve(permits, now);
                    let got = got as f64;
                    assert!(
                        (got - want).abs() < 2.0,
                        "seed {seed}: try waits {got} µs, classic {want} µs\n{}",
                        log.join("\n")
                    );
                }
            }
            _ => {
                let mut new_rate = *rng.pick(&rates);
                if let (Make::Keyed, Kind::Warm(..)) = (make, kind)
                    && new_rate.is_infinite()
                {
                    // A swept key leaves an infinite rate cold: see
                    // `a_warming_up_key_leaves_an_infinite_rate_warm`.
                    new_rate = 3.0;
                }
                let now = now_us(&clock);
                limiter.set_rate(new_rate);
                model.set_rate(new_rate, now);
                log.push(format!("set_rate {new_rate} at {now}"));
            }
        }
        let last = log.pop().unwrap();
        log.push(format!(
            "{last} [stored {} vs {}; owed {} vs {}]",
            limiter.stored(),
            model.stored,
            limiter.wait(),
            model.ticket - now_us(&clock)
        ));
        if log.len() > 40 {
            log.remove(0);
        }
    }
}

#[test]
fn bursty_matches_the_classic_formulas_on_random_sequences() {
    for seed in 0..200 {
        let burst = [1.0, 0.5, 2.0, 10.0][(seed % 4) as usize];
        differential(Kind::Bursty(burst), Make::Builder, seed, 300);
    }
}

#[test]
fn warming_up_matches_the_classic_formulas_on_random_sequences() {
    for seed in 0..200 {
        let (warmup, cold) = [
            (3e6, 3.0),
            (4e6, 3.0),
            (1e6, 10.0),
            (10e6, 2.0),
            (2.5e6, 1.0),
        ][(seed % 5) as usize];
        differential(Kind::Warm(warmup, cold), Make::Builder, seed, 300);
    }
}

#[test]
fn a_warming_up_limit_matches_the_classic_formulas_on_random_sequences() {
    for seed in 0..100 {
        let (warmup, cold) = [(3e6, 3.0), (4e6, 3.0), (1e6, 10.0)][(seed % 3) as usize];
        differential(Kind::Warm(warmup, cold), Make::LimitWarmup, seed, 300);
    }
}

#[test]
fn a_key_matches_the_classic_formulas_from_full_on_random_sequences() {
    for seed in 0..100 {
        let kind = if seed % 2 == 0 {
            Kind::Bursty([1.0, 2.0][(seed / 2 % 2) as usize])
        } else {
            Kind::Warm(3e6, 3.0)
        };
        differential(kind, Make::Keyed, seed, 300);
    }
}

/// `create(2.0)` with a 3 s warm-up, cold factor 3: threshold 3 permits, max
/// 6, prices from 1.5 s (cold) down to 0.5 s (stable). Each wait is the
/// trapezoid of the permit before: 1.33 s, 1.00 s, 0.67 s, then stable.
#[test]
fn a_3_s_warm_up_ramps_from_the_cold_interval_to_the_stable_one() {
    let (limiter, clock) = warming_up(2.0, Duration::from_secs(3), 3.0);
    let cold = waits_n(&limiter, 8);
    assert_eq!(
        cold,
        [
            0, 1_333_333, 1_000_000, 666_667, 500_000, 500_000, 500_000, 500_000
        ]
    );
    // The permits above the threshold take exactly the warm-up period.
    assert_eq!(cold[1..4].iter().sum::<u64>(), 3_000_000);
    // The cold end: one permit from a full limiter costs the mean of the
    // prices at 6 and at 5 permits (1.5 s and 1.1667 s).
    pause_ms(&clock, 500 + 3_000); // repays, then cools fully
    assert_eq!(waits(&limiter, &[1, 1]), [0, 1_333_333]);
    // A single request for every stored permit is charged the whole area:
    // 3 s above the threshold plus 3 × 0.5 s below.
    pause_ms(&clock, 1_333 + 3_000);
    clock.advance(US); // the ticket's fraction
    assert_eq!(waits(&limiter, &[6, 1]), [0, 4_500_000]);
}

/// The warm-up period is honoured whatever the weights: the permits above
/// the threshold, taken in random chunks from a cold limiter, take the
/// warm-up period, whatever the cold factor and the rate.
#[test]
fn the_warm_up_period_is_honoured_whatever_the_weights() {
    let mut rng = Rng::new(7);
    for trial in 0..20 {
        for cold_factor in [2.0, 3.0, 10.0] {
            for qps in [4.0, 2.0, 1.0, 0.5, 0.1] {
                let warmup_ms = ((1.0 + cold_factor) * 10.0 / (2.0 * qps) * 1000.0) as u64;
                let (limiter, clock) =
                    warming_up(qps, Duration::from_millis(warmup_ms), cold_factor);
                let start = clock.now_micros();
                let mut permits = 10u64;
                while permits > 0 {
                    let take = rng.below(permits).max(1);
                    permits -= take;
                    limiter.acquire_blocking(take as u32).unwrap();
                }
                limiter.acquire_blocking(1).unwrap(); // repays the debt
                let took = clock.now_micros() - start;
                assert!(
                    took.abs_diff(warmup_ms * 1000) <= 1,
                    "trial {trial}, cold {cold_factor}, {qps}/s: {took} µs, warm-up {warmup_ms} ms"
                );
            }
        }
    }
}

/// A one-second burst, and weights paid by the next caller, as the classic
/// algorithm's own examples have them.
#[test]
fn a_one_second_burst_and_weights_paid_by_the_next_caller() {
    let (limiter, clock) = bursty(5.0);
    pause_ms(&clock, 1000);
    pause_ms(&clock, 1000); // no difference: the burst is full
    assert_eq!(waits(&limiter, &[1, 1, 3, 1, 1]), [0, 0, 0, 0, 200_000]);

    let (limiter, _) = bursty(1.0);
    assert_eq!(
        waits(&limiter, &[1, 1, 2, 4, 8, 1]),
        [0, 1_000_000, 1_000_000, 2_000_000, 4_000_000, 8_000_000]
    );
}

/// `create(2.0)` with `max_burst` 1 s after idle: 2 stored + 1 at once, then
/// 0.5 s; a burst of 3 s stores 6.
#[test]
fn an_idle_bursty_limiter_lets_max_permits_plus_one_go() {
    let (limiter, clock) = bursty(2.0);
    pause_ms(&clock, 10_000);
    assert_eq!(waits_n(&limiter, 5), [0, 0, 0, 500_000, 500_000]);

    let (limiter, clock) = local(Kind::Bursty(3.0), 2.0);
    pause_ms(&clock, 10_000);
    assert_eq!(
        waits_n(&limiter, 9),
        [0, 0, 0, 0, 0, 0, 0, 500_000, 500_000]
    );
    // A large request on an idle limiter goes at once; the next pays.
    pause_ms(&clock, 500 + 10_000);
    assert_eq!(waits(&limiter, &[100, 1]), [0, 47_000_000]);
}

/// Infinite rates, bursty and warming-up, as the classic algorithm has them.
#[test]
fn infinite_rates_as_the_classic_algorithm() {
    let (limiter, _) = bursty(f64::INFINITY);
    let max = i32::MAX as u32;
    assert_eq!(waits(&limiter, &[max / 4, max / 2, max]), [0, 0, 0]);
    limiter.set_rate(2.0).unwrap();
    assert_eq!(waits_n(&limiter, 5), [0, 0, 0, 500_000, 500_000]);
    limiter.set_rate(f64::INFINITY).unwrap();
    assert_eq!(waits_n(&limiter, 3), [500_000, 0, 0]);

    let (limiter, clock) = bursty(f64::INFINITY);
    pause_ms(&clock, 1000);
    limiter.set_rate(2.0).unwrap();
    assert_eq!(waits_n(&limiter, 5), [0, 0, 0, 500_000, 500_000]);

    let (limiter, _) = warming_up(f64::INFINITY, Duration::from_secs(10), 3.0);
    assert_eq!(waits(&limiter, &[max / 4, max / 2, max]), [0, 0, 0]);
    limiter.set_rate(1.0).unwrap();
    assert_eq!(waits_n(&limiter, 3), [0, 1_000_000, 1_000_000]);
    limiter.set_rate(f64::INFINITY).unwrap();
    assert_eq!(waits_n(&limiter, 3), [1_000_000, 0, 0]);

    let (limiter, clock) = warming_up(f64::INFINITY, Duration::from_secs(10), 3.0);
    pause_ms(&clock, 1000);
    limiter.set_rate(1.0).unwrap();
    assert_eq!(
        waits_n(&limiter, 5),
        [0, 1_000_000, 1_000_000, 1_000_000, 1_000_000]
    );
}

/// A try reserves iff the debt fits: just below, at and just above the wait;
/// the request's own size never counts.
#[test]
fn tries_at_the_edge_of_the_wait() {
    let (limiter, _) = bursty(5.0);
    assert_eq!(
        limiter.try_reserve(1000, Duration::ZERO).unwrap(),
        Some(Duration::ZERO)
    );
    let debt = Duration::from_secs(200);
    assert_eq!(limiter.try_reserve(1, debt - US).unwrap(), None);
    assert_eq!(limiter.try_reserve(1, debt).unwrap(), Some(debt));
    let debt = debt + Duration::from_millis(200);
    assert_eq!(limiter.try_reserve(1, debt + US).unwrap(), Some(debt));

    // Cold warming-up, 2/s, 3 s: the first permit leaves 1.333 333 s owed.
    let (limiter, clock) = warming_up(2.0, Duration::from_secs(3), 3.0);
    assert!(limiter.try_acquire_blocking(1, Duration::ZERO).unwrap());
    let owed = Duration::from_micros(1_333_333);
    assert!(!limiter.try_acquire_blocking(1, owed - US).unwrap());
    assert_eq!(clock.now(), Duration::ZERO);
    assert!(limiter.try_acquire_blocking(1, owed).unwrap());
    assert_eq!(clock.now(), owed);
    // 1.0 s owed now.
    assert!(
        !limiter
            .try_acquire_blocking(3, Duration::from_micros(999_999))
            .unwrap()
    );
    assert!(
        limiter
            .try_acquire_blocking(3, Duration::from_micros(1_000_001))
            .unwrap()
    );
    assert_eq!(micros(clock.now()), 2_333_333);
}

/// Rate changes from idle, from warm and from cold, against the model.
#[test]
fn rate_changes_rescale_as_the_classic() {
    let cases: [(Kind, &[(u64, f64)]); 6] = [
        // Bursty, half full, to a slower and a faster rate.
        (Kind::Bursty(1.0), &[(500_000, 2.0), (0, 20.0)]),
        // Bursty full, from a 2 s burst.
        (Kind::Bursty(2.0), &[(10_000_000, 4.0)]),
        // Warming-up, cold at creation, faster then slower.
        (Kind::Warm(3e6, 3.0), &[(0, 4.0), (0, 1.0)]),
        // Warming-up warm (after its cold start), then cooling half-way.
        (Kind::Warm(3e6, 3.0), &[(8_000_000, 2.0), (1_500_000, 5.0)]),
        (Kind::Warm(4e6, 10.0), &[(2_000_000, 3.0)]),
        (Kind::Warm(4e6, 1.0), &[(2_000_000, 3.0)]),
    ];
    for (kind, changes) in cases {
        let (limiter, clock) = local(kind, 2.0);
        let mut model = Model::new(kind, 2.0, 0.0);
        let check = |n: usize, model: &mut Model| {
            for i in 0..n {
                let now = now_us(&clock);
                let got = micros(limiter.acquire_blocking(1).unwrap());
                let want = model.reserve(1, now);
                assert!(
                    (got as f64 - want).abs() < 1.01,
                    "{kind:?} #{i}: {got} vs {want}"
                );
            }
        };
        check(8, &mut model);
        for &(pause, rate) in changes {
            clock.advance(Duration::from_micros(pause));
            let now = now_us(&clock);
            limiter.set_rate(rate).unwrap();
            model.set_rate(rate, now);
            check(3, &mut model);
            clock.advance(Duration::from_secs(2));
            check(12, &mut model);
        }
    }
}

/// `Limit::burst`'s own example: `burst(20)` at 10/s stores 1.9 s, so 39 at
/// once at 20/s and 10 at 5/s.
#[test]
fn a_burst_count_follows_the_rate_as_documented() {
    for (rate, at_once) in [(10.0, 20), (20.0, 39), (5.0, 10)] {
        let clock = FakeClock::new();
        let limiter = RateLimiter::builder()
            .limit(Limit::per_second(10.0).burst(20))
            .clock(clock.clone())
            .build()
            .unwrap();
        limiter.set_rate(rate).unwrap();
        for i in 0..at_once {
            assert_eq!(
                limiter.try_reserve(1, Duration::ZERO).unwrap(),
                Some(Duration::ZERO),
                "{rate}/s #{i}"
            );
        }
        assert_eq!(
            limiter.try_reserve(1, Duration::ZERO).unwrap(),
            None,
            "{rate}/s"
        );
    }
}
