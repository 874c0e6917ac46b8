//! This package's server (`src/lib.rs`) as a real server on
//! 127.0.0.1, asked by a real HTTP client: 50 clients behind a trusted
//! proxy each get rate × time + burst; every response carries the
//! rate-limit headers with the right count; a forged `X-Forwarded-For`
//! from a peer that is not a proxy changes nothing, and nor does a
//! `Forwarded` header the proxy passes on; a bounded wait refuses
//! at its bound; and the same through Redis. Real time: a client's count
//! is checked against the shortest and the longest time the server can
//! have seen it for, to one permit.

/// The crate's test harness for a private redis-server.
#[cfg(feature = "redis")]
#[path = "../../../tests/support/redis_server.rs"]
#[allow(dead_code)]
mod redis_server;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ::http::{Request, StatusCode};
use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use paceline::http::ClientIpSource;
use paceline_axum_server::{self as axum_server, Options};

/// hyper's HTTP/1.1 client, connecting from a chosen local address.
type Client = HttpClient<HttpConnector, Empty<Bytes>>;

const MS: Duration = Duration::from_millis(1);

/// The example's server on a free loopback port.
async fn start(options: Options) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let app = axum_server::app(&options).await.unwrap();
    tokio::spawn(axum_server::serve(listener, app));
    address
}

/// A client whose connections come from `local` (any 127.0.0.0/8 address
/// is this machine's).
fn client(local: &str) -> Client {
    let mut connector = HttpConnector::new();
    connector.set_local_address(Some(local.parse::<IpAddr>().unwrap()));
    HttpClient::builder(TokioExecutor::new()).build(connector)
}

/// A response's status and the headers these tests read.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    ratelimit: Option<String>,
    policy: Option<String>,
    retry_after: Option<u64>,
    legacy_remaining: Option<String>,
}

async fn get(client: &Client, address: SocketAddr, forwarded_for: Option<&str>) -> Answer {
    let mut request = Request::get(format!("http://{address}/"));
    if let Some(forwarded_for) = forwarded_for {
        request = request.header("x-forwarded-for", forwarded_for);
    }
    let response = client
        .request(request.body(Empty::new()).unwrap())
        .await
        .unwrap();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    Answer {
        status: response.status(),
        ratelimit: header("ratelimit"),
        policy: header("ratelimit-policy"),
        retry_after: header("retry-after").map(|v| v.parse().unwrap()),
        legacy_remaining: header("x-ratelimit-remaining"),
    }
}

/// The `r=` of a `RateLimit` header.
fn remaining(answer: &Answer) -> u64 {
    let header = answer.ratelimit.as_deref().expect("a RateLimit header");
    let r = header
        .split(';')
        .find_map(|p| p.strip_prefix("r="))
        .unwrap();
    r.parse().unwrap()
}

/// The server's options: 10 a second with a burst of 10, behind `trust`
/// appending to `X-Forwarded-For`.
fn options(trust: &[&str]) -> Options {
    Options {
        rate: 10.0,
        burst: 10,
        client_ip: ClientIpSource::XForwardedFor,
        trust: trust.iter().map(|t| t.to_string()).collect(),
        ..Options::default()
    }
}

/// Each of `keys` clients behind the trusted proxy at 127.0.0.1 sends 15
/// requests at once (three waves of five), then one every 25 ms for 2 s.
/// Each gets 10 at once (its burst) and 10 a second after.
async fn many_clients_get_rate_times_time_plus_burst(address: SocketAddr, keys: u32) {
    let client = Arc::new(client("127.0.0.1"));
    let run = Duration::from_secs(2);
    let tasks: Vec<_> = (0..keys)
        .map(|k| {
            let client = Arc::clone(&client);
            tokio::spawn(async move {
                let ip = format!("198.51.100.{k}");
                // The server's first and last grant lie between these.
                let start = Instant::now();
                let mut answers = Vec::new();
                let mut first_answered = None;
                for _ in 0..3 {
                    let wave = (0..5).map(|_| get(&client, address, Some(&ip)));
                    answers.extend(futures::future::join_all(wave).await);
                    first_answered.get_or_insert_with(Instant::now);
                }
                let mut last_sent = start;
                while start.elapsed() < run {
                    tokio::time::sleep(25 * MS).await;
                    last_sent = Instant::now();
                    answers.push(get(&client, address, Some(&ip)).await);
                }
                let at_least = last_sent.saturating_duration_since(first_answered.unwrap());
                (answers, at_least, start.elapsed())
            })
        })
        .collect();
    for (k, task) in tasks.into_iter().enumerate() {
        let (answers, at_least, at_most) = task.await.unwrap();
        let granted = answers
            .iter()
            .filter(|a| a.status == StatusCode::OK)
            .count() as f64;
        // The server saw the key for at least `at_least` and at most
        // `at_most`: 10 at once, then 10 a second, to one permit. Fewer by
        // a few on a loaded machine, never more: a late wake-up or a round
        // trip past the response timeout (served by the fallback) leaves a
        // permit or two untaken.
        let (low, high) = (
            10.0 + (10.0 * at_least.as_secs_f64()).floor() - 3.0,
            10.0 + (10.0 * at_most.as_secs_f64()).floor() + 1.0,
        );
        assert!(
            low <= granted && granted <= high,
            "client {k}: {granted} granted, expected {low} to {high} ({at_least:?} to {at_most:?})"
        );
        for answer in &answers {
            assert_eq!(
                answer.policy.as_deref(),
                Some("\"per-client\";q=10;w=1"),
                "{answer:?}"
            );
            assert!(answer.ratelimit.is_some(), "{answer:?}");
            match answer.status {
                StatusCode::OK => assert_eq!(answer.retry_after, None),
                StatusCode::TOO_MANY_REQUESTS => {
                    assert!(answer.retry_after >= Some(1), "{answer:?}");
                    assert_eq!(remaining(answer), 0, "{answer:?}");
                }
                other => panic!("client {k}: unexpected {other}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_clients_behind_a_proxy_each_get_their_rate() {
    let address = start(options(&["127.0.0.1"])).await;
    many_clients_get_rate_times_time_plus_burst(address, 50).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_headers_count_down_and_a_refusal_says_when() {
    let address = start(options(&["127.0.0.1"])).await;
    let client = client("127.0.0.1");
    let me = Some("203.0.113.9");
    let first = get(&client, address, me).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(remaining(&first), 9);
    assert_eq!(first.legacy_remaining.as_deref(), Some("9"));
    let mut last = 9;
    let mut granted = 1;
    loop {
        let answer = get(&client, address, me).await;
        if answer.status == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(remaining(&answer), 0);
            assert_eq!(answer.retry_after, Some(1));
            break;
        }
        // One less each time (or the same, if one came back meanwhile).
        let now = remaining(&answer);
        assert!(now == last - 1 || now == last, "{last} then {now}");
        last = now;
        granted += 1;
        assert!(granted <= 13, "never refused");
    }
    assert_eq!(last, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_forwarded_for_from_a_peer_that_is_not_a_proxy_changes_nothing() {
    let address = start(options(&["127.0.0.1"])).await;
    // 127.0.0.2 is not a trusted proxy: its key is its own address,
    // whatever it writes.
    let client = client("127.0.0.2");
    let mut granted = 0;
    for i in 0..20 {
        let forged = format!("192.0.2.{i}");
        if get(&client, address, Some(&forged)).await.status == StatusCode::OK {
            granted += 1;
        }
    }
    // One key: its burst of 10 and whatever came back in the meantime.
    assert!((10..=11).contains(&granted), "{granted}");
}

/// A proxy that appends the peer it saw to `X-Forwarded-For` and passes
/// `Forwarded` on as the client sent it (nginx, HAProxy, the cloud load
/// balancers): the test plays that proxy at 127.0.0.1. A client that sends
/// a new `Forwarded` each time is still one key: of 50 sent at once at 1 a
/// second with a burst of 3, 3 go through (4 if a second passes meanwhile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_header_the_proxy_passes_on_changes_nothing() {
    let address = start(Options {
        rate: 1.0,
        burst: 3,
        ..options(&["127.0.0.1"])
    })
    .await;
    let proxy = client("127.0.0.1");
    let spoofed = (0..50).map(|i| {
        let proxy = proxy.clone();
        async move {
            let request = Request::get(format!("http://{address}/"))
                .header("forwarded", format!("for=9.9.{}.{}", i / 256, i % 256))
                .header("x-forwarded-for", "203.0.113.7")
                .body(Empty::new())
                .unwrap();
            proxy.request(request).await.unwrap().status()
        }
    });
    let statuses = futures::future::join_all(spoofed).await;
    let through = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert!((3..=4).contains(&through), "{through} of 50 through");
    assert!(
        statuses
            .iter()
            .all(|s| *s == StatusCode::OK || *s == StatusCode::TOO_MANY_REQUESTS),
        "{statuses:?}"
    );
    // Another client through the same proxy has its own key.
    let other = get(&proxy, address, Some("203.0.113.8")).await;
    assert_eq!(other.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_wait_waits_within_it_and_refuses_past_it() {
    let address = start(Options {
        burst: 1,
        max_wait: 150 * MS,
        ..options(&[])
    })
    .await;
    let client = client("127.0.0.1");
    // At 10/s with no burst: one goes now, one waits 100 ms, and one would
    // wait 200 ms, past the bound: refused at once.
    let timed = |client: Client| async move {
        let start = Instant::now();
        let answer = get(&client, address, None).await;
        (answer.status, start.elapsed())
    };
    let mut results = futures::future::join_all((0..3).map(|_| timed(client.clone()))).await;
    results.sort_by_key(|(_, elapsed)| *elapsed);
    let statuses: Vec<_> = results.iter().map(|(status, _)| *status).collect();
    assert!(
        statuses.iter().filter(|s| **s == StatusCode::OK).count() == 2
            && statuses.contains(&StatusCode::TOO_MANY_REQUESTS),
        "{results:?}"
    );
    let waited = results
        .iter()
        .filter(|(status, _)| *status == StatusCode::OK)
        .map(|(_, elapsed)| *elapsed)
        .max()
        .unwrap();
    let refused = results
        .iter()
        .find(|(status, _)| *status == StatusCode::TOO_MANY_REQUESTS)
        .unwrap()
        .1;
    assert!(waited >= 80 * MS, "{results:?}");
    assert!(refused < waited, "{results:?}");
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_redis_ten_clients_each_get_their_rate() {
    let server = redis_server::RedisServer::start();
    let address = start(Options {
        redis: Some(server.url()),
        ..options(&["127.0.0.1"])
    })
    .await;
    many_clients_get_rate_times_time_plus_burst(address, 10).await;
}

/// The command line names a header only with a proxy to trust, and a proxy
/// only with a header: `--client-ip x-forwarded-for` alone read as no header
/// at all (no proxy is trusted), so that behind a proxy every client shared
/// the proxy's key, and one of them used up every other's limit.
#[test]
fn a_header_needs_a_proxy_to_trust_and_a_proxy_a_header() {
    let parse = |args: &[&str]| Options::parse(args.iter().map(|arg| arg.to_string()));
    for alone in [
        &["--client-ip", "x-forwarded-for"][..],
        &["--client-ip", "X-Real-IP"],
        &["--trust", "10.0.0.0/8"],
    ] {
        assert!(parse(alone).is_err(), "{alone:?}");
    }
    let both = parse(&["--client-ip", "x-forwarded-for", "--trust", "10.0.0.0/8"]).unwrap();
    assert_eq!(both.client_ip, ClientIpSource::XForwardedFor);
    assert_eq!(both.trust, ["10.0.0.0/8"]);
    for neither in [&[][..], &["--client-ip", "peer"]] {
        let options = parse(neither).unwrap();
        assert_eq!(options.client_ip, ClientIpSource::Peer, "{neither:?}");
    }
}

/// Every layer of the crate goes into axum's `Router::layer` and
/// `route_layer` as it is: the HTTP layer directly, the tower layers
/// (whose refusals are errors) behind axum's `HandleErrorLayer`. This
/// compiles, which is the proof; the router answers, which shows it runs.
#[tokio::test(flavor = "current_thread")]
async fn every_layer_fits_axum() {
    use axum::Router;
    use axum::error_handling::HandleErrorLayer;
    use axum::routing::get;
    use paceline::http::{Global, RateLimitLayer as HttpLayer};
    use paceline::tower::RateLimitLayer;
    use paceline::{KeyedRateLimiter, RateLimiter};

    let keyed = Arc::new(KeyedRateLimiter::<()>::bursty(100.0).unwrap());
    let direct = Arc::new(RateLimiter::bursty(1e6).unwrap());
    let keyed_u8 = Arc::new(KeyedRateLimiter::<u8>::bursty(100.0).unwrap());
    let refused = |_: tower::BoxError| async { StatusCode::TOO_MANY_REQUESTS };
    let app: Router = Router::new()
        .route("/http", get(|| async { "ok" }))
        .route_layer(HttpLayer::new(Arc::clone(&keyed), Global))
        .route("/tower", get(|| async { "ok" }))
        .layer(
            tower::ServiceBuilder::new()
                .layer(HandleErrorLayer::new(refused))
                .layer(RateLimitLayer::new(Arc::clone(&direct)).max_wait(Duration::ZERO)),
        )
        .layer(
            tower::ServiceBuilder::new()
                .layer(HandleErrorLayer::new(refused))
                .layer(
                    RateLimitLayer::keyed(keyed_u8, |_: &axum::extract::Request| 0u8)
                        .max_wait(Duration::ZERO),
                ),
        )
        .layer(HttpLayer::new(keyed, Global).headers(paceline::http::Headers::None));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    for path in ["/http", "/tower"] {
        let uri = format!("http://{address}{path}");
        let response = client("127.0.0.1")
            .request(Request::get(uri).body(Empty::new()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
    }
}
