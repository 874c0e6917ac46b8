//! Options drawn at random from every corner of `f64`, `u64`, `u32` and
//! `Duration` (NaN, infinities, subnormals, zero, the largest values): the
//! builder answers each with a limiter or an `Error::InvalidArgument`, and a
//! limiter answers every call sanely at any time on its clock.
//!
//! Seeded: a failure prints its seed and the case, which replay it.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use paceline::clock::FakeClock;
use paceline::{Error, KeyedRateLimiter, Limit, Local, RateLimiter, Snapshot};

use crate::support::rng::Rng;

/// The longest wait a limiter answers: 2^53 µs.
const LONGEST: Duration = Duration::from_micros(1 << 53);

fn any_f64(rng: &mut Rng) -> f64 {
    const SPECIAL: [f64; 20] = [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        -0.0,
        -1.0,
        f64::MIN_POSITIVE,
        5e-324,
        1e-300,
        f64::EPSILON,
        1e-9,
        0.5,
        1.0,
        3.0,
        1e3,
        999_999.0,
        1e6,
        1e9,
        1e300,
        f64::MAX,
    ];
    match rng.below(4) {
        0 => f64::from_bits(rng.next_u64()),
        1 => *rng.pick(&SPECIAL),
        // Positive, across every magnitude.
        _ => (1.0 + rng.f64()) * 10f64.powi(rng.range(0, 640) as i32 - 320),
    }
}

fn any_u64(rng: &mut Rng) -> u64 {
    match rng.below(3) {
        0 => *rng.pick(&[0, 1, 2, 3, 1 << 53, (1 << 53) + 1, u64::MAX - 1, u64::MAX]),
        1 => rng.next_u64() >> rng.below(64),
        _ => rng.range(1, 1000),
    }
}

fn any_duration(rng: &mut Rng) -> Duration {
    match rng.below(3) {
        0 => *rng.pick(&[
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_nanos(999),
            Duration::from_micros(1),
            Duration::from_secs(1),
            LONGEST,
            Duration::from_nanos(u64::MAX),
            Duration::from_secs(u64::MAX),
            Duration::MAX,
        ]),
        1 => Duration::from_nanos(rng.next_u64() >> rng.below(64)),
        _ => Duration::new(
            rng.next_u64() >> rng.below(64),
            rng.below(1_000_000_000) as u32,
        ),
    }
}

fn any_permits(rng: &mut Rng) -> u32 {
    match rng.below(4) {
        0 => *rng.pick(&[0, 1, u32::MAX]),
        1 => rng.next_u64() as u32 >> rng.below(32),
        _ => rng.range(1, 10) as u32,
    }
}

/// A limit drawn at random, and how it was made.
fn any_limit(rng: &mut Rng) -> (Limit, String) {
    let (permits, period) = (any_f64(rng), any_duration(rng));
    let (mut limit, mut how) = match rng.below(2) {
        0 => (
            Limit::per(permits, period),
            format!("Limit::per({permits:?}, {period:?})"),
        ),
        _ => (
            Limit::per_second(permits),
            format!("Limit::per_second({permits:?})"),
        ),
    };
    if rng.chance(0.4) {
        let burst = any_u64(rng);
        limit = limit.burst(burst);
        how += &format!(".burst({burst})");
    }
    if rng.chance(0.3) {
        let warmup = any_duration(rng);
        limit = limit.warmup(warmup);
        how += &format!(".warmup({warmup:?})");
    }
    if rng.chance(0.3) {
        let cold = match rng.below(2) {
            0 => any_f64(rng),
            _ => 1.0 + rng.f64() * 10f64.powi(rng.below(7) as i32),
        };
        limit = limit.cold_factor(cold);
        how += &format!(".cold_factor({cold:?})");
    }
    (limit, how)
}

/// The builder's options drawn at random: its own rate, burst and warm-up,
/// and up to two limits.
macro_rules! random_builder {
    ($rng:expr, $builder:expr, $how:ident, $limits:ident) => {{
        let rng: &mut Rng = $rng;
        let mut builder = $builder;
        if rng.chance(0.6) {
            let rate = any_f64(rng);
            builder = builder.permits_per_second(rate);
            $how += &format!(".permits_per_second({rate:?})");
            $limits += 1;
            if rng.chance(0.3) {
                let burst = any_duration(rng);
                builder = builder.max_burst(burst);
                $how += &format!(".max_burst({burst:?})");
            }
            if rng.chance(0.3) {
                let warmup = any_duration(rng);
                builder = builder.warmup(warmup);
                $how += &format!(".warmup({warmup:?})");
            }
        }
        for _ in 0..rng.below(3) {
            let (limit, made) = any_limit(rng);
            builder = builder.limit(limit);
            $how += &format!(".limit({made})");
            $limits += 1;
        }
        builder
    }};
}

/// The calls of a limiter that either kind answers, for one key.
trait Calls {
    fn try_reserve(&self, permits: u32, timeout: Duration) -> Result<Option<Duration>, Error>;
    fn reserve(&self, permits: u32) -> Result<Duration, Error>;
    fn snapshot(&self) -> Result<Snapshot, Error>;
    fn set_rate(&self, rate: f64) -> Result<(), Error>;
    fn set_limit_rate(&self, index: usize, rate: f64) -> Result<(), Error>;
}

impl Calls for RateLimiter<Local, FakeClock> {
    fn try_reserve(&self, permits: u32, timeout: Duration) -> Result<Option<Duration>, Error> {
        RateLimiter::try_reserve(self, permits, timeout)
    }
    fn reserve(&self, permits: u32) -> Result<Duration, Error> {
        RateLimiter::reserve(self, permits)
    }
    fn snapshot(&self) -> Result<Snapshot, Error> {
        RateLimiter::snapshot(self)
    }
    fn set_rate(&self, rate: f64) -> Result<(), Error> {
        RateLimiter::set_rate(self, rate)
    }
    fn set_limit_rate(&self, index: usize, rate: f64) -> Result<(), Error> {
        RateLimiter::set_limit_rate(self, index, rate)
    }
}

impl Calls for KeyedRateLimiter<u8, Local, FakeClock> {
    fn try_reserve(&self, permits: u32, timeout: Duration) -> Result<Option<Duration>, Error> {
        KeyedRateLimiter::try_reserve(self, &7, permits, timeout)
    }
    fn reserve(&self, permits: u32) -> Result<Duration, Error> {
        KeyedRateLimiter::reserve(self, &7, permits)
    }
    fn snapshot(&self) -> Result<Snapshot, Error> {
        KeyedRateLimiter::snapshot(self, &7)
    }
    fn set_rate(&self, rate: f64) -> Result<(), Error> {
        KeyedRateLimiter::set_rate(self, rate)
    }
    fn set_limit_rate(&self, index: usize, rate: f64) -> Result<(), Error> {
        KeyedRateLimiter::set_limit_rate(self, index, rate)
    }
}

fn refused<T: std::fmt::Debug>(result: Result<T, Error>, what: &str) {
    match result {
        Err(Error::InvalidArgument(why)) => assert!(!why.is_empty(), "{what}"),
        other => panic!("{what}: expected InvalidArgument, got {other:?}"),
    }
}

fn check_snapshot(snapshot: &Snapshot, what: &str) {
    assert!(snapshot.wait() <= LONGEST, "{what}: {snapshot:?}");
    assert!(
        snapshot.rate() > 0.0 && snapshot.stored() >= 0.0,
        "{what}: {snapshot:?}"
    );
    // Each of these reads without panicking, and within bounds.
    let _ = (snapshot.remaining(), snapshot.burst(), snapshot.limit());
    assert!(snapshot.full_in() <= LONGEST, "{what}: {snapshot:?}");
    for requests in [0, 1, 2, u64::MAX] {
        let wait = snapshot.wait_for(requests);
        assert!(wait.is_none_or(|w| w <= LONGEST), "{what}: {snapshot:?}");
    }
}

/// Random calls on a working limiter, the clock moved at random between
/// them: each answers as documented.
fn exercise(
    limiter: &impl Calls,
    clock: &FakeClock,
    limits: usize,
    rng: &mut Rng,
    log: &mut String,
) {
    // Bounds on the wait of the next request, while the rates stay: at
    // least what the last one reserved waited (the time since taken off),
    // at most what the last snapshot said (the same), if nothing was
    // reserved since.
    let (mut floor, mut ceiling) = (Duration::ZERO, None::<Duration>);
    for _ in 0..24 {
        match rng.below(7) {
            0 => {
                let by = match rng.below(3) {
                    0 => any_duration(rng),
                    1 => Duration::from_micros(rng.below(1_000_000)),
                    _ => Duration::ZERO,
                };
                clock.advance(by);
                *log += &format!("\n  advance({by:?})");
                // (Waits are whole microseconds of a clock read to the
                // microsecond below: up to one off the exact.)
                floor = floor.saturating_sub(by.saturating_add(Duration::from_micros(1)));
                ceiling = ceiling.map(|c| c.saturating_sub(by) + Duration::from_micros(1));
            }
            1 | 2 => {
                let (permits, timeout) = (any_permits(rng), any_duration(rng));
                *log += &format!("\n  try_reserve({permits}, {timeout:?})");
                let reserved = limiter.try_reserve(permits, timeout);
                *log += &format!(" -> {reserved:?}");
                match reserved {
                    _ if permits == 0 => refused(limiter.try_reserve(0, timeout), log),
                    Ok(Some(wait)) => {
                        assert!(wait <= timeout.min(LONGEST), "{log} -> {wait:?}");
                        assert!(wait >= floor, "{log} -> {wait:?}, below {floor:?}");
                        assert!(ceiling.is_none_or(|c| wait <= c), "{log} -> {wait:?}");
                        (floor, ceiling) = (wait, None);
                    }
                    Ok(None) => assert!(ceiling.is_none_or(|c| c > timeout), "{log}"),
                    Err(error) => panic!("{log}: {error:?}"),
                }
            }
            3 => {
                let permits = any_permits(rng);
                *log += &format!("\n  reserve({permits})");
                let reserved = limiter.reserve(permits);
                *log += &format!(" -> {reserved:?}");
                match reserved {
                    _ if permits == 0 => refused(limiter.reserve(0), log),
                    Ok(wait) => {
                        assert!(wait <= LONGEST, "{log} -> {wait:?}");
                        assert!(wait >= floor, "{log} -> {wait:?}, below {floor:?}");
                        assert!(ceiling.is_none_or(|c| wait <= c), "{log} -> {wait:?}");
                        (floor, ceiling) = (wait, None);
                    }
                    Err(error) => panic!("{log}: {error:?}"),
                }
            }
            4 => {
                // What a snapshot says of the wait is what the next request
                // waits.
                *log += "\n  snapshot (then maybe try_reserve(1, its wait))";
                let snapshot = limiter
                    .snapshot()
                    .unwrap_or_else(|e| panic!("{log}: {e:?}"));
                check_snapshot(&snapshot, log);
                let wait = snapshot.wait();
                assert!(wait >= floor, "{log}: {snapshot:?}, below {floor:?}");
                assert!(ceiling.is_none_or(|c| wait <= c), "{log}: {snapshot:?}");
                *log += &format!(" -> {wait:?}");
                if rng.chance(0.5) {
                    (floor, ceiling) = (wait, Some(wait));
                    continue;
                }
                if let Some(less) = wait.checked_sub(Duration::from_micros(1)) {
                    let early = limiter.try_reserve(1, less);
                    assert!(matches!(early, Ok(None)), "{log}: {snapshot:?} {early:?}");
                }
                let got = limiter.try_reserve(1, wait);
                assert_eq!(got.ok(), Some(Some(wait)), "{log}: {snapshot:?}");
                (floor, ceiling) = (wait, None);
            }
            5 => {
                let rate = any_f64(rng);
                *log += &format!("\n  set_rate({rate:?})");
                let set = limiter.set_rate(rate);
                (floor, ceiling) = (Duration::ZERO, None);
                if rate > 0.0 {
                    assert!(set.is_ok(), "{log}: {set:?}");
                } else {
                    refused(set, log);
                }
            }
            _ => {
                let (index, rate) = (rng.below(limits as u64 + 1) as usize, any_f64(rng));
                *log += &format!("\n  set_limit_rate({index}, {rate:?})");
                let set = limiter.set_limit_rate(index, rate);
                (floor, ceiling) = (Duration::ZERO, None);
                if rate > 0.0 && index < limits {
                    assert!(set.is_ok(), "{log}: {set:?}");
                } else {
                    refused(set, log);
                }
            }
        }
    }
}

fn one_case(seed: u64) -> bool {
    let mut rng = Rng::new(seed);
    let clock = FakeClock::new();
    if rng.chance(0.5) {
        clock.advance(any_duration(&mut rng));
    }
    let mut how = format!(
        "seed {seed:#x}: at {:?}, ",
        paceline::clock::Clock::now(&clock)
    );
    let keyed = rng.chance(0.3);
    let mut limits = 0;
    let built = if keyed {
        how += "KeyedRateLimiter::builder()";
        let builder = random_builder!(&mut rng, KeyedRateLimiter::<u8>::builder(), how, limits);
        builder
            .clock(clock.clone())
            .build()
            .map(|l| (None, Some(l)))
    } else {
        how += "RateLimiter::builder()";
        let builder = random_builder!(&mut rng, RateLimiter::builder(), how, limits);
        builder
            .clock(clock.clone())
            .build()
            .map(|l| (Some(l), None))
    };
    let (single, keyed) = match built {
        Ok(built) => built,
        Err(Error::InvalidArgument(why)) => {
            assert!(!why.is_empty(), "{how}");
            return false;
        }
        Err(other) => panic!("{how}: {other:?}"),
    };
    match (&single, &keyed) {
        (Some(l), _) => exercise(l, &clock, limits, &mut rng, &mut how),
        (_, Some(l)) => exercise(l, &clock, limits, &mut rng, &mut how),
        _ => unreachable!(),
    }
    true
}

#[test]
fn random_options_build_or_are_refused_and_answer_sanely() {
    let mut built = 0;
    for seed in 0..3000u64 {
        let seed = 0x5EED_0000 + seed;
        match catch_unwind(AssertUnwindSafe(|| one_case(seed))) {
            Ok(true) => built += 1,
            Ok(false) => {}
            Err(_) => panic!("failed at seed {seed:#x} (see the message above)"),
        }
    }
    // The draw reaches both answers.
    assert!(built > 300, "{built} built");
}
