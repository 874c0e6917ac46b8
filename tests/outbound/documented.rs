//! Probes of the outbound module's promises: the learning policy's numbers,
//! `Call`'s settle and wait, and the `OutboundLayer`'s estimate and real
//! cost on every path a request can take (answered, refused, failed,
//! dropped).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use paceline::clock::{Clock, FakeClock};
use paceline::outbound::{Feedback, Learning, Quota};
use paceline::{Cost, Error, Limit, RateLimiter};

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// A limiter on the fake clock.
pub(crate) type Fake = RateLimiter<paceline::Local, FakeClock>;

/// A limiter of `rate` per second, no burst, on `clock`.
pub(crate) fn limiter(rate: f64, clock: &FakeClock) -> Fake {
    RateLimiter::builder()
        .permits_per_second(rate)
        .max_burst(Duration::ZERO)
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// Feeds `feedback` back through one call (of one permit), then ends it.
fn feed(limiter: &Fake, feedback: &Feedback) {
    futures::executor::block_on(async {
        let call = limiter.call(1).await.unwrap();
        call.learn(feedback);
    });
}

fn wait_now(limiter: &Fake) -> Duration {
    limiter.snapshot().unwrap().wait()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9 * b.abs().max(1.0)
}

// ---- The learning policy's numbers ----

/// A 429 without `Retry-After` pauses for `Learning::pause` (1 s) and
/// multiplies the rate by 0.7, once per pause: a second refusal inside the
/// pause lowers nothing, nor does one after it of a call sent before the
/// pause ended; a refusal of a call sent after it lowers again.
#[test]
fn a_refusal_decreases_once_per_pause() {
    let clock = FakeClock::new();
    let limiter = limiter(100.0, &clock);
    futures::executor::block_on(async {
        // Three calls sent before any answer (the second and third wait 10
        // and 20 ms for their turns).
        let a = limiter.call(1).await.unwrap();
        let b = limiter.call(1).await.unwrap();
        let c = limiter.call(1).await.unwrap();
        assert_eq!(clock.now(), ms(20));
        a.learn(&Feedback::new(429));
        assert!(close(limiter.rate(), 70.0), "{}", limiter.rate());
        // The pause: 1 s from the answer.
        assert_eq!(wait_now(&limiter), ms(1_000));
        // Another refusal inside the pause lowers nothing, and does not
        // move the pause (it ends at 1.02 s either way: 0.5 s + 1 s later).
        clock.advance(ms(500));
        b.learn(&Feedback::new(429));
        assert!(close(limiter.rate(), 70.0), "{}", limiter.rate());
        // After the pause, the refusal of a call sent before it ended (at
        // 20 ms) lowers nothing, and pauses from now.
        clock.advance(ms(2_000));
        c.learn(&Feedback::new(429));
        assert!(close(limiter.rate(), 70.0), "{}", limiter.rate());
        // A call sent after that pause, refused: lowered again.
        let d = limiter.call(1).await.unwrap();
        d.learn(&Feedback::new(429));
        assert!(close(limiter.rate(), 49.0), "{}", limiter.rate());
    });
}

/// Refusals bring the rate down to the floor, no lower (default 0.05).
#[test]
fn refusals_stop_at_the_floor() {
    let clock = FakeClock::new();
    let limiter = limiter(100.0, &clock);
    for _ in 0..40 {
        feed(&limiter, &Feedback::new(429));
        clock.advance(Duration::from_secs(2));
    }
    assert!(close(limiter.rate(), 5.0), "{}", limiter.rate());
    let limiter = RateLimiter::builder()
        .permits_per_second(100.0)
        .learning(Learning::default().floor(0.5).decrease(0.5))
        .clock(clock.clone())
        .build()
        .unwrap();
    for _ in 0..5 {
        feed(&limiter, &Feedback::new(429));
        clock.advance(Duration::from_secs(2));
    }
    assert!(close(limiter.rate(), 50.0), "{}", limiter.rate());
}

/// After the pause, each interval of successes (of calls that went after
/// it) adds back 0.05 of the configured rate; a success during the pause
/// adds nothing.
#[test]
fn successes_after_the_pause_add_back_one_step_an_interval() {
    let clock = FakeClock::new();
    let limiter = limiter(100.0, &clock);
    futures::executor::block_on(async {
        let calls: Vec<_> = futures_calls(&limiter, 8).await;
        let t0 = clock.now();
        let mut calls = calls.into_iter();
        calls.next().unwrap().learn(&Feedback::new(429)); // paused to t0 + 1 s
        assert!(close(limiter.rate(), 70.0));
        let at = |target: Duration| {
            let now = clock.now();
            assert!(target >= now);
            clock.advance(target - now);
        };
        // (When, after the refusal; the answer; the rate after it.)
        let steps = [
            // Inside the pause: nothing.
            (500, 200, 70.0),
            // Right after the pause, and within one interval of it: nothing.
            (1_500, 200, 70.0),
            // One interval after the pause: + 5.
            (2_000, 200, 75.0),
            // Not again within the interval.
            (2_900, 200, 75.0),
            (3_000, 200, 80.0),
            // A non-2xx answer that is no refusal adds nothing.
            (5_000, 500, 80.0),
        ];
        for (after, status, rate) in steps {
            at(t0 + ms(after));
            // Inside the pause, a call that went before it; after it, one
            // that goes now (at once).
            let call = match after < 1_000 {
                true => calls.next().unwrap(),
                false => limiter.call(1).await.unwrap(),
            };
            assert_eq!(clock.now(), t0 + ms(after));
            call.learn(&Feedback::new(status));
            assert!(
                close(limiter.rate(), rate),
                "{after} ms after the refusal, a {status}: {}",
                limiter.rate()
            );
        }
    });
    for _ in 0..100 {
        clock.advance(Duration::from_secs(1));
        feed(&limiter, &Feedback::new(204));
    }
    assert!(close(limiter.rate(), 100.0), "{}", limiter.rate());
}

/// Successes of calls that went before a refusal's pause ended raise
/// nothing, as their refusals would lower nothing: they answer the load
/// the refusal answered. Ten calls in flight (an upstream that takes
/// seconds to answer), an eleventh refused: their successes, one a second
/// after the pause, gave the 0.7 back in six seconds (10 a second again,
/// the rate that was refused).
#[test]
fn successes_of_calls_that_went_before_the_pause_raise_nothing() {
    let clock = FakeClock::new();
    let limiter = limiter(10.0, &clock);
    futures::executor::block_on(async {
        let calls = futures_calls(&limiter, 10).await;
        let refused = limiter.call(1).await.unwrap();
        refused.learn(&Feedback::new(429).with_retry_after(ms(1_000)));
        drop(refused);
        assert!(close(limiter.rate(), 7.0));
        for call in calls {
            clock.advance(ms(1_000));
            call.learn(&Feedback::new(200));
        }
        assert!(close(limiter.rate(), 7.0), "{}", limiter.rate());
        // A call that went after the pause raises it.
        let after = limiter.call(1).await.unwrap();
        clock.advance(ms(1_000));
        after.learn(&Feedback::new(200));
        assert!(close(limiter.rate(), 7.5), "{}", limiter.rate());
    });
}

/// `n` calls taken now, before any answer.
async fn futures_calls(limiter: &Fake, n: usize) -> Vec<paceline::outbound::Call<'_>> {
    let mut calls = Vec::new();
    for _ in 0..n {
        calls.push(limiter.call(1).await.unwrap());
    }
    calls
}

/// A rate the upstream reports caps its limit at 0.97 of it (the margin),
/// never above the configured rate.
#[test]
fn a_reported_rate_caps_at_the_margin_never_above_the_configured_rate() {
    let clock = FakeClock::new();
    let limiter = limiter(100.0, &clock);
    let mut quota = Quota::default();
    quota.limit = Some(50);
    quota.window = Some(Duration::from_secs(1));
    feed(&limiter, &Feedback::new(200).with_quota(quota.clone()));
    assert!(close(limiter.rate(), 48.5), "{}", limiter.rate());
    // Above the configured rate: the configured rate.
    let limiter2 = crate::documented::limiter(10.0, &clock);
    feed(&limiter2, &Feedback::new(200).with_quota(quota.clone()));
    assert!(close(limiter2.rate(), 10.0), "{}", limiter2.rate());
    // Another margin.
    let limiter3 = RateLimiter::builder()
        .permits_per_second(100.0)
        .learning(Learning::default().margin(0.5))
        .clock(clock.clone())
        .build()
        .unwrap();
    feed(&limiter3, &Feedback::new(200).with_quota(quota));
    assert!(close(limiter3.rate(), 25.0), "{}", limiter3.rate());
}

/// A refusal that reports the rate of every limit lowers nothing (the
/// pause is enough): named limits, each its quota.
#[test]
fn a_refusal_reporting_every_named_rate_lowers_nothing() {
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(100.0).named("requests"))
        .limit(Limit::per_second(10_000.0).named("Tokens"))
        .clock(clock.clone())
        .build()
        .unwrap();
    let headers: [(&str, &[u8]); 3] = [
        (
            "RateLimit-Policy",
            b"\"requests\";q=50;w=1, \"tokens\";q=3000;w=1",
        ),
        ("RateLimit", b"\"requests\";r=10;t=1, \"tokens\";r=100;t=1"),
        ("Retry-After", b"2"),
    ];
    let feedback = Feedback::from_headers(429, headers, SystemTime::now());
    feed(&limiter, &feedback);
    assert!(close(limiter.rate(), 48.5), "{}", limiter.rate());
    assert!(
        close(limiter.slowest_rate(), 48.5),
        "{}",
        limiter.slowest_rate()
    );
    let wait = wait_now(&limiter);
    assert!(wait > ms(1_900) && wait <= ms(2_000), "{wait:?}");
    // Tokens: capped at 0.97 × 3000 = 2910/s: 291 tokens take 0.1 s more
    // than the next request's turn, after the pause.
    clock.advance(ms(2_000));
    let call = futures::executor::block_on(limiter.call(Cost::each([0, 2910]))).unwrap();
    drop(call);
    let next = futures::executor::block_on(limiter.call(Cost::each([0, 1]))).unwrap();
    let waited = next.waited();
    assert!(waited >= ms(999) && waited <= ms(1_001), "{waited:?}");
}

/// A refusal that reports only some limits' rates does lower.
#[test]
fn a_refusal_reporting_some_rates_lowers() {
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .limit(Limit::per_second(100.0).named("requests"))
        .limit(Limit::per_second(10_000.0).named("tokens"))
        .clock(clock.clone())
        .build()
        .unwrap();
    let mut requests = Quota::named("requests");
    requests.limit = Some(50);
    requests.window = Some(Duration::from_secs(1));
    feed(&limiter, &Feedback::new(429).with_quota(requests));
    assert!(close(limiter.rate(), 48.5 * 0.7), "{}", limiter.rate());
}

/// With a concurrent limit beside the rates, a refusal that reports every
/// rate still lowers nothing (a concurrent limit is no rate).
#[test]
fn a_concurrent_limit_is_not_a_rate_to_report() {
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .limit(Limit::concurrent(4))
        .limit(Limit::per_second(100.0))
        .clock(clock.clone())
        .build()
        .unwrap();
    let mut quota = Quota::default();
    quota.limit = Some(50);
    quota.window = Some(Duration::from_secs(1));
    feed(&limiter, &Feedback::new(429).with_quota(quota));
    assert!(close(limiter.rate(), 48.5), "{}", limiter.rate());
}

/// `Retry-After` variants through a real refusal: a date in the past is no
/// pause (but still a refusal); garbage and negative values fall back to
/// `Learning::pause`; a huge one is cut to a day.
#[test]
fn retry_after_variants_set_the_pause() {
    let now = SystemTime::now();
    let pause_of = |value: &[u8]| {
        let clock = FakeClock::new();
        let limiter = limiter(100.0, &clock);
        let feedback = Feedback::from_headers(429, [("Retry-After", value)], now);
        feed(&limiter, &feedback);
        (wait_now(&limiter), limiter.rate())
    };
    let (wait, rate) = pause_of(b"Sun, 06 Nov 1994 08:49:37 GMT");
    assert!(wait <= ms(10), "{wait:?}");
    assert!(close(rate, 70.0), "{rate}");
    for garbage in [&b"soon"[..], b"-5", b"", b"1e3", b"0x10", b"5."] {
        let (wait, rate) = pause_of(garbage);
        assert!(
            wait > ms(990) && wait <= ms(1_000),
            "{:?}: {wait:?}",
            String::from_utf8_lossy(garbage)
        );
        assert!(close(rate, 70.0));
    }
    for huge in [
        &b"99999999999999999999999"[..],
        b"18446744073709551615",
        b"864000",
        b"Fri, 31 Dec 9999 23:59:59 GMT",
    ] {
        let (wait, _) = pause_of(huge);
        eprintln!("{}: {wait:?}", String::from_utf8_lossy(huge));
        // Overflow leaves it out (the default pause); otherwise a day at most.
        assert!(wait <= Duration::from_secs(86_400), "{wait:?}");
    }
    let (wait, _) = pause_of(b"864000");
    assert_eq!(wait, Duration::from_secs(86_400));
    let (wait, _) = pause_of(b"1.5");
    assert_eq!(wait, ms(1_500));
    // 503 with Retry-After is a refusal, without it is not.
    let clock = FakeClock::new();
    let l = limiter(100.0, &clock);
    feed(&l, &Feedback::new(503));
    assert!(close(l.rate(), 100.0));
    assert_eq!(wait_now(&l), ms(10)); // the call's own permit
    feed(&l, &Feedback::new(503).with_retry_after(ms(300)));
    assert!(close(l.rate(), 70.0));
}

/// `Learning::pause(0)`: a refusal without `Retry-After` pauses nothing, and
/// two such refusals at once decrease... once per pause.
#[test]
fn a_zero_pause_refusal() {
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .permits_per_second(100.0)
        .max_burst(Duration::ZERO)
        .learning(Learning::default().pause(Duration::ZERO))
        .clock(clock.clone())
        .build()
        .unwrap();
    feed(&limiter, &Feedback::new(429));
    eprintln!("rate {} wait {:?}", limiter.rate(), wait_now(&limiter));
    assert!(close(limiter.rate(), 70.0));
}

/// A spent limit (remaining 0) with a reset waits for it; one with some left
/// stores no more than that.
#[test]
fn remaining_zero_waits_for_the_reset() {
    let clock = FakeClock::new();
    let limiter = RateLimiter::builder()
        .permits_per_second(100.0)
        .clock(clock.clone())
        .build()
        .unwrap();
    clock.advance(Duration::from_secs(10));
    let mut quota = Quota::default();
    quota.remaining = Some(0);
    quota.reset = Some(ms(700));
    feed(&limiter, &Feedback::new(200).with_quota(quota));
    let wait = wait_now(&limiter);
    assert!(wait > ms(690) && wait <= ms(700), "{wait:?}");
    // Not a refusal: the rate stays.
    assert!(close(limiter.rate(), 100.0));
    // remaining 3, no reset: 2 stored, 3 at once.
    clock.advance(Duration::from_secs(10));
    let mut quota = Quota::default();
    quota.remaining = Some(3);
    feed(&limiter, &Feedback::new(200).with_quota(quota));
    assert_eq!(limiter.snapshot().unwrap().remaining(), 3);
}

// ---- Call ----

/// A settle for a limit the limiter lacks is an error, and the call ends at
/// its estimate (nothing given back).
#[test]
fn settle_for_a_missing_limit_ends_at_the_estimate() {
    let clock = FakeClock::new();
    let limiter = limiter(10.0, &clock);
    futures::executor::block_on(async {
        let call = limiter.call(5).await.unwrap();
        assert_eq!(call.estimate(), &Cost::from(5));
        let err = call.settle(Cost::each([1, 1])).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
        // 5 permits at 10/s: the next waits 0.5 s.
        let next = limiter.call(1).await.unwrap();
        assert_eq!(next.waited(), ms(500));
    });
}

/// Settles above and below the estimate, while the log holds the call.
#[test]
fn settle_above_and_below_the_estimate() {
    let clock = FakeClock::new();
    let limiter = limiter(10.0, &clock);
    futures::executor::block_on(async {
        let call = limiter.call(5).await.unwrap();
        call.settle(1).unwrap();
        let next = limiter.call(1).await.unwrap();
        assert_eq!(next.waited(), ms(100));
        next.settle(8).unwrap();
        let third = limiter.call(1).await.unwrap();
        assert_eq!(third.waited(), ms(800));
        // Zero is a cost.
        third.settle(0).unwrap();
        let fourth = limiter.call(1).await.unwrap();
        assert_eq!(fourth.waited(), Duration::ZERO);
    });
}

/// `waited` counts the wait for a slot, then the schedule's.
#[tokio::test(flavor = "current_thread")]
async fn waited_counts_the_slot_and_the_schedule() {
    use crate::support::manual::ManualClock;
    let clock = ManualClock::default();
    let limiter = Arc::new(
        RateLimiter::builder()
            .limit(Limit::per_second(10.0).burst(1))
            .limit(Limit::concurrent(1))
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let first = limiter.call(1).await.unwrap();
    assert_eq!(first.waited(), Duration::ZERO);
    let l2 = Arc::clone(&limiter);
    let second = tokio::spawn(async move { l2.call(1).await.unwrap().waited() });
    tokio::task::yield_now().await;
    clock.advance(ms(30));
    drop(first); // the slot at 30 ms; the schedule at 100 ms
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    clock.advance(ms(70));
    let waited = second.await.unwrap();
    assert_eq!(waited, ms(100));
}

// ---- The layer ----

#[cfg(feature = "http")]
mod layer {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use paceline::outbound::OutboundLayer;
    use tower::ServiceExt;
    use tower_layer::Layer;
    use tower_service::Service;

    fn pending<F: std::future::Future>(f: &mut std::pin::Pin<Box<F>>) -> bool {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        f.as_mut().poll(&mut cx).is_pending()
    }

    type Req = http::Request<()>;
    type Res = http::Response<()>;

    fn answer(status: u16, headers: &[(&str, &str)]) -> Res {
        let mut builder = http::Response::builder().status(status);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap()
    }

    fn two_limits(clock: &FakeClock) -> Arc<RateLimiter<paceline::Local, FakeClock>> {
        Arc::new(
            RateLimiter::builder()
                .limit(Limit::per_second(1_000.0).burst(1).named("requests"))
                .limit(Limit::per_second(100.0).burst(1).named("tokens"))
                .clock(clock.clone())
                .build()
                .unwrap(),
        )
    }

    /// The default estimate is one permit of every limit, and the default
    /// real cost the estimate.
    #[tokio::test(flavor = "current_thread")]
    async fn the_default_estimate_is_one_of_every_limit() {
        for (requests, tokens) in [(10.0, 1_000.0), (1_000.0, 10.0)] {
            let clock = FakeClock::new();
            let limiter = Arc::new(
                RateLimiter::builder()
                    .limit(Limit::per_second(requests).burst(1))
                    .limit(Limit::per_second(tokens).burst(1))
                    .clock(clock.clone())
                    .build()
                    .unwrap(),
            );
            let mut client =
                OutboundLayer::new(Arc::clone(&limiter)).layer(tower::service_fn(|_: Req| async {
                    Ok::<_, Infallible>(answer(200, &[]))
                }));
            client
                .ready()
                .await
                .unwrap()
                .call(http::Request::new(()))
                .await
                .unwrap();
            // Whichever limit is the slow one, it was charged one.
            assert_eq!(wait_now_of(&limiter), ms(100));
        }
    }

    fn wait_now_of(limiter: &RateLimiter<paceline::Local, FakeClock>) -> Duration {
        limiter.snapshot().unwrap().wait()
    }

    /// A real cost read from the answer below the estimate gives back the
    /// rest; above, charges the excess; for a missing limit, keeps the
    /// estimate and still answers.
    #[tokio::test(flavor = "current_thread")]
    async fn the_actual_cost_is_settled() {
        let clock = FakeClock::new();
        let limiter = two_limits(&clock);
        let tokens = Arc::new(AtomicUsize::new(10));
        let t = Arc::clone(&tokens);
        let mut client = OutboundLayer::new(Arc::clone(&limiter))
            .estimate(|_: &Req| Cost::each([1, 50]))
            .actual(move |_: &Res| match t.load(Ordering::SeqCst) {
                usize::MAX => Some(Cost::each([1, 1, 1])),
                n => Some(Cost::each([1, n as u32])),
            })
            .layer(tower::service_fn(|_: Req| async {
                Ok::<_, Infallible>(answer(200, &[]))
            }));
        client
            .ready()
            .await
            .unwrap()
            .call(http::Request::new(()))
            .await
            .unwrap();
        // 10 tokens at 100/s.
        let probe = limiter.call(Cost::each([0, 1])).await.unwrap();
        assert_eq!(probe.waited(), ms(100));
        probe.settle(Cost::each([0, 0])).unwrap();
        clock.advance(Duration::from_secs(5));
        tokens.store(80, Ordering::SeqCst);
        client
            .ready()
            .await
            .unwrap()
            .call(http::Request::new(()))
            .await
            .unwrap();
        let probe = limiter.call(Cost::each([0, 1])).await.unwrap();
        assert_eq!(probe.waited(), ms(800));
        probe.settle(Cost::each([0, 0])).unwrap();
        clock.advance(Duration::from_secs(5));
        tokens.store(usize::MAX, Ordering::SeqCst);
        let response = client
            .ready()
            .await
            .unwrap()
            .call(http::Request::new(()))
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let probe = limiter.call(Cost::each([0, 1])).await.unwrap();
        assert_eq!(probe.waited(), ms(500));
    }

    /// An error from the inner service comes back, and the call ends at its
    /// estimate.
    #[tokio::test(flavor = "current_thread")]
    async fn an_inner_error_ends_the_call_at_its_estimate() {
        let clock = FakeClock::new();
        let limiter = two_limits(&clock);
        let mut client = OutboundLayer::new(Arc::clone(&limiter))
            .estimate(|_: &Req| Cost::each([1, 30]))
            .layer(tower::service_fn(|_: Req| async {
                Err::<Res, _>(std::io::Error::other("connection reset"))
            }));
        let err = client
            .ready()
            .await
            .unwrap()
            .call(http::Request::new(()))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("connection reset"), "{err}");
        let probe = limiter.call(Cost::each([0, 1])).await.unwrap();
        assert_eq!(probe.waited(), ms(300));
    }

    /// A 429 through the layer: the pause from its Retry-After (an HTTP date
    /// read against the system clock) and the decrease; the answer comes
    /// back as it came.
    #[tokio::test(flavor = "current_thread")]
    async fn a_refusal_through_the_layer_pauses_and_lowers() {
        let clock = FakeClock::new();
        let limiter = Arc::new(
            RateLimiter::builder()
                .permits_per_second(100.0)
                .max_burst(Duration::ZERO)
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
        let mut client =
            OutboundLayer::new(Arc::clone(&limiter)).layer(tower::service_fn(|_: Req| async {
                Ok::<_, Infallible>(answer(429, &[("retry-after", "3")]))
            }));
        let response = client
            .ready()
            .await
            .unwrap()
            .call(http::Request::new(()))
            .await
            .unwrap();
        assert_eq!(response.status(), 429);
        assert!(close(limiter.rate(), 70.0), "{}", limiter.rate());
        let wait = wait_now(&limiter);
        assert!(wait > ms(2_990) && wait <= ms(3_000), "{wait:?}");
        // A 429 without the header: the default pause.
        clock.advance(Duration::from_secs(4));
        let mut client =
            OutboundLayer::new(Arc::clone(&limiter)).layer(tower::service_fn(|_: Req| async {
                Ok::<_, Infallible>(answer(429, &[]))
            }));
        client
            .ready()
            .await
            .unwrap()
            .call(http::Request::new(()))
            .await
            .unwrap();
        assert!(close(limiter.rate(), 49.0), "{}", limiter.rate());
        let wait = wait_now(&limiter);
        assert!(wait > ms(990) && wait <= ms(1_000), "{wait:?}");
    }

    /// Named quotas in the headers reach the limits named so, through the
    /// layer; a 200 without headers changes nothing.
    #[tokio::test(flavor = "current_thread")]
    async fn named_quotas_through_the_layer() {
        let clock = FakeClock::new();
        let limiter = Arc::new(
            RateLimiter::builder()
                .limit(Limit::per_second(100.0).named("requests"))
                .limit(Limit::per_second(10_000.0).named("tokens"))
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
        let mut plain =
            OutboundLayer::new(Arc::clone(&limiter)).layer(tower::service_fn(|_: Req| async {
                Ok::<_, Infallible>(answer(200, &[]))
            }));
        plain
            .ready()
            .await
            .unwrap()
            .call(http::Request::new(()))
            .await
            .unwrap();
        assert!(close(limiter.rate(), 100.0));
        let mut client =
            OutboundLayer::new(Arc::clone(&limiter)).layer(tower::service_fn(|_: Req| async {
                Ok::<_, Infallible>(answer(
                    200,
                    &[
                        ("x-ratelimit-limit-requests", "60"),
                        ("x-ratelimit-remaining-requests", "59"),
                        ("x-ratelimit-limit-tokens", "1000"),
                        ("x-ratelimit-remaining-tokens", "900"),
                    ],
                ))
            }));
        client
            .ready()
            .await
            .unwrap()
            .call(http::Request::new(()))
            .await
            .unwrap();
        // No window given: no rate learned.
        assert!(close(limiter.rate(), 100.0), "{}", limiter.rate());
        let mut client =
            OutboundLayer::new(Arc::clone(&limiter)).layer(tower::service_fn(|_: Req| async {
                Ok::<_, Infallible>(answer(
                    200,
                    &[(
                        "ratelimit-policy",
                        "\"tokens\";q=6000;w=60, \"requests\";q=600;w=60",
                    )],
                ))
            }));
        client
            .ready()
            .await
            .unwrap()
            .call(http::Request::new(()))
            .await
            .unwrap();
        assert!(close(limiter.rate(), 9.7), "{}", limiter.rate());
        assert!(
            close(limiter.slowest_rate(), 9.7),
            "{}",
            limiter.slowest_rate()
        );
    }

    /// Dropped while it waits for its turn, the request gives its estimate
    /// back; dropped while in flight, the call ends at its estimate.
    #[tokio::test(flavor = "current_thread")]
    async fn dropped_while_waiting_gives_back_dropped_in_flight_keeps() {
        use crate::support::manual::ManualClock;
        let clock = ManualClock::default();
        let limiter = Arc::new(
            RateLimiter::builder()
                .limit(Limit::per_second(10.0).burst(1))
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
        let sent = Arc::new(AtomicUsize::new(0));
        let s = Arc::clone(&sent);
        let client = OutboundLayer::new(Arc::clone(&limiter))
            .estimate(|_: &Req| Cost::from(3))
            .layer(tower::service_fn(move |_: Req| {
                s.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<Result<Res, Infallible>>()
            }));
        // The first goes at once and hangs in flight: dropped, it keeps its 3.
        let mut c = client.clone();
        let first = c.ready().await.unwrap().call(http::Request::new(()));
        let mut first = Box::pin(first);
        assert!(pending(&mut first));
        assert_eq!(sent.load(Ordering::SeqCst), 1);
        // The second waits 300 ms for its turn: dropped, it gives back.
        let mut c = client.clone();
        let mut second = Box::pin(c.ready().await.unwrap().call(http::Request::new(())));
        assert!(pending(&mut second));
        assert_eq!(sent.load(Ordering::SeqCst), 1);
        drop(second);
        drop(first);
        let snapshot = limiter.snapshot().unwrap();
        assert_eq!(snapshot.wait(), ms(300));
    }
}
