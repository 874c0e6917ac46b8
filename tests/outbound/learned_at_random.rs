//! An upstream's answers drawn at random (statuses, `Retry-After`s, quotas
//! with numbers at the limits of `u64` and `Duration`), learned under
//! learning constants drawn from the whole of their ranges, by limiters of
//! rates from the slowest to the infinite: no panic, no rate above the one
//! configured, and every wait within what a limiter answers and as its
//! snapshot says.
//!
//! Seeded: a failure prints its seed and what happened, which replay it.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use paceline::clock::{Clock, FakeClock};
use paceline::outbound::{Feedback, Learning, Quota};
use paceline::{Cost, Limit, Local, RateLimiter};

use crate::support::rng::Rng;

/// The longest wait a limiter answers: 2^53 µs.
const LONGEST: Duration = Duration::from_micros(1 << 53);

fn any_rate(rng: &mut Rng) -> f64 {
    match rng.below(4) {
        0 => *rng.pick(&[
            f64::INFINITY,
            f64::MAX,
            1e300,
            1e-300,
            5e-324,
            1.0 / 86_400.0,
        ]),
        _ => (1.0 + rng.f64()) * 10f64.powi(rng.range(0, 24) as i32 - 12),
    }
}

fn any_duration(rng: &mut Rng) -> Duration {
    match rng.below(3) {
        0 => *rng.pick(&[
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_micros(1),
            Duration::from_secs(86_400),
            LONGEST,
            Duration::MAX,
        ]),
        _ => Duration::from_nanos(rng.next_u64() >> rng.below(64)),
    }
}

fn any_u64(rng: &mut Rng) -> u64 {
    match rng.below(3) {
        0 => *rng.pick(&[0, 1, 2, (1 << 53) + 1, u64::MAX]),
        1 => rng.next_u64() >> rng.below(64),
        _ => rng.below(100),
    }
}

/// A fraction in `(0, 1]`, from the smallest there is.
fn any_fraction(rng: &mut Rng) -> f64 {
    match rng.below(3) {
        0 => *rng.pick(&[5e-324, f64::MIN_POSITIVE, 1e-300, 1.0, 1.0 - f64::EPSILON]),
        _ => 1.0 - rng.f64(),
    }
}

/// Learning constants from the whole of their ranges, and the margin.
fn any_learning(rng: &mut Rng) -> (Learning, f64) {
    let increase = if rng.chance(0.2) {
        0.0
    } else {
        any_fraction(rng)
    };
    let margin = any_fraction(rng);
    let learning = Learning::default()
        .decrease(any_fraction(rng))
        .increase(increase)
        .interval(any_duration(rng))
        .floor(any_fraction(rng))
        .pause(any_duration(rng))
        .margin(margin);
    (learning, margin)
}

/// An answer: read from headers an upstream wrote, or built by hand with
/// any numbers.
fn any_feedback(rng: &mut Rng, now: SystemTime) -> Feedback {
    let status = *rng.pick(&[200, 204, 429, 503, 500, 0, u16::MAX]);
    if rng.chance(0.5) {
        let number = |rng: &mut Rng| match rng.below(4) {
            0 => any_u64(rng).to_string(),
            1 => format!("{}.{}", any_u64(rng), any_u64(rng)),
            2 => "99999999999999999999999".to_owned(),
            _ => rng.below(5).to_string(),
        };
        let mut headers = Vec::new();
        for _ in 0..rng.below(6) {
            let name = *rng.pick(&[
                "Retry-After",
                "RateLimit-Policy",
                "RateLimit",
                "X-RateLimit-Limit",
                "X-RateLimit-Remaining",
                "X-RateLimit-Reset",
                "X-RateLimit-Remaining-Tokens",
                "X-RateLimit-Reset-Tokens",
            ]);
            let value = match name {
                "RateLimit-Policy" => format!(
                    "\"{}\";q={};w={}",
                    rng.pick(&["requests", "tokens", "other"]),
                    number(rng),
                    number(rng)
                ),
                "RateLimit" => format!(
                    "\"{}\";r={};t={}",
                    rng.pick(&["requests", "tokens"]),
                    number(rng),
                    number(rng)
                ),
                _ => number(rng),
            };
            headers.push((name, value));
        }
        let pairs = headers.iter().map(|(n, v)| (*n, v.as_bytes()));
        return Feedback::from_headers(status, pairs, now);
    }
    let mut feedback = Feedback::new(status);
    if rng.chance(0.5) {
        feedback = feedback.with_retry_after(any_duration(rng));
    }
    for _ in 0..rng.below(3) {
        let mut quota = match rng.below(3) {
            0 => Quota::default(),
            1 => Quota::named("requests"),
            _ => Quota::named("tokens"),
        };
        quota.limit = rng.chance(0.7).then(|| any_u64(rng));
        quota.window = rng.chance(0.7).then(|| any_duration(rng));
        quota.remaining = rng.chance(0.7).then(|| any_u64(rng));
        quota.reset = rng.chance(0.7).then(|| any_duration(rng));
        feedback = feedback.with_quota(quota);
    }
    feedback
}

fn one_case(seed: u64, runtime: &tokio::runtime::Runtime) {
    let mut rng = Rng::new(seed);
    let clock = FakeClock::new();
    clock.advance(any_duration(&mut rng).min(LONGEST));
    let mut log = format!("seed {seed:#x}: at {:?}", clock.now());
    let mut builder = RateLimiter::builder();
    let mut rates = Vec::new();
    let mut names = Vec::new();
    for _ in 0..rng.range(1, 2) {
        let rate = any_rate(&mut rng);
        let mut limit = Limit::per_second(rate);
        log += &format!(", Limit::per_second({rate:?})");
        if rng.chance(0.2) {
            limit = limit.warmup(Duration::from_secs(rng.below(10)));
            log += ".warmup(..)";
        }
        let name = *rng.pick(&[None, Some("requests"), Some("tokens")]);
        if let Some(name) = name {
            limit = limit.named(name);
            log += &format!(".named({name:?})");
        }
        names.push(name);
        builder = builder.limit(limit);
        rates.push(rate);
    }
    let (learning, margin) = any_learning(&mut rng);
    log += &format!(", {learning:?}");
    let Ok(limiter) = builder.learning(learning).clock(clock.clone()).build() else {
        return;
    };
    let limiter: RateLimiter<Local, FakeClock> = limiter;
    let limits = rates.len();
    // The first limit's cap: the rate its quota last reported, at least one
    // a day.
    let mut cap = f64::INFINITY;
    for _ in 0..16 {
        match rng.below(4) {
            0 => {
                let by = any_duration(&mut rng);
                clock.advance(by);
                log += &format!("\n  advance({by:?})");
            }
            1 | 2 => {
                let now = UNIX_EPOCH + Duration::from_secs(1_714_564_800);
                let feedback = any_feedback(&mut rng, now);
                let estimate = Cost::each((0..limits).map(|_| 1 + rng.below(3) as u32));
                let actual = Cost::each((0..limits).map(|_| any_u64(&mut rng) as u32));
                log += &format!("\n  call({estimate:?}), answered {feedback:?}, cost {actual:?}");
                let timeout = Duration::from_secs(rng.below(100_000));
                let call = runtime.block_on(limiter.try_call(estimate, timeout));
                let call = call.unwrap_or_else(|e| panic!("{log}: {e:?}"));
                let quota = match names[0] {
                    None => feedback.quota(None),
                    name => feedback.quota(name),
                };
                let reported = quota.and_then(|q| match (q.limit, q.window) {
                    (Some(limit), Some(window)) if limit > 0 && !window.is_zero() => {
                        Some((limit as f64 / window.as_secs_f64()).max(1.0 / 86_400.0))
                    }
                    _ => None,
                });
                if let Some(call) = call {
                    cap = reported.unwrap_or(cap);
                    assert!(
                        call.waited() <= timeout,
                        "{log}: waited {:?}",
                        call.waited()
                    );
                    if rng.chance(0.5) {
                        call.finish(&feedback, actual).unwrap();
                    } else {
                        call.learn(&feedback);
                    }
                }
            }
            _ => {
                let snapshot = limiter.snapshot().unwrap();
                log += &format!("\n  snapshot: {snapshot:?}");
                let wait = snapshot.wait();
                assert!(wait <= LONGEST, "{log}");
                let _ = (snapshot.remaining(), snapshot.burst(), snapshot.wait_for(3));
                assert!(snapshot.full_in() <= LONGEST, "{log}");
                let got = limiter.try_reserve(1, wait).unwrap();
                assert_eq!(got, Some(wait), "{log}");
            }
        }
        // Never above the rate configured, never none.
        let (rate, slowest) = (limiter.rate(), limiter.slowest_rate());
        assert!(rate > 0.0 && rate <= rates[0], "{log}: rate {rate}");
        // Never above the first limit's cap under the margin (the least
        // double where that rounds to 0).
        let most = (cap * margin).max(f64::from_bits(1));
        assert!(
            rate <= most * (1.0 + 1e-12),
            "{log}: rate {rate}, cap {cap}"
        );
        let configured = rates.iter().copied().fold(f64::INFINITY, f64::min);
        assert!(
            slowest > 0.0 && slowest <= configured,
            "{log}: slowest {slowest}"
        );
    }
}

#[test]
fn random_answers_under_random_learning_keep_every_bound() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for seed in 0..2000u64 {
        let seed = 0x1EA_0000 + seed;
        if catch_unwind(AssertUnwindSafe(|| one_case(seed, &runtime))).is_err() {
            panic!("failed at seed {seed:#x} (see the message above)");
        }
    }
}
