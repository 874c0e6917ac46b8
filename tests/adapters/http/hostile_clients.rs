//! Hostile clients of the layer: headers that must match what the limiter
//! then does, with other requests of the same key in flight; clients
//! behind IPv6 tunnels of their IPv4 address.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use std::net::{IpAddr, SocketAddr};

use ::http::{Request, StatusCode};
use paceline::KeyedRateLimiter;
use paceline::clock::FakeClock;
use paceline::http::{Global, PeerIp, RateLimitLayer};
use tower_layer::Layer;
use tower_service::Service;

use super::{Ok200, from, header, retry_after, send};
use crate::common::noop;
use crate::support::manual::ManualClock;
use crate::tower::keyed_limiter;

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

/// An IPv4 client that tunnels IPv6 is keyed by its IPv4 address, as one
/// translated by NAT64 is: 6to4 (`2002:V4::/48`, RFC 3056) gives each IPv4
/// address a /48 of its own, 65 536 keys of a /64 where its IPv4 address
/// has one (here two /64s went, then the IPv4 address itself); Teredo
/// (`2001:0::/32`, RFC 4380) holds the server's address in the first 64
/// bits, so every client of one Teredo server shared one key, which one of
/// them used up for all (here the second client was refused). The client's
/// own address is the last 32 bits, inverted; the port is not the key.
#[tokio::test(flavor = "current_thread")]
async fn ipv4_clients_tunnelling_ipv6_are_keyed_by_their_ipv4_address() {
    let clock = FakeClock::new();
    let peer = PeerIp::from_extension(|peer: &SocketAddr| peer.ip());
    let mut service =
        RateLimitLayer::new(keyed_limiter::<IpAddr>(&clock), peer).layer(Ok200::default());
    let mut status = async |client: &str| send(&mut service, from(client, &[])).await.status();
    // 192.0.2.1's 6to4 site: 2002:c000:201::/48.
    assert_eq!(status("[2002:c000:201:1::1]").await, StatusCode::OK);
    for client in [
        "[2002:c000:201:2::1]",
        "192.0.2.1",
        "[2002:c000:201:ffff::9]",
    ] {
        assert_eq!(
            status(client).await,
            StatusCode::TOO_MANY_REQUESTS,
            "{client}"
        );
    }
    assert_eq!(status("[2002:c000:202:1::1]").await, StatusCode::OK);
    // Teredo server 65.54.227.120: client 192.0.2.45 at port 40000 (the
    // RFC's example), then 198.51.100.7 at port 1000, then 192.0.2.45
    // again at port 50000.
    assert_eq!(
        status("[2001:0:4136:e378:8000:63bf:3fff:fdd2]").await,
        StatusCode::OK
    );
    assert_eq!(
        status("[2001:0:4136:e378:8000:fc17:39cc:9bf8]").await,
        StatusCode::OK
    );
    for client in ["[2001:0:4136:e378:8000:3caf:3fff:fdd2]", "192.0.2.45"] {
        assert_eq!(
            status(client).await,
            StatusCode::TOO_MANY_REQUESTS,
            "{client}"
        );
    }
}
