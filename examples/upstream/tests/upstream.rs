//! The upstream as a real server on 127.0.0.1, called by a real HTTP
//! client: past its limits a client gets 429s with `Retry-After` and the
//! rate-limit headers, within them 200s with the usage; what it admitted
//! stays within its buckets in every window; the in-flight limit refuses
//! the extra call; the stats add up to what the clients saw; and each mode
//! of `Retry-After` and of the headers. Real time on a loaded machine:
//! only the limits are checked exactly (from the upstream's own records);
//! what a client manages to send is bounded loosely.

use std::collections::BTreeSet;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::HeaderMap;
use hyper::{Request, StatusCode};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use paceline_upstream::{Config, Limits, RateLimitHeaders, RetryAfter, Stats, Upstream, http_date};

/// hyper's HTTP/1.1 client.
type Client = HttpClient<HttpConnector, Full<Bytes>>;

const MS: Duration = Duration::from_millis(1);

fn client() -> Client {
    HttpClient::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// An answer: its status, headers and body.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    /// `X-Usage-Tokens`, checked against the body's.
    fn usage(&self) -> u64 {
        let tokens: u64 = self.header("x-usage-tokens").unwrap().parse().unwrap();
        assert_eq!(
            self.body,
            format!("{{\"usage\":{{\"total_tokens\":{tokens}}}}}")
        );
        tokens
    }

    /// The `r` and `t` of the `RateLimit` item named `name`.
    fn ratelimit(&self, name: &str) -> (u64, u64) {
        let header = self.header("ratelimit").expect("a RateLimit header");
        let item = header
            .split(", ")
            .find_map(|item| item.strip_prefix(&format!("\"{name}\";")))
            .unwrap_or_else(|| panic!("no {name} in {header}"));
        let param = |key: &str| -> u64 {
            let param = item.split(';').find_map(|p| p.strip_prefix(key)).unwrap();
            param.parse().unwrap()
        };
        (param("r="), param("t="))
    }
}

/// `POST /v1/complete`.
async fn call(client: &Client, upstream: &str) -> Answer {
    let request = Request::post(format!("{upstream}/v1/complete"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{\"prompt\":\"hello\"}")))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

/// `GET /stats`.
async fn stats_json(client: &Client, upstream: &str) -> serde_json::Value {
    let request = Request::get(format!("{upstream}/stats"))
        .body(Full::default())
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).unwrap()
}

fn limits(rps: Option<f64>, tps: Option<f64>, in_flight: Option<u32>) -> Limits {
    Limits {
        requests_per_second: rps,
        tokens_per_second: tps,
        max_in_flight: in_flight,
        window_secs: 1,
    }
}

fn start(config: Config) -> Upstream {
    Upstream::start(config).unwrap()
}

/// The upstream's own records: in every window, within what the buckets
/// allow; and tokens within a full bucket and the rate, plus what the
/// calls in flight at once can charge on top.
fn assert_limits_held(stats: &Stats, max_cost: u64) {
    for window in [0, 1, 20, 50, 100, 250, 333, 500, 1000, 1500, 2000, 3000] {
        let window = window * MS;
        let most = stats.max_in_any_window(window);
        let allowance = stats.allowance(window);
        if let Some(requests) = allowance.requests {
            assert!(
                most.requests <= requests,
                "{window:?}: {most:?} {allowance:?}"
            );
        }
        if let (Some(tokens), Some(rate)) = (allowance.tokens, stats.limits.tokens_per_second) {
            assert!(most.tokens <= tokens, "{window:?}: {most:?} {allowance:?}");
            let in_flight = u64::from(stats.totals.max_in_flight) * max_cost;
            let bound = rate * (1.0 + window.as_secs_f64()) + in_flight as f64;
            assert!(most.tokens as f64 <= bound, "{window:?}: {most:?} {bound}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twice_the_limit_gets_429s_with_retry_after_and_the_headers() {
    let upstream = start(Config {
        latency: 10 * MS,
        limits: limits(Some(20.0), Some(100_000.0), None),
        ..Config::default()
    });
    let url = upstream.url();
    let client = client();
    // 40 a second for 2 s, each call on its own task.
    let mut ticks = tokio::time::interval(25 * MS);
    let mut calls = Vec::new();
    let started = Instant::now();
    for _ in 0..80 {
        ticks.tick().await;
        let (client, url) = (client.clone(), url.clone());
        calls.push(tokio::spawn(async move { call(&client, &url).await }));
    }
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap());
    }
    let elapsed = started.elapsed();
    let ok = answers
        .iter()
        .filter(|a| a.status == StatusCode::OK)
        .count();
    let refused: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.status == StatusCode::TOO_MANY_REQUESTS)
        .collect();
    assert_eq!(ok + refused.len(), 80);
    // The burst at least, and no more than the burst and the rate.
    assert!(ok >= 20, "{ok}");
    assert!(
        ok as f64 <= 20.0 + 20.0 * elapsed.as_secs_f64(),
        "{ok} in {elapsed:?}"
    );
    assert!(!refused.is_empty());
    for answer in refused {
        let retry_after: u64 = answer.header("retry-after").unwrap().parse().unwrap();
        assert!((1..=2).contains(&retry_after), "{answer:?}");
        assert_eq!(
            answer.header("ratelimit-policy"),
            Some("\"requests\";q=20;w=1, \"tokens\";q=100000;w=1")
        );
        let (remaining, full_in) = answer.ratelimit("requests");
        assert_eq!(remaining, 0, "{answer:?}");
        assert!((1..=2).contains(&full_in), "{answer:?}");
        let (tokens, _) = answer.ratelimit("tokens");
        assert!(tokens <= 100_000);
        assert_eq!(answer.header("x-ratelimit-limit-requests"), Some("20"));
        assert_eq!(answer.header("x-ratelimit-remaining-requests"), Some("0"));
        let reset: f64 = answer
            .header("x-ratelimit-reset-requests")
            .unwrap()
            .parse()
            .unwrap();
        assert!(reset > 0.0 && reset <= 1.0, "{answer:?}");
        assert_eq!(answer.header("x-ratelimit-limit-tokens"), Some("100000"));
        assert!(answer.header("x-ratelimit-remaining-tokens").is_some());
        assert!(answer.header("x-ratelimit-reset-tokens").is_some());
        assert_eq!(answer.header("x-usage-tokens"), None);
        assert_eq!(
            answer.body,
            "{\"error\":{\"type\":\"rate_limit_exceeded\",\"limits\":[\"requests\"]}}"
        );
    }
    assert_limits_held(&upstream.stats(), 120);
}

#[tokio::test]
async fn within_the_limit_every_call_gets_200_with_its_usage() {
    let upstream = start(Config {
        latency: 20 * MS,
        seed: 42,
        ..Config::default()
    });
    let (url, client) = (upstream.url(), client());
    // One at a time: 15 calls can neither empty the 50 requests nor the
    // 3 000 tokens.
    let mut charged = 0;
    for n in 0..15 {
        let answer = call(&client, &url).await;
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        assert_eq!(answer.header("content-type"), Some("application/json"));
        assert_eq!(answer.header("retry-after"), None);
        // Calls one at a time are admitted in order: the nth costs the
        // seed's nth cost.
        let cost = answer.usage();
        assert_eq!(cost, upstream.config().token_cost(n));
        assert!((20..=120).contains(&cost));
        charged += cost;
        assert_eq!(
            answer.header("ratelimit-policy"),
            Some("\"requests\";q=50;w=1, \"tokens\";q=3000;w=1")
        );
        let (requests, _) = answer.ratelimit("requests");
        assert!((49 - n..=50).contains(&requests), "{n}: {answer:?}");
        let (tokens, full_in) = answer.ratelimit("tokens");
        assert!(
            tokens >= 3000 - charged && tokens <= 3000 - cost,
            "{answer:?}"
        );
        assert!((1..=2).contains(&full_in), "{answer:?}");
        let remaining = answer.header("x-ratelimit-remaining-tokens").unwrap();
        assert_eq!(remaining, tokens.to_string());
        let reset: f64 = answer
            .header("x-ratelimit-reset-tokens")
            .unwrap()
            .parse()
            .unwrap();
        assert!(reset > 0.0 && reset <= 1.0, "{answer:?}");
    }
    let totals = upstream.totals();
    assert_eq!(
        (totals.admitted, totals.refused, totals.tokens),
        (15, 0, charged)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limits_hold_in_every_window() {
    // Requests binding, tokens binding, and both near each other.
    let cases = [
        (Some(40.0), None),
        (None, Some(1500.0)),
        (Some(30.0), Some(2000.0)),
    ];
    for (rps, tps) in cases {
        let upstream = start(Config {
            latency: 20 * MS,
            jitter: 20 * MS,
            limits: limits(rps, tps, None),
            ..Config::default()
        });
        let url = upstream.url();
        let client = client();
        let run = Duration::from_millis(1500);
        let started = Instant::now();
        // Eight clients, each calling again as soon as it is answered (a
        // little later after a 429, to spare the machine).
        let clients: Vec<_> = (0..8)
            .map(|_| {
                let (client, url) = (client.clone(), url.clone());
                tokio::spawn(async move {
                    while started.elapsed() < run {
                        if call(&client, &url).await.status == StatusCode::TOO_MANY_REQUESTS {
                            tokio::time::sleep(10 * MS).await;
                        }
                    }
                })
            })
            .collect();
        for client in clients {
            client.await.unwrap();
        }
        let stats = upstream.stats();
        assert_limits_held(&stats, 120);
        let totals = stats.totals;
        assert!(totals.refused > 0, "{rps:?} {tps:?}: {totals:?}");
        if rps.is_none() {
            assert!(totals.refused_by.tokens > 0, "{totals:?}");
        }
        if tps.is_none() {
            assert!(totals.refused_by.requests > 0, "{totals:?}");
            // The burst at least went through.
            assert!(totals.admitted >= 40, "{totals:?}");
        }
        assert_eq!(totals.refused_by.in_flight, 0);
        let usage = stats.fraction_used(Duration::ZERO, stats.elapsed);
        for fraction in [usage.requests, usage.tokens].into_iter().flatten() {
            assert!(fraction > 0.0, "{usage:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_flight_limit_refuses_the_extra_call() {
    let upstream = start(Config {
        latency: 400 * MS,
        limits: limits(None, None, Some(2)),
        ..Config::default()
    });
    let (url, client) = (upstream.url(), client());
    let first: Vec<_> = (0..2)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move { call(&client, &url).await })
        })
        .collect();
    let waited = Instant::now();
    while upstream.totals().admitted < 2 {
        assert!(waited.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(MS).await;
    }
    let extra = call(&client, &url).await;
    assert_eq!(extra.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(extra.header("retry-after"), Some("1"));
    assert_eq!(
        extra.body,
        "{\"error\":{\"type\":\"rate_limit_exceeded\",\"limits\":[\"in_flight\"]}}"
    );
    // No rate, no rate-limit headers.
    assert_eq!(extra.header("ratelimit"), None);
    assert_eq!(extra.header("ratelimit-policy"), None);
    for call in first {
        let answer = call.await.unwrap();
        assert_eq!(answer.status, StatusCode::OK);
        answer.usage();
    }
    assert_eq!(call(&client, &url).await.status, StatusCode::OK);
    let totals = upstream.totals();
    assert_eq!((totals.admitted, totals.refused), (3, 1));
    assert_eq!(totals.refused_by.in_flight, 1);
    assert_eq!(totals.max_in_flight, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_in_debt_refuse_until_they_refill() {
    let upstream = start(Config {
        tokens: 50..=50,
        latency: 50 * MS,
        limits: limits(None, Some(100.0), None),
        ..Config::default()
    });
    let (url, client) = (upstream.url(), client());
    // All three are admitted: the bucket holds 100 and is charged only
    // when they complete, 150 in all.
    let calls: Vec<_> = (0..3)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move { call(&client, &url).await })
        })
        .collect();
    for call in calls {
        let answer = call.await.unwrap();
        assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        assert_eq!(answer.usage(), 50);
    }
    // About 50 in debt, paid back at 100 a second.
    let refused = call(&client, &url).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{refused:?}");
    assert_eq!(
        refused.body,
        "{\"error\":{\"type\":\"rate_limit_exceeded\",\"limits\":[\"tokens\"]}}"
    );
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(
        refused.header("ratelimit-policy"),
        Some("\"tokens\";q=100;w=1")
    );
    let (remaining, full_in) = refused.ratelimit("tokens");
    assert_eq!((remaining, full_in), (0, 2), "{refused:?}");
    assert_eq!(refused.header("x-ratelimit-remaining-tokens"), Some("0"));
    let reset: f64 = refused
        .header("x-ratelimit-reset-tokens")
        .unwrap()
        .parse()
        .unwrap();
    assert!(reset > 1.0 && reset <= 1.5, "{refused:?}");
    assert!(upstream.totals().max_token_debt >= 20);
    tokio::time::sleep(700 * MS).await;
    assert_eq!(call(&client, &url).await.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stats_add_up_to_what_the_clients_saw() {
    let upstream = start(Config {
        latency: 10 * MS,
        seed: 7,
        limits: limits(Some(20.0), Some(1000.0), None),
        ..Config::default()
    });
    let url = upstream.url();
    let client = client();
    // Ten clients, six calls each.
    let clients: Vec<_> = (0..10)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                let mut seen = (Vec::new(), 0);
                for _ in 0..6 {
                    let answer = call(&client, &url).await;
                    match answer.status {
                        StatusCode::OK => seen.0.push(answer.usage()),
                        StatusCode::TOO_MANY_REQUESTS => seen.1 += 1,
                        other => panic!("{other}"),
                    }
                    tokio::time::sleep(20 * MS).await;
                }
                seen
            })
        })
        .collect();
    let (mut costs, mut refused) = (Vec::new(), 0);
    for client in clients {
        let (seen, no) = client.await.unwrap();
        costs.extend(seen);
        refused += no;
    }
    let admitted = costs.len() as u64;
    assert_eq!(admitted + refused, 60);
    assert!(admitted >= 20, "{admitted}");

    let json = stats_json(&client, &url).await;
    let stats = upstream.stats();
    let totals = &json["totals"];
    assert_eq!(totals["admitted"], admitted);
    assert_eq!(totals["completed"], admitted);
    assert_eq!(totals["refused"], refused);
    assert_eq!(totals["tokens"], costs.iter().sum::<u64>());
    assert_eq!(json["bucket_ms"], 100);
    assert_eq!(json["limits"]["requests_per_second"], 20.0);
    assert_eq!(json["limits"]["max_in_flight"], serde_json::Value::Null);
    // The same in Rust (no call in between).
    assert_eq!(stats.totals.admitted, admitted);
    assert_eq!(stats.totals.refused, refused);
    assert_eq!(totals["max_in_flight"], stats.totals.max_in_flight);
    assert!(stats.totals.max_in_flight <= 10);
    // A call refused by both buckets counts for each.
    let by = |limit: &str| totals["refused_by"][limit].as_u64().unwrap();
    assert!(by("requests") + by("tokens") >= refused);
    assert!(by("requests").max(by("tokens")) <= refused);
    assert_eq!(by("in_flight"), 0);
    // The buckets: one per 100 ms from the start, adding up to the totals.
    let buckets = json["buckets"].as_array().unwrap();
    let sum = |key: &str| {
        buckets
            .iter()
            .map(|b| b[key].as_u64().unwrap())
            .sum::<u64>()
    };
    assert_eq!(sum("admitted"), admitted);
    assert_eq!(sum("refused"), refused);
    assert_eq!(sum("tokens"), costs.iter().sum::<u64>());
    for (i, bucket) in buckets.iter().enumerate() {
        assert_eq!(bucket["start_ms"], 100 * i as u64);
    }
    let most = buckets
        .iter()
        .map(|b| b["max_in_flight"].as_u64().unwrap())
        .max();
    assert_eq!(most, Some(u64::from(stats.totals.max_in_flight)));
    assert!(json["elapsed_ms"].as_u64().unwrap() >= 100 * (buckets.len() as u64 - 1));
    // The exact records: one time per admission, one charge per call.
    assert_eq!(stats.admissions.len() as u64, admitted);
    assert!(stats.admissions.is_sorted());
    let mut charged: Vec<u64> = stats.charges.iter().map(|&(_, cost)| cost).collect();
    // The costs are the seed's first ones, in some order.
    let mut expected: Vec<u64> = (0..admitted)
        .map(|n| upstream.config().token_cost(n))
        .collect();
    costs.sort_unstable();
    charged.sort_unstable();
    expected.sort_unstable();
    assert_eq!(costs, expected);
    assert_eq!(charged, expected);
    assert_limits_held(&stats, 120);
}

#[tokio::test]
async fn retry_after_as_an_http_date() {
    let upstream = start(Config {
        latency: MS,
        retry_after: RetryAfter::HttpDate,
        limits: limits(Some(1.0), None, None),
        ..Config::default()
    });
    let (url, client) = (upstream.url(), client());
    assert_eq!(call(&client, &url).await.status, StatusCode::OK);
    let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let refused = call(&client, &url).await;
    let after = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    // At least a second away, and no further than the wait (under a
    // second) rounded up.
    let date = refused.header("retry-after").unwrap();
    let candidates: BTreeSet<String> = (before.as_secs() + 1..=after.as_secs() + 2)
        .map(|secs| http_date(UNIX_EPOCH + Duration::from_secs(secs)))
        .collect();
    assert!(candidates.contains(date), "{date} not in {candidates:?}");
    assert!(refused.header("ratelimit").is_some());
}

#[tokio::test]
async fn each_style_of_headers() {
    let styles = [
        (RateLimitHeaders::All, RetryAfter::Seconds, 8),
        (RateLimitHeaders::Ietf, RetryAfter::Seconds, 2),
        (RateLimitHeaders::XRateLimit, RetryAfter::Seconds, 6),
        (RateLimitHeaders::None, RetryAfter::Omitted, 0),
    ];
    for (headers, retry_after, count) in styles {
        let upstream = start(Config {
            latency: MS,
            headers,
            retry_after,
            limits: limits(Some(1.0), Some(1000.0), None),
            ..Config::default()
        });
        let (url, client) = (upstream.url(), client());
        let ok = call(&client, &url).await;
        let refused = call(&client, &url).await;
        assert_eq!(ok.status, StatusCode::OK);
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        for answer in [&ok, &refused] {
            let names = answer.headers.keys().map(|name| name.as_str());
            let ratelimit = names.filter(|name| name.contains("ratelimit")).count();
            assert_eq!(ratelimit, count, "{headers:?}: {answer:?}");
        }
        ok.usage();
        assert_eq!(
            refused.header("retry-after").is_some(),
            retry_after == RetryAfter::Seconds
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_answers_the_calls_in_flight_and_frees_the_port() {
    let upstream = start(Config {
        latency: 200 * MS,
        ..Config::default()
    });
    let (url, addr) = (upstream.url(), upstream.addr());
    let client = client();
    let in_flight = tokio::spawn(async move { call(&client, &url).await });
    while upstream.totals().admitted < 1 {
        tokio::time::sleep(MS).await;
    }
    // Waits for the call (a thread join: off the runtime's threads).
    tokio::task::spawn_blocking(move || upstream.shutdown())
        .await
        .unwrap();
    let answer = in_flight.await.unwrap();
    assert_eq!(answer.status, StatusCode::OK);
    answer.usage();
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[test]
fn only_loopback_addresses() {
    for addr in ["0.0.0.0:0", "[::]:0", "192.0.2.1:0"] {
        let config = Config {
            addr: addr.parse().unwrap(),
            ..Config::default()
        };
        let error = Upstream::start(config).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput, "{addr}");
    }
    let upstream = Upstream::start(Config::default()).unwrap();
    assert!(upstream.addr().ip().is_loopback());
    assert_ne!(upstream.addr().port(), 0);
}
