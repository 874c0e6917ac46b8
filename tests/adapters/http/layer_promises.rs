//! Probes of the HTTP layer's documented promises: the headers' numbers,
//! the policy name, the hook, the bounded wait, keys that fail, inner
//! errors, and the layer over Redis.

use std::future::poll_fn;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use ::http::{HeaderValue, Request, Response, StatusCode};
use paceline::clock::{Clock, FakeClock};
use paceline::http::{Global, Headers, PeerIp, RateLimitLayer, Refused};
use paceline::{KeyedRateLimiter, Limit};
use tower_layer::Layer;
use tower_service::Service;

use super::{Ok200, from, header, retry_after, send};
use crate::tower::keyed_limiter;

/// Drains `service` with `Request::new(())` until a refusal; the granted
/// responses' `ratelimit-policy` and `ratelimit` values.
async fn drain<S>(service: &mut S) -> Vec<(String, String)>
where
    S: Service<Request<()>, Response = Response<String>>,
    S::Error: std::fmt::Debug,
{
    let mut seen = Vec::new();
    loop {
        let response = send(service, Request::new(())).await;
        if response.status() != StatusCode::OK {
            return seen;
        }
        seen.push((
            header(&response, "ratelimit-policy").unwrap().to_owned(),
            header(&response, "ratelimit").unwrap().to_owned(),
        ));
        assert!(seen.len() < 10_000);
    }
}

/// "`Q` the requests the rate allows in `W`": 15 per 11 s allows 15 in
/// 11 s, whatever the burst. With a burst of 14 the header said `q=14`
/// (15 / 11 * 11 is 14.999999999999998 in floating point, floored).
#[tokio::test(flavor = "current_thread")]
async fn q_is_the_rates_requests_in_w_without_a_rounding_loss() {
    for (quota, window, burst) in [(15.0, 11, 14), (29.0, 25, 28), (26.0, 23, 25)] {
        let clock = FakeClock::new();
        let limiter = Arc::new(
            KeyedRateLimiter::<()>::builder()
                .limit(Limit::per(quota, Duration::from_secs(window)).burst(burst))
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
        let mut service = RateLimitLayer::new(limiter, Global).layer(Ok200::default());
        let seen = drain(&mut service).await;
        assert_eq!(seen.len() as u64, burst);
        // A drained key has its burst back in (burst / rate) s, under the
        // window: W is the window; Q the rate's requests in it.
        let expected = format!("\"default\";q={quota};w={window}");
        assert_eq!(seen[0].0, expected, "{quota} per {window} s, burst {burst}");
    }
}

/// "`T` seconds (rounded up) until the key is full again": a request that
/// waited is answered when its wait ends, so `T` counts from then. At one
/// request per 10 s, the second request waits 10 s; when it is answered the
/// key is full 10 s later (it said `t=20`, counted from before the wait).
#[tokio::test(flavor = "current_thread")]
async fn t_counts_from_when_a_waited_request_is_answered() {
    let clock = FakeClock::new();
    let limiter = Arc::new(
        KeyedRateLimiter::<()>::builder()
            .permits_per_second(0.1)
            .max_burst(Duration::ZERO)
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let mut service = RateLimitLayer::new(Arc::clone(&limiter), Global)
        .max_wait(Duration::from_secs(30))
        .headers(Headers::IetfAndLegacy)
        .layer(Ok200::default());
    let first = send(&mut service, Request::new(())).await;
    assert_eq!(header(&first, "ratelimit"), Some("\"default\";r=0;t=10"));
    let second = send(&mut service, Request::new(())).await;
    assert_eq!(second.status(), StatusCode::OK);
    assert_eq!(clock.now(), Duration::from_secs(10));
    // What the key says now, as the response leaves.
    let now = limiter.snapshot(&()).unwrap();
    assert_eq!(now.full_in(), Duration::from_secs(10));
    assert_eq!(header(&second, "ratelimit"), Some("\"default\";r=0;t=10"));
    assert_eq!(header(&second, "x-ratelimit-reset"), Some("10"));
}

/// "a request that would wait up to it waits": a wait of exactly
/// `max_wait` waits; 1 µs more is refused and reserves nothing (pinned).
#[tokio::test(flavor = "current_thread")]
async fn a_wait_of_exactly_max_wait_waits() {
    let clock = FakeClock::new();
    let limiter = keyed_limiter::<()>(&clock);
    let inner = Ok200::default();
    let mut service = RateLimitLayer::new(Arc::clone(&limiter), Global)
        .max_wait(Duration::from_millis(100))
        .layer(inner.clone());
    assert_eq!(
        send(&mut service, Request::new(())).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&mut service, Request::new(())).await.status(),
        StatusCode::OK
    );
    assert_eq!(clock.now(), Duration::from_millis(100));
    // Now 100 ms owed: exactly max_wait.
    assert_eq!(
        send(&mut service, Request::new(())).await.status(),
        StatusCode::OK
    );
    assert_eq!(clock.now(), Duration::from_millis(200));
    // 100 ms owed again: 1 µs past a bound of 99.999 ms.
    let mut tight = RateLimitLayer::new(Arc::clone(&limiter), Global)
        .max_wait(Duration::from_micros(99_999))
        .layer(inner.clone());
    let refused = send(&mut tight, Request::new(())).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&refused), Some("1"));
    assert_eq!(
        limiter.snapshot(&()).unwrap().wait(),
        Duration::from_millis(100)
    );
    assert_eq!(inner.0.load(Ordering::Relaxed), 3);
}

/// `max_wait(Duration::MAX)`: a request waits as long as it must, no
/// overflow (pinned).
#[tokio::test(flavor = "current_thread")]
async fn an_unbounded_max_wait_waits() {
    let clock = FakeClock::new();
    let mut service = RateLimitLayer::new(keyed_limiter::<()>(&clock), Global)
        .max_wait(Duration::MAX)
        .layer(Ok200::default());
    for _ in 0..3 {
        assert_eq!(
            send(&mut service, Request::new(())).await.status(),
            StatusCode::OK
        );
    }
    assert_eq!(clock.now(), Duration::from_millis(200));
}

/// A burst of N is N at once, and each response's `r` counts down to 0
/// with `t` the time until full (pinned).
#[tokio::test(flavor = "current_thread")]
async fn a_burst_counts_down_r_and_t_to_the_last() {
    let clock = FakeClock::new();
    let limiter = Arc::new(
        KeyedRateLimiter::<()>::builder()
            .limit(Limit::per_second(5.0).burst(10))
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let mut service = RateLimitLayer::new(limiter, Global).layer(Ok200::default());
    let seen = drain(&mut service).await;
    assert_eq!(seen.len(), 10);
    for (i, (policy, ratelimit)) in seen.iter().enumerate() {
        assert_eq!(policy, "\"default\";q=10;w=2");
        // After i + 1 requests: 9 - i remain; i + 1 permits of 200 ms to
        // come back (the last, 2 s).
        let t = ((i as u64 + 1) * 200).div_ceil(1000);
        assert_eq!(ratelimit, &format!("\"default\";r={};t={t}", 9 - i), "{i}");
    }
}

/// An infinite rate: every number is the structured-field integer's
/// largest, never an invalid value; a tiny rate and a huge burst read as
/// documented (pinned).
#[tokio::test(flavor = "current_thread")]
async fn extreme_rates_and_bursts_give_valid_numbers() {
    let clock = FakeClock::new();
    let unlimited = Arc::new(
        KeyedRateLimiter::<()>::builder()
            .permits_per_second(f64::INFINITY)
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let mut service = RateLimitLayer::new(unlimited, Global)
        .headers(Headers::IetfAndLegacy)
        .layer(Ok200::default());
    for _ in 0..3 {
        let response = send(&mut service, Request::new(())).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            header(&response, "ratelimit-policy"),
            Some("\"default\";q=999999999999999;w=1")
        );
        assert_eq!(
            header(&response, "ratelimit"),
            Some("\"default\";r=999999999999999;t=0")
        );
    }
    // One a day, no burst: 1 per 86400 s; refused for a day.
    let daily = Arc::new(
        KeyedRateLimiter::<()>::builder()
            .limit(Limit::per(1.0, Duration::from_secs(86_400)))
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let mut service = RateLimitLayer::new(daily, Global).layer(Ok200::default());
    let first = send(&mut service, Request::new(())).await;
    assert_eq!(
        header(&first, "ratelimit-policy"),
        Some("\"default\";q=1;w=86400")
    );
    assert_eq!(header(&first, "ratelimit"), Some("\"default\";r=0;t=86400"));
    let refused = send(&mut service, Request::new(())).await;
    assert_eq!(retry_after(&refused), Some("86400"));
    // A huge burst: that many at once, the policy says so.
    let huge = Arc::new(
        KeyedRateLimiter::<()>::builder()
            .limit(Limit::per_second(1.0).burst(1_000_000))
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let mut service = RateLimitLayer::new(huge, Global).layer(Ok200::default());
    let first = send(&mut service, Request::new(())).await;
    assert_eq!(
        header(&first, "ratelimit-policy"),
        Some("\"default\";q=1000000;w=1000000")
    );
    assert_eq!(
        header(&first, "ratelimit"),
        Some("\"default\";r=999999;t=1")
    );
}

/// The policy's name, whatever it holds, is a valid structured-field string
/// in both headers: quotes and backslashes escaped, what a header cannot
/// carry as `?`, empty as `""`, long names whole (pinned).
#[tokio::test(flavor = "current_thread")]
async fn any_policy_name_makes_valid_headers() {
    let clock = FakeClock::new();
    let long = "n".repeat(500);
    for (name, quoted) in [
        ("", "\"\"".to_owned()),
        ("a\"b\\c", r#""a\"b\\c""#.to_owned()),
        ("café\u{7f}\t\r\n\0", "\"caf??????\"".to_owned()),
        ("\\\"", r#""\\\"""#.to_owned()),
        ("日本", "\"??\"".to_owned()),
        (long.as_str(), format!("\"{long}\"")),
    ] {
        let mut service = RateLimitLayer::new(keyed_limiter::<()>(&clock), Global)
            .policy_name(name)
            .layer(Ok200::default());
        let granted = send(&mut service, Request::new(())).await;
        assert_eq!(
            header(&granted, "ratelimit-policy"),
            Some(format!("{quoted};q=10;w=1").as_str()),
            "{name:?}"
        );
        assert_eq!(
            header(&granted, "ratelimit"),
            Some(format!("{quoted};r=0;t=1").as_str())
        );
        let refused = send(&mut service, Request::new(())).await;
        assert_eq!(
            header(&refused, "ratelimit"),
            Some(format!("{quoted};r=0;t=1").as_str())
        );
    }
}

/// The hook's own `Retry-After` and rate-limit headers are kept, not
/// duplicated; what it left out is added (pinned).
#[tokio::test(flavor = "current_thread")]
async fn the_hooks_own_headers_are_kept_once() {
    let clock = FakeClock::new();
    let layer = RateLimitLayer::new(keyed_limiter::<()>(&clock), Global)
        .headers(Headers::IetfAndLegacy)
        .on_refused(|_: &Refused| {
            Response::builder()
                .status(StatusCode::TOO_MANY_REQUESTS)
                .header("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT")
                .header("ratelimit", "mine")
                .header("x-custom", "kept")
                .body(String::new())
                .unwrap()
        });
    let mut service = layer.layer(Ok200::default());
    send(&mut service, Request::new(())).await;
    let refused = send(&mut service, Request::new(())).await;
    let headers = refused.headers();
    assert_eq!(headers.get_all("retry-after").iter().count(), 1);
    assert_eq!(retry_after(&refused), Some("Wed, 21 Oct 2015 07:28:00 GMT"));
    assert_eq!(headers.get_all("ratelimit").iter().count(), 1);
    assert_eq!(header(&refused, "ratelimit"), Some("mine"));
    assert_eq!(header(&refused, "x-custom"), Some("kept"));
    assert_eq!(
        header(&refused, "ratelimit-policy"),
        Some("\"default\";q=10;w=1")
    );
    assert_eq!(header(&refused, "x-ratelimit-remaining"), Some("0"));
    assert_eq!(header(&refused, "x-ratelimit-reset"), Some("1"));
}

/// An inner service that fails every call.
#[derive(Clone, Default)]
struct Fails(Arc<AtomicU32>);

impl Service<Request<()>> for Fails {
    type Response = Response<String>;
    type Error = &'static str;
    type Future = std::future::Ready<Result<Response<String>, &'static str>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), &'static str>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        self.0.fetch_add(1, Ordering::Relaxed);
        std::future::ready(Err("inner failed"))
    }
}

/// The inner service's error passes through, granted at once or after a
/// wait; the permit is used (pinned).
#[tokio::test(flavor = "current_thread")]
async fn inner_errors_pass_through() {
    let clock = FakeClock::new();
    let limiter = keyed_limiter::<()>(&clock);
    let inner = Fails::default();
    let mut service = RateLimitLayer::new(Arc::clone(&limiter), Global)
        .max_wait(Duration::from_secs(1))
        .layer(inner.clone());
    for _ in 0..2 {
        poll_fn(|cx| service.poll_ready(cx)).await.unwrap();
        assert_eq!(
            service.call(Request::new(())).await.unwrap_err(),
            "inner failed"
        );
    }
    assert_eq!(inner.0.load(Ordering::Relaxed), 2);
    assert_eq!(clock.now(), Duration::from_millis(100));
    assert_eq!(
        limiter.snapshot(&()).unwrap().wait(),
        Duration::from_millis(100)
    );
}

/// A closure that finds no key: 500, no rate-limit headers, nothing
/// reserved, the inner service not called (pinned, as documented).
#[tokio::test(flavor = "current_thread")]
async fn a_closure_that_finds_no_key_answers_500() {
    let clock = FakeClock::new();
    let limiter = keyed_limiter::<String>(&clock);
    let inner = Ok200::default();
    let key = |request: &Request<()>| {
        request
            .headers()
            .get("x-tenant")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let mut service = RateLimitLayer::new(Arc::clone(&limiter), key)
        .max_wait(Duration::from_secs(1))
        .layer(inner.clone());
    let response = send(&mut service, Request::new(())).await;
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(header(&response, "ratelimit"), None);
    assert_eq!(retry_after(&response), None);
    assert_eq!(inner.0.load(Ordering::Relaxed), 0);
    let mut request = Request::new(());
    request
        .headers_mut()
        .insert("x-tenant", HeaderValue::from_static("a"));
    assert_eq!(send(&mut service, request).await.status(), StatusCode::OK);
}

/// IPv4-mapped IPv6 is its IPv4 address's key; `ipv6_prefix(0)` keys all
/// of IPv6 as one, above 128 as 128 (pinned).
#[tokio::test(flavor = "current_thread")]
async fn mapped_addresses_and_prefix_extremes() {
    let clock = FakeClock::new();
    let peer = PeerIp::from_extension(|peer: &SocketAddr| peer.ip());
    let mut service =
        RateLimitLayer::new(keyed_limiter::<IpAddr>(&clock), peer.clone()).layer(Ok200::default());
    assert_eq!(
        send(&mut service, from("192.0.2.9", &[])).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&mut service, from("[::ffff:192.0.2.9]", &[]))
            .await
            .status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let mut all = RateLimitLayer::new(keyed_limiter::<IpAddr>(&clock), peer.clone().ipv6_prefix(0))
        .layer(Ok200::default());
    assert_eq!(
        send(&mut all, from("[2001:db8::1]", &[])).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&mut all, from("[fe80::9]", &[])).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // IPv4 is not cut by the prefix.
    assert_eq!(
        send(&mut all, from("192.0.2.9", &[])).await.status(),
        StatusCode::OK
    );
    let mut each = RateLimitLayer::new(keyed_limiter::<IpAddr>(&clock), peer.ipv6_prefix(255))
        .layer(Ok200::default());
    for address in ["[2001:db8::1]", "[2001:db8::2]"] {
        assert_eq!(
            send(&mut each, from(address, &[])).await.status(),
            StatusCode::OK
        );
    }
}

#[cfg(feature = "redis")]
mod redis_probes {
    use super::*;
    use crate::support::poll::patient_backend;
    use crate::support::redis_server::RedisServer;
    use paceline::redis::Fallback;

    /// Over a Redis keyed limiter: the granted requests' headers are the
    /// script's snapshot (`r` counts down), a refusal says when; killed
    /// with `FailClosed`, 503 and the inner service not called.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_redis_keyed_limiter_behind_the_layer() {
        let mut server = RedisServer::start();
        let backend = patient_backend(server.client()).await;
        let limiter = Arc::new(
            KeyedRateLimiter::<String>::builder()
                .redis(&backend, "probe-http")
                .limit(Limit::per(3.0, Duration::from_secs(60)))
                .build()
                .unwrap(),
        );
        let inner = Ok200::default();
        let key = |_: &Request<()>| Some("client".to_owned());
        let mut service = RateLimitLayer::new(Arc::clone(&limiter), key)
            .headers(Headers::IetfAndLegacy)
            .layer(inner.clone());
        for remaining in (0..3).rev() {
            let response = send(&mut service, Request::new(())).await;
            assert_eq!(response.status(), StatusCode::OK);
            assert_eq!(
                header(&response, "ratelimit-policy"),
                Some("\"default\";q=3;w=60")
            );
            let t = (3 - remaining) * 20;
            assert_eq!(
                header(&response, "ratelimit"),
                Some(format!("\"default\";r={remaining};t={t}").as_str())
            );
        }
        let refused = send(&mut service, Request::new(())).await;
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(retry_after(&refused), Some("20"));
        assert_eq!(header(&refused, "ratelimit"), Some("\"default\";r=0;t=60"));
        assert_eq!(inner.0.load(Ordering::Relaxed), 3);

        let quick = crate::support::poll::backend(server.client()).await;
        let closed = Arc::new(
            KeyedRateLimiter::<String>::builder()
                .redis(&quick, "probe-http-closed")
                .permits_per_second(10.0)
                .fallback(Fallback::FailClosed)
                .build()
                .unwrap(),
        );
        let mut service = RateLimitLayer::new(closed, key)
            .max_wait(Duration::from_secs(1))
            .layer(inner.clone());
        assert_eq!(
            send(&mut service, Request::new(())).await.status(),
            StatusCode::OK
        );
        server.kill();
        for _ in 0..3 {
            let failed = send(&mut service, Request::new(())).await;
            assert_eq!(failed.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(retry_after(&failed), None);
        }
        assert_eq!(inner.0.load(Ordering::Relaxed), 4);
    }

    /// Over Redis, a request dropped while it waits gives its permit back
    /// (in the background, soon), as `try_acquire` does; the inner service
    /// is not called.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_redis_request_dropped_while_it_waits_gives_back() {
        let server = RedisServer::start();
        let backend = patient_backend(server.client()).await;
        let limiter = Arc::new(
            KeyedRateLimiter::<String>::builder()
                .redis(&backend, "probe-http-drop")
                .permits_per_second(1.0)
                .max_burst(Duration::ZERO)
                .build()
                .unwrap(),
        );
        let inner = Ok200::default();
        let key = |_: &Request<()>| Some("client".to_owned());
        let mut service = RateLimitLayer::new(Arc::clone(&limiter), key)
            .max_wait(Duration::from_secs(5))
            .layer(inner.clone());
        assert_eq!(
            send(&mut service, Request::new(())).await.status(),
            StatusCode::OK
        );
        poll_fn(|cx| service.poll_ready(cx)).await.unwrap();
        let waiting = service.call(Request::new(()));
        assert!(
            tokio::time::timeout(Duration::from_millis(200), waiting)
                .await
                .is_err()
        );
        let start = std::time::Instant::now();
        loop {
            let wait = limiter.snapshot(&"client".to_owned()).await.unwrap().wait();
            if wait <= Duration::from_secs(1) {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(2),
                "still owes {wait:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(inner.0.load(Ordering::Relaxed), 1);
    }

    /// With the headers off, a grant through Redis is one script call; a
    /// refusal reads its wait for `Retry-After` in a second, as the layer's
    /// docs say (they once promised the headers' switch saved it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn headers_off_a_redis_grant_is_one_round_trip_a_refusal_two() {
        let server = RedisServer::start();
        let backend = patient_backend(server.client()).await;
        let limiter = Arc::new(
            KeyedRateLimiter::<String>::builder()
                .redis(&backend, "probe-http-none")
                .limit(Limit::per(1.0, Duration::from_secs(60)))
                .build()
                .unwrap(),
        );
        let key = |_: &Request<()>| Some("client".to_owned());
        let mut service = RateLimitLayer::new(Arc::clone(&limiter), key)
            .headers(Headers::None)
            .layer(Ok200::default());
        let before = server.evalsha_calls();
        let granted = send(&mut service, Request::new(())).await;
        assert_eq!(granted.status(), StatusCode::OK);
        let grant = server.evalsha_calls() - before;
        let before = server.evalsha_calls();
        let refused = send(&mut service, Request::new(())).await;
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(retry_after(&refused), Some("60"));
        let refusal = server.evalsha_calls() - before;
        assert_eq!((grant, refusal), (1, 2));
    }
}
