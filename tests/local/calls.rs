//! Calls to an upstream on the in-process limiters: `call`, `settle` and
//! the end of a call, against the core's `Limits` (whose settles equal a
//! twin that reserved the real costs: `settle.rs`), for one limiter and
//! for a key of a keyed one.

use crate::support;

use std::time::Duration;

use paceline::clock::FakeClock;
use paceline::core::{Bursty, Limits, Policy, State, WarmingUp};
use paceline::{Cost, Error, KeyedRateLimiter, Limit, RateLimiter};
use support::rng::Rng;

/// The idle time that stores `permits` at `rate`, as `Limit::burst` sets it.
fn stored_for(permits: f64, rate: f64) -> Duration {
    let mut micros = (permits * 1e6 / rate).ceil();
    if micros * rate / 1e6 < permits {
        micros += 1.0;
    }
    Duration::from_micros(micros as u64)
}

/// The limits a test runs, requests (bursty or warming-up) and tokens, and
/// their states as the builder makes them (full).
fn limits(rng: &mut Rng) -> (Vec<Limit>, Vec<State>) {
    let requests = [5.0, 20.0, 100.0][rng.below(3) as usize];
    let tokens = requests * 50.0;
    let (first, policy) = if rng.chance(0.3) {
        let warmup = Duration::from_millis(rng.range(1, 2_000));
        (
            Limit::per_second(requests).warmup(warmup),
            Policy::WarmingUp(WarmingUp::new(warmup, 3.0)),
        )
    } else {
        let burst = rng.range(1, 5);
        (
            Limit::per_second(requests).burst(burst),
            Policy::Bursty(Bursty::new(stored_for(burst as f64 - 1.0, requests))),
        )
    };
    let states = vec![
        State::full(policy, requests, 0).unwrap(),
        State::full(Policy::Bursty(Bursty::new(Duration::ZERO)), tokens, 0).unwrap(),
    ];
    (vec![first, Limit::per_second(tokens).burst(1)], states)
}

/// One limiter, or one key of a keyed one, driven the same way.
enum Subject {
    One(Box<RateLimiter<paceline::Local, FakeClock>>),
    Keyed(Box<KeyedRateLimiter<String, paceline::Local, FakeClock>>),
}

impl Subject {
    async fn call(&self, cost: Cost) -> paceline::outbound::Call<'_> {
        match self {
            Subject::One(limiter) => limiter.call(cost).await.unwrap(),
            Subject::Keyed(limiter) => limiter.call("upstream", cost).await.unwrap(),
        }
    }
}

/// Calls settled at random moments after their estimates, ended in any
/// order, with idle time between: each call waits what the core's
/// `Limits` says, to the microsecond, on a limiter and on a key.
#[tokio::test(flavor = "current_thread")]
async fn calls_wait_and_settle_as_the_core_on_every_in_process_limiter() {
    for seed in 0..300 {
        let mut rng = Rng::new(0xCA11_0000 + seed);
        let (config, states) = limits(&mut rng);
        let clock = FakeClock::new();
        let subject = if seed % 2 == 0 {
            let mut builder = RateLimiter::builder().clock(clock.clone());
            for limit in config {
                builder = builder.limit(limit);
            }
            Subject::One(Box::new(builder.build().unwrap()))
        } else {
            let mut builder = KeyedRateLimiter::<String>::builder().clock(clock.clone());
            for limit in config {
                builder = builder.limit(limit);
            }
            Subject::Keyed(Box::new(builder.build().unwrap()))
        };
        let mut core = Limits::new(states).unwrap();
        let mut now = 0;
        let mut open = Vec::new();
        for step in 0..40 {
            match rng.below(4) {
                0 | 1 => {
                    let estimate = Cost::each([1, rng.range(1, 200) as u32]);
                    let expected = core.open(&estimate, now, u64::MAX).unwrap();
                    let call = subject.call(estimate.clone()).await;
                    assert_eq!(
                        call.waited().as_micros() as u64,
                        expected.wait_micros,
                        "seed {seed} step {step}"
                    );
                    now += expected.wait_micros;
                    open.push((call, expected.id.unwrap()));
                }
                2 if !open.is_empty() => {
                    let at = rng.below(open.len() as u64) as usize;
                    let actual = Cost::each([1, rng.below(300) as u32]);
                    let (call, id) = open.swap_remove(at);
                    if rng.chance(0.8) {
                        assert!(core.settle(id, call.estimate(), &actual, now));
                        call.settle(actual).unwrap();
                    } else {
                        drop(call);
                    }
                    core.keep(id, now);
                }
                _ => {
                    let gap = rng.range(0, 100_000);
                    clock.advance(Duration::from_micros(gap));
                    now += gap;
                }
            }
        }
    }
}

/// A call whose `call` future is dropped while it waits gives its
/// estimate back: the next caller waits as if it had never been made.
#[tokio::test(flavor = "current_thread")]
async fn a_call_dropped_while_it_waits_gives_its_estimate_back() {
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(1.0).burst(1))
        .build()
        .unwrap();
    let first = limiter.call(1).await.unwrap();
    drop(first);
    // The second waits a second: dropped after 20 ms.
    let waited = tokio::time::timeout(Duration::from_millis(20), limiter.call(1)).await;
    assert!(waited.is_err());
    // Without the give-back the next would wait about two seconds.
    let wait = limiter.snapshot().unwrap().wait();
    assert!(wait <= Duration::from_secs(1), "{wait:?}");
}

/// A call settles exactly while the log holds it: here after other calls
/// came and ended, and it gives back what it did not use. Once more
/// requests than the log holds have come after it, a smaller cost gives
/// nothing back (erring towards limiting) and a larger one is charged.
#[tokio::test(flavor = "current_thread")]
async fn a_call_settles_exactly_while_the_log_holds_it() {
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(1_000.0).burst(1))
        .clock(FakeClock::new())
        .build()
        .unwrap();
    let call = limiter.call(50).await.unwrap();
    for _ in 0..100 {
        drop(limiter.call(1).await.unwrap());
    }
    // 50 + 100 permits at 1 000/s: the clock stands at 150 ms, and the
    // next is due at 151 ms.
    assert_eq!(limiter.snapshot().unwrap().wait(), Duration::from_millis(1));
    call.settle(10).unwrap();
    // 40 fewer: the next was due 40 ms ago.
    assert_eq!(limiter.snapshot().unwrap().wait(), Duration::ZERO);

    for (actual, wait) in [(10, 1), (60, 11)] {
        drop(limiter.call(1).await.unwrap());
        let call = limiter.call(50).await.unwrap();
        for _ in 0..1_100 {
            drop(limiter.call(1).await.unwrap());
        }
        assert_eq!(limiter.snapshot().unwrap().wait(), Duration::from_millis(1));
        call.settle(actual).unwrap();
        let next = limiter.snapshot().unwrap().wait();
        assert_eq!(next, Duration::from_millis(wait), "settled at {actual}");
    }
}

/// Costs that do not fit the limiter are errors, and change nothing.
#[tokio::test(flavor = "current_thread")]
async fn costs_that_do_not_fit_are_errors() {
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(10.0).burst(1))
        .limit(Limit::per_second(1_000.0).burst(1))
        .clock(FakeClock::new())
        .build()
        .unwrap();
    for cost in [
        Cost::from(0),
        Cost::each([0, 0]),
        Cost::each([1, 2, 3]),
        Cost::each([]),
    ] {
        let error = limiter.call(cost.clone()).await.unwrap_err();
        assert!(
            matches!(error, Error::InvalidArgument(_)),
            "{cost:?}: {error}"
        );
    }
    let call = limiter.call(Cost::each([1, 100])).await.unwrap();
    assert_eq!(call.estimate(), &Cost::each([1, 100]));
    assert!(call.settle(Cost::each([1, 2, 3])).is_err());
    // The call ended at its estimate: 100 tokens at 1 000/s.
    assert_eq!(
        limiter.snapshot().unwrap().wait(),
        Duration::from_millis(100)
    );
    // A call may cost nothing in the end.
    let call = limiter.call(Cost::each([1, 100])).await.unwrap();
    call.settle(Cost::each([0, 0])).unwrap();
    assert_eq!(limiter.snapshot().unwrap().wait(), Duration::ZERO);
}

/// A count of 0 for a limit charges it nothing, but the call still waits
/// for what that limit owes: a call whose tokens are known only from its
/// answer (estimated at 0, settled after) goes once the tokens of the calls
/// before it are paid for.
#[tokio::test(flavor = "current_thread")]
async fn a_call_that_costs_a_limit_nothing_waits_for_its_debt() {
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(100.0).burst(1))
        .limit(Limit::per_second(1_000.0).burst(1))
        .clock(clock.clone())
        .build()
        .unwrap();
    // 500 tokens settled after: the tokens owe 0.5 s.
    let call = limiter.call(Cost::each([1, 0])).await.unwrap();
    call.settle(Cost::each([1, 500])).unwrap();
    assert!(
        limiter
            .try_call(Cost::each([1, 0]), Duration::from_millis(499))
            .await
            .unwrap()
            .is_none()
    );
    let call = limiter
        .try_call(Cost::each([1, 0]), Duration::from_millis(500))
        .await
        .unwrap()
        .expect("goes once the tokens are paid for");
    assert_eq!(call.waited(), Duration::from_millis(500));
    // It charged the tokens nothing: the next waits for its request alone.
    drop(call);
    assert_eq!(
        limiter.snapshot().unwrap().wait(),
        Duration::from_millis(10)
    );
}

/// A key's calls settle that key alone.
#[tokio::test(flavor = "current_thread")]
async fn a_keys_settle_leaves_other_keys_alone() {
    let limiter = KeyedRateLimiter::<String>::builder()
        .limit(Limit::per_second(10.0).burst(1))
        .clock(FakeClock::new())
        .build()
        .unwrap();
    let a = limiter.call("a", 5).await.unwrap();
    drop(limiter.call("b", 5).await.unwrap());
    a.settle(1).unwrap();
    assert_eq!(
        limiter.snapshot("a").unwrap().wait(),
        Duration::from_millis(100)
    );
    assert_eq!(
        limiter.snapshot("b").unwrap().wait(),
        Duration::from_millis(500)
    );
}

/// A rate the upstream reports is its quota over its window, both numbers
/// it chose: one permit in 2^64 seconds paused every caller for the 285
/// years time saturates at. Like a `Retry-After` or a reset, no answer
/// makes the callers wait more than about a day: a quota of less than one
/// a day reads as one a day.
#[tokio::test(flavor = "current_thread")]
async fn a_reported_rate_never_makes_callers_wait_more_than_about_a_day() {
    use paceline::outbound::Feedback;
    use std::time::SystemTime;

    let day = 86_400.0;
    for (policy, rate) in [
        (&b"1;w=18446744073709551615"[..], 1.0 / day),
        (b"1;w=172800", 1.0 / day),
        (b"7;w=604800", 1.0 / day),
        (b"2;w=86400", 2.0 / day),
    ] {
        let clock = FakeClock::new();
        let limiter = RateLimiter::builder()
            .limit(Limit::per_second(10.0).burst(1))
            .clock(clock.clone())
            .build()
            .unwrap();
        let call = limiter.call(1).await.unwrap();
        call.learn(&Feedback::from_headers(
            200,
            [("RateLimit-Policy", policy)],
            SystemTime::now(),
        ));
        drop(call);
        let policy = String::from_utf8_lossy(policy);
        assert_eq!(limiter.rate(), rate * 0.97, "{policy}");
        limiter.reserve(1).unwrap();
        let wait = limiter.snapshot().unwrap().wait();
        assert!(
            wait <= Duration::from_secs_f64(day / 0.97 + 1.0),
            "{policy}: {wait:?}"
        );
    }
}

/// A refusal fed back through a call pauses the limiter until its
/// `Retry-After` and lowers its rate; what the upstream reports of its
/// limits caps them; a keyed limiter learns per key.
#[tokio::test(flavor = "current_thread")]
async fn calls_teach_the_limiter_the_upstreams_limit() {
    use paceline::outbound::Feedback;
    use std::time::SystemTime;

    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(100.0).named("requests"))
        .limit(Limit::per_second(6_000.0).named("tokens"))
        .clock(clock.clone())
        .build()
        .unwrap();
    let call = limiter.call(Cost::each([1, 50])).await.unwrap();
    let refused: [(&str, &[u8]); 1] = [("retry-after", b"2")];
    call.learn(&Feedback::from_headers(429, refused, SystemTime::now()));
    call.settle(Cost::each([1, 0])).unwrap();
    let snapshot = limiter.snapshot().unwrap();
    assert_eq!(snapshot.wait(), Duration::from_secs(2));
    assert_eq!(limiter.rate(), 70.0);
    // After the pause: one interval of 70/s apart, no burst.
    let first = limiter.call(1).await.unwrap();
    assert_eq!(first.waited(), Duration::from_secs(2));
    drop(first);
    let second = limiter.call(1).await.unwrap();
    assert!(
        second
            .waited()
            .abs_diff(Duration::from_secs_f64(1.0 / 70.0))
            <= Duration::from_micros(1)
    );

    // The upstream says: 50 requests and 3 000 tokens a second.
    let policy: [(&str, &[u8]); 1] = [(
        "ratelimit-policy",
        b"\"requests\";q=50;w=1, \"tokens\";q=3000;w=1",
    )];
    second.learn(&Feedback::from_headers(200, policy, SystemTime::now()));
    drop(second);
    assert_eq!(limiter.rate(), 50.0 * 0.97 * 0.7);

    let keyed = KeyedRateLimiter::<String>::builder()
        .limit(Limit::per_second(10.0))
        .clock(clock.clone())
        .build()
        .unwrap();
    let call = keyed.call("a", 1).await.unwrap();
    call.learn(&Feedback::new(429).with_retry_after(Duration::from_secs(5)));
    drop(call);
    assert_eq!(keyed.snapshot("a").unwrap().wait(), Duration::from_secs(5));
    assert_eq!(keyed.snapshot("a").unwrap().rate(), 7.0);
    assert_eq!(keyed.snapshot("b").unwrap().wait(), Duration::ZERO);
    assert_eq!(keyed.snapshot("b").unwrap().rate(), 10.0);
}

/// What the upstream says is left caps what a limiter (and a key) stores,
/// and the call's settle after the lesson does not undo it.
#[tokio::test(flavor = "current_thread")]
async fn a_cap_on_what_is_left_survives_the_settle() {
    use paceline::outbound::{Feedback, Quota};
    let clock = FakeClock::new();
    let two_left = || {
        let mut quota = Quota::default();
        quota.remaining = Some(2);
        Feedback::new(200).with_quota(quota)
    };
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(10.0))
        .clock(clock.clone())
        .build()
        .unwrap();
    let call = limiter.call(1).await.unwrap();
    call.learn(&two_left());
    call.settle(1).unwrap();
    let mut at_once = 0;
    while limiter.try_reserve(1, Duration::ZERO).unwrap().is_some() && at_once < 20 {
        at_once += 1;
    }
    assert_eq!(
        at_once, 2,
        "the 2 left, the one when nothing is owed among them"
    );

    let keyed = KeyedRateLimiter::<u64>::builder()
        .limit(Limit::per_second(10.0))
        .clock(clock.clone())
        .build()
        .unwrap();
    let call = keyed.call(&7, 1).await.unwrap();
    call.learn(&two_left());
    call.settle(1).unwrap();
    let mut at_once = 0;
    while keyed.try_reserve(&7, 1, Duration::ZERO).unwrap().is_some() && at_once < 20 {
        at_once += 1;
    }
    assert_eq!(
        at_once, 2,
        "a key: the 2 left, the one when nothing is owed among them"
    );
}

/// A refused call that cost none of its tokens: `finish` settles it before
/// the refusal's pause empties the log, so the tokens come back and the
/// next caller waits for the pause alone, as after a call that reserved
/// its real cost; learning first and then settling leaves them owed past
/// the pause (as `Call::learn` says). A cost that does not fit is an
/// error, the call ends at its estimate, and the answer is learned all
/// the same.
#[tokio::test(flavor = "current_thread")]
async fn finish_settles_before_the_answers_pause() {
    use paceline::outbound::Feedback;
    let refusal = Feedback::new(429).with_retry_after(Duration::from_secs(1));
    // 10 requests and 1 000 tokens a second, none stored.
    let limiter = || {
        RateLimiter::builder()
            .limit(Limit::per_second(10.0).burst(1))
            .limit(Limit::per_second(1_000.0).burst(1))
            .clock(FakeClock::new())
            .build()
            .unwrap()
    };
    let next_wait = |limiter: &RateLimiter<paceline::Local, FakeClock>| {
        limiter.snapshot().unwrap().wait_for(1).unwrap()
    };
    // 5 000 tokens estimated (5 s of them), none used.
    let (finished, learned_first, twin) = (limiter(), limiter(), limiter());
    let call = finished.call(Cost::each([1, 5_000])).await.unwrap();
    call.finish(&refusal, Cost::each([1, 0])).unwrap();
    let call = learned_first.call(Cost::each([1, 5_000])).await.unwrap();
    call.learn(&refusal);
    call.settle(Cost::each([1, 0])).unwrap();
    let call = twin.call(Cost::each([1, 0])).await.unwrap();
    call.learn(&refusal);
    drop(call);
    assert_eq!(next_wait(&finished), Duration::from_secs(1));
    assert_eq!(next_wait(&finished), next_wait(&twin));
    assert_eq!(next_wait(&learned_first), Duration::from_secs(5));
    // A cost for a third limit: refused, the call ended at its estimate
    // (its 500 tokens owed for 0.5 s after its moment, at the end of the
    // first pause), and the second refusal learned: paused a second from
    // now.
    let call = finished.call(Cost::each([0, 500])).await.unwrap();
    let error = call.finish(&refusal, Cost::each([1, 0, 1])).unwrap_err();
    assert!(matches!(error, Error::InvalidArgument(_)), "{error}");
    assert_eq!(next_wait(&finished), Duration::from_secs(1));
}
