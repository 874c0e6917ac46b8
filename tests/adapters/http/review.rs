//! Hostile-client probes of the layer: headers that must match what the
//! limiter then does, with other requests of the same key in flight.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use ::http::{Request, StatusCode};
use paceline::KeyedRateLimiter;
use paceline::http::{Global, RateLimitLayer};
use tower_layer::Layer;
use tower_service::Service;

use super::{Ok200, header, retry_after};
use crate::common::noop;
use crate::support::manual::ManualClock;

/// "`T` seconds until the key is full again", for a request that waited:
/// a request of the same key that was queued behind it while it waited
/// counts. At 1 a second with no burst, A waits until 1 s and B, queued
/// behind it, until 2 s: when A is answered at 1 s the key is full at 3 s
/// (`t=2`). It said `t=1` (its own snapshot, read before its wait and
/// aged as if nothing was reserved meanwhile), and a request sent at 2 s
/// as told was refused.
#[test]
fn a_waited_requests_t_counts_the_requests_queued_behind_it() {
    let clock = ManualClock::default();
    let limiter = Arc::new(
        KeyedRateLimiter::<()>::builder()
            .permits_per_second(1.0)
            .max_burst(Duration::ZERO)
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let service = RateLimitLayer::new(Arc::clone(&limiter), Global)
        .max_wait(Duration::from_secs(10))
        .layer(Ok200::default());
    let call = |service: &_| {
        let mut service: ::paceline::http::RateLimit<_, _, _> = Clone::clone(service);
        assert!(service.poll_ready(&mut noop()).is_ready());
        service.call(Request::new(()))
    };
    let mut first = pin!(call(&service));
    let Poll::Ready(Ok(first)) = first.as_mut().poll(&mut noop()) else {
        panic!("the first request goes at once");
    };
    assert_eq!(header(&first, "ratelimit"), Some("\"default\";r=0;t=1"));
    let mut a = pin!(call(&service));
    assert!(a.as_mut().poll(&mut noop()).is_pending());
    let mut b = pin!(call(&service));
    assert!(b.as_mut().poll(&mut noop()).is_pending());
    clock.set_ms(1_000);
    let Poll::Ready(Ok(a)) = a.as_mut().poll(&mut noop()) else {
        panic!("A is answered once its wait is over");
    };
    assert_eq!(a.status(), StatusCode::OK);
    let now = limiter.snapshot(&()).unwrap();
    assert_eq!(now.full_in(), Duration::from_secs(2));
    assert_eq!(header(&a, "ratelimit"), Some("\"default\";r=0;t=2"));
    // B is answered at 2 s; a request then is refused, one at 3 s (when
    // A's `t` said the key is full) goes.
    clock.set_ms(2_000);
    let Poll::Ready(Ok(b)) = b.as_mut().poll(&mut noop()) else {
        panic!("B is answered once its wait is over");
    };
    assert_eq!(b.status(), StatusCode::OK);
    let mut next = RateLimitLayer::new(Arc::clone(&limiter), Global).layer(Ok200::default());
    let mut send_now = || {
        assert!(next.poll_ready(&mut noop()).is_ready());
        let mut sent = pin!(next.call(Request::new(())));
        match sent.as_mut().poll(&mut noop()) {
            Poll::Ready(Ok(sent)) => sent,
            _ => panic!("a request with no wait is answered at once"),
        }
    };
    let early = send_now();
    assert_eq!(early.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&early), Some("1"));
    clock.set_ms(3_000);
    assert_eq!(send_now().status(), StatusCode::OK);
}
