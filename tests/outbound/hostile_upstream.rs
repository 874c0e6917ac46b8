//! What one answer from a buggy, misconfigured or malicious upstream does to
//! a limiter that learns from it.

use std::time::{Duration, SystemTime};

use paceline::clock::{Clock, FakeClock};
use paceline::outbound::{Call, Feedback};
use paceline::{Limit, RateLimiter};

use crate::documented::{Fake, limiter};

const DAY: Duration = Duration::from_secs(86_400);

/// An answer with `status` and these headers, read as the layer reads one.
fn answer(status: u16, headers: &[(&'static str, &'static str)]) -> Feedback {
    let pairs = headers
        .iter()
        .map(|(name, value)| (*name, value.as_bytes()));
    Feedback::from_headers(status, pairs, SystemTime::now())
}

/// Two calls of one permit each, the first made now and the second at its
/// turn (the fake clock moves on to it), both held open.
fn two_calls(limiter: &Fake) -> (Call<'_>, Call<'_>) {
    futures::executor::block_on(async {
        (
            limiter.call(1).await.unwrap(),
            limiter.call(1).await.unwrap(),
        )
    })
}

/// One call of one permit, made now (its wait sleeps on the fake clock,
/// which moves on by it), answered with `feedback`; how long it waited.
fn call_answered(limiter: &Fake, feedback: &Feedback) -> Duration {
    futures::executor::block_on(async {
        let call = limiter.call(1).await.unwrap();
        let waited = call.waited();
        call.learn(feedback);
        waited
    })
}

/// `Call::settle` said the log empties on "a learned `remaining` that takes
/// stored permits away", so that a settle after it charges the excess at
/// once (2.3 s here). The core logs such a cap instead (`core::learn`), and
/// the settle stays exact: the next caller waits for what the call cost had
/// it reserved it in the first place, capped where the upstream said.
#[test]
fn a_settle_after_a_remaining_that_took_permits_away_is_exact() {
    let clock = FakeClock::new();
    // 10 a second, 10 stored beside the one that goes (a burst of 11),
    // full at the start.
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(10.0).burst(11))
        .clock(clock.clone())
        .build()
        .unwrap();
    futures::executor::block_on(async {
        let call = limiter.call(5).await.unwrap();
        // 5 stored; the upstream says 2 are left: 3 taken away.
        call.learn(&answer(200, &[("X-RateLimit-Remaining", "2")]));
        // It cost 30: exact, 10 stored then 20 at 10 a second (the cap
        // at 2 finds none stored); the excess charged at once after the
        // cap would be 2.3 s.
        call.settle(30).unwrap();
    });
    assert_eq!(limiter.snapshot().unwrap().wait(), Duration::from_secs(2));
}

/// "A `Retry-After` or reset longer than a day is cut to a day", but one
/// too long for a `u64` of seconds was left out: `Retry-After:
/// 99999999999999999999` paused for the default second, where 86401
/// pauses a day, and a spent limit whose reset overflowed stored nothing
/// instead of waiting for it. Longer waits must not pause less.
#[test]
fn a_retry_after_or_reset_too_long_for_a_u64_is_a_day() {
    let huge = "99999999999999999999";
    for value in [huge, "99999999999999999999.5", "18446744073709551616"] {
        let feedback = answer(429, &[("Retry-After", value)]);
        assert_eq!(feedback.retry_after(), Some(DAY), "Retry-After: {value}");
    }
    for name in [
        "RateLimit-Reset",
        "X-RateLimit-Reset",
        "X-RateLimit-Reset-After",
    ] {
        let feedback = answer(200, &[(name, huge)]);
        let reset = feedback.quota(None).and_then(|q| q.reset);
        assert_eq!(reset, Some(DAY), "{name}: {huge}");
    }
    // With units too.
    for value in ["99999999999999999999s", "1h99999999999999999999ms"] {
        let feedback = answer(200, &[("X-RateLimit-Reset-After", value)]);
        let reset = feedback.quota(None).and_then(|q| q.reset);
        assert_eq!(reset, Some(DAY), "{value}");
    }
    let feedback = answer(
        200,
        &[("RateLimit", "\"tokens\";r=0;t=99999999999999999999")],
    );
    let reset = feedback.quota(Some("tokens")).and_then(|q| q.reset);
    assert_eq!(reset, Some(DAY));
    // What the limiter makes of it: a pause of a day.
    let clock = FakeClock::new();
    let limiter = limiter(10.0, &clock);
    call_answered(&limiter, &answer(429, &[("Retry-After", huge)]));
    assert_eq!(limiter.snapshot().unwrap().wait(), DAY);
    // Other numbers that overflow are still left out.
    let feedback = answer(429, &[("Retry-After", "-99999999999999999999")]);
    assert_eq!(feedback.retry_after(), None);
}

/// The lines of one `RateLimit-Policy` or `RateLimit` header are one list
/// (a client or a proxy may join them with commas, or not), but were read
/// as different headers, the first line winning: a quota of 100 a second
/// with 50 left, then 10 a second spent for 30 s, let the next caller go
/// 10 ms later, where the same lines joined paused it 30 s.
#[test]
fn the_lines_of_one_list_header_are_one_list() {
    let lines = answer(
        200,
        &[
            ("RateLimit-Policy", "100;w=1"),
            ("RateLimit", "remaining=50, reset=1"),
            ("RateLimit-Policy", "10;w=1"),
            ("RateLimit", "remaining=0, reset=30"),
        ],
    );
    let joined = answer(
        200,
        &[
            ("RateLimit-Policy", "100;w=1, 10;w=1"),
            ("RateLimit", "remaining=50, reset=1, remaining=0, reset=30"),
        ],
    );
    assert_eq!(lines, joined);
    let quota = lines.quota(None).unwrap();
    assert_eq!((quota.limit, quota.remaining), (Some(10), Some(0)));
    assert_eq!(quota.reset, Some(Duration::from_secs(30)));
    let clock = FakeClock::new();
    let limiter = limiter(100.0, &clock);
    call_answered(&limiter, &lines);
    assert_eq!(limiter.snapshot().unwrap().wait(), Duration::from_secs(30));
}

/// Two policies of one name both spent, one until a reset 1 s away and the
/// other 30 s: a call waits until both have room, but the first reset was
/// kept (of two as few left, the first read), and the next caller went
/// after 1 s. Now the later reset is kept: it waits 30 s, in either order,
/// in one line or two.
#[test]
fn two_spent_policies_keep_the_later_reset() {
    for lines in [
        &[("RateLimit", "\"tokens\";r=0;t=1, \"tokens\";r=0;t=30")][..],
        &[("RateLimit", "\"tokens\";r=0;t=30, \"tokens\";r=0;t=1")],
        &[
            ("RateLimit", "\"tokens\";r=0;t=1"),
            ("RateLimit", "\"tokens\";r=0;t=30"),
        ],
        &[("RateLimit", "r=0, r=0;t=30, r=0;t=1")],
    ] {
        let feedback = answer(200, lines);
        let quota = feedback.quotas().first().unwrap();
        assert_eq!(quota.remaining, Some(0), "{lines:?}");
        assert_eq!(quota.reset, Some(Duration::from_secs(30)), "{lines:?}");
    }
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(100.0).burst(1).named("tokens"))
        .clock(clock.clone())
        .build()
        .unwrap();
    let spent = answer(
        200,
        &[("RateLimit", "\"tokens\";r=0;t=1, \"tokens\";r=0;t=30")],
    );
    call_answered(&limiter, &spent);
    assert_eq!(limiter.snapshot().unwrap().wait(), Duration::from_secs(30));
}

/// A rate that falls leaves the debt as it was charged: the limiter does
/// not make a caller already charged pay again.
#[test]
fn a_quota_that_falls_leaves_the_debt_as_charged() {
    let clock = FakeClock::new();
    let limiter = limiter(10.0, &clock);
    let policy = |policy| answer(200, &[("RateLimit-Policy", policy)]);
    call_answered(&limiter, &policy("10;w=1"));
    call_answered(&limiter, &policy("1;w=1"));
    // The second call was charged at 9.7 a second, then the rate fell to
    // 0.97: the third waits what the second was charged (0.103 s, not
    // 1.03 s).
    let waited = call_answered(&limiter, &policy("1;w=1"));
    assert!(
        waited.abs_diff(Duration::from_secs_f64(1.0 / 9.7)) < Duration::from_millis(1),
        "{waited:?}"
    );
}

/// A rate that rises while callers wait their turns: the next caller goes
/// after all of them, one interval of the new rate after the last at the
/// least (repricing the whole debt let it go at once, among five callers
/// still waiting).
#[test]
fn a_rate_that_rises_puts_no_caller_among_those_waiting() {
    let clock = FakeClock::new();
    let limiter = limiter(10.0, &clock);
    let policy = |policy| answer(200, &[("RateLimit-Policy", policy)]);
    let (first, second) = two_calls(&limiter);
    first.learn(&policy("1;w=1"));
    // Five callers take their turns at 0.97 a second.
    let waits: Vec<Duration> = (0..5).map(|_| limiter.reserve(1).unwrap()).collect();
    second.learn(&policy("10;w=1"));
    assert!((limiter.rate() - 9.7).abs() < 1e-9, "{}", limiter.rate());
    let next = limiter.reserve(1).unwrap();
    let after_the_last = waits[4] + Duration::from_secs_f64(1.0 / 9.7);
    assert!(
        next + Duration::from_millis(1) >= after_the_last,
        "the next caller waits {next:?}, the five {waits:?}"
    );
}

/// The rate falls, then rises back, between two requests: the last cost,
/// charged at the higher rate, stays; the next caller waits it (repricing
/// it as if charged at the lower rate let the next go 10 ms after one that
/// went now).
#[test]
fn a_fall_then_a_rise_between_two_requests_leaves_the_last_cost() {
    let clock = FakeClock::new();
    let limiter = limiter(10.0, &clock);
    let policy = |policy| answer(200, &[("RateLimit-Policy", policy)]);
    let (first, second) = two_calls(&limiter);
    // The first went at 0, the second at 0.1 s (now), charged 0.1 s.
    assert_eq!(second.waited(), Duration::from_millis(100));
    first.learn(&policy("1;w=1"));
    second.learn(&policy("10;w=1"));
    assert!((limiter.rate() - 9.7).abs() < 1e-9, "{}", limiter.rate());
    let next = limiter.reserve(1).unwrap();
    assert!(next >= Duration::from_millis(99), "{next:?}");
}

/// Two calls held open whose answers alternate between two quotas (two
/// upstream servers behind a balancer that disagree), a pair of answers
/// between each two requests: the rate is never above 10 a second, and
/// neither are the callers (repricing a rise let 97 go in a second).
#[test]
fn alternating_quotas_let_the_callers_go_no_faster_than_the_rate() {
    let clock = FakeClock::new();
    let limiter = limiter(10.0, &clock);
    let policy = |policy| answer(200, &[("RateLimit-Policy", policy)]);
    let (low, high) = two_calls(&limiter);
    let start = clock.now_micros();
    let mut moments = Vec::new();
    for _ in 0..200 {
        low.learn(&policy("1;w=1"));
        high.learn(&policy("10;w=1"));
        let wait = limiter.reserve(1).unwrap();
        clock.advance(wait);
        moments.push(clock.now_micros());
    }
    let in_a_second = moments.iter().filter(|&&m| m < start + 1_000_000).count();
    assert!(in_a_second <= 11, "{in_a_second} callers in one second");
}

/// A quota spent until a reset 30 s away, then a higher quota from a call
/// sent before (nothing said of what is left), or both in one answer: the
/// next caller waits for the reset (repricing the rise took the pause for
/// a permit's cost, and the next went after 50 ms).
#[test]
fn a_rise_after_a_spent_quota_keeps_the_reset() {
    for together in [false, true] {
        let clock = FakeClock::new();
        let limiter = limiter(10.0, &clock);
        let (first, second) = two_calls(&limiter);
        let spent = ("RateLimit", "r=0;t=30");
        if together {
            first.learn(&answer(200, &[("RateLimit-Policy", "1;w=60")]));
            second.learn(&answer(200, &[("RateLimit-Policy", "600;w=60"), spent]));
        } else {
            first.learn(&answer(200, &[("RateLimit-Policy", "1;w=60"), spent]));
            second.learn(&answer(200, &[("RateLimit-Policy", "600;w=60")]));
        }
        let next = limiter.reserve(1).unwrap();
        assert!(next >= Duration::from_secs(29), "{together}: {next:?}");
    }
}

/// A cold warming-up limit's stored permits slow it down (2 a second,
/// cold factor 3: the callers go 1.375 s, 1.125 s, 875 ms, 625 ms apart),
/// so an answer that says nothing is left, or refuses, must not take them
/// away: both did, and warmed it up, the callers after going 500 ms apart
/// ("none left" made it run faster than before), or 714 ms after the
/// refusal (its 0.7 of the rate, from warm).
#[test]
fn none_left_or_a_refusal_never_warms_a_cold_limit_up() {
    let waits = |feedback: Option<Feedback>| {
        let clock = FakeClock::new();
        let limiter = RateLimiter::builder()
            .permits_per_second(2.0)
            .warmup(Duration::from_secs(4))
            .clock(clock.clone())
            .build()
            .unwrap();
        let first = call_answered(&limiter, &feedback.unwrap_or_else(|| Feedback::new(200)));
        let waits: Vec<u128> = (0..4)
            .map(|_| call_answered(&limiter, &Feedback::new(200)).as_millis())
            .collect();
        assert_eq!(first, Duration::ZERO);
        waits
    };
    let cold = waits(None);
    assert_eq!(cold, [1_375, 1_125, 875, 625]);
    let none_left = answer(200, &[("X-RateLimit-Remaining", "0")]);
    assert_eq!(waits(Some(none_left)), cold);
    // The refusal pauses for 1 s, inside the first call's own 1.375 s, and
    // lowers the rate to 1.4 a second: every wait at least as long.
    let refused = waits(Some(answer(429, &[("Retry-After", "1")])));
    assert!(
        refused
            .iter()
            .zip(&cold)
            .all(|(refused, cold)| refused >= cold),
        "{refused:?}, cold {cold:?}"
    );
}
