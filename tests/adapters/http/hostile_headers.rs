//! Client-written forwarding headers never choose the client's key,
//! whatever their syntax or size, and header keys keep their bytes.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use ::http::{HeaderMap, HeaderValue, Request};
use paceline::http::{ClientIpSource, Header, KeyExtractor, TrustedProxies};

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn proxies(source: ClientIpSource) -> TrustedProxies {
    TrustedProxies::new(source, ["10.0.0.0/8", "fd00::/8"]).unwrap()
}

fn one(name: &'static str, value: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.append(name, HeaderValue::from_str(value).unwrap());
    headers
}

const PROXY: &str = "10.0.0.5";

/// HAProxy's order (`proto;host;by;for`): a quoted comma in the host does
/// not move the read off the proxy's `for=` (pinned: correct today).
#[test]
fn haproxy_order_with_a_quoted_comma_reads_the_proxys_for() {
    let proxies = proxies(ClientIpSource::Forwarded);
    let element = "proto=https;host=\"a,b\";by=10.0.0.5;for=203.0.113.7";
    let client = proxies.client_ip(ip(PROXY), &one("forwarded", element));
    assert_eq!(client, ip("203.0.113.7"));
}

/// Odd syntax the client writes to the left of the proxy's entry never
/// reaches the key; zones and ports are read as documented.
#[test]
fn odd_entries_left_of_the_proxys_are_not_read() {
    let xff = proxies(ClientIpSource::XForwardedFor);
    for (value, client) in [
        ("6.6.6.6, 203.0.113.7", "203.0.113.7"),
        ("6.6.6.6,,,, 203.0.113.7", "203.0.113.7"),
        ("fe80::1%eth0, 203.0.113.7", "203.0.113.7"),
        ("[2001:db8::1]:80, 203.0.113.7:4711", "203.0.113.7"),
        // Every entry trusted: the leftmost.
        ("10.0.0.9, [fd00::1]:80", "10.0.0.9"),
        // A zone on the proxy's own entry: not an address, so the peer.
        ("6.6.6.6, fe80::1%eth0", PROXY),
        ("6.6.6.6, 0x7f.1", PROXY),
        ("6.6.6.6, 010.0.0.1", PROXY),
        ("6.6.6.6, ::ffff:10.0.0.9", "6.6.6.6"),
        ("6.6.6.6, 1.2.3.4 5.6.7.8", PROXY),
    ] {
        let got = xff.client_ip(ip(PROXY), &one("x-forwarded-for", value));
        assert_eq!(got, ip(client), "{value}");
    }
    // From an untrusted peer: the peer, whatever the headers.
    let peer = ip("198.51.100.1");
    assert_eq!(
        xff.client_ip(peer, &one("x-forwarded-for", "10.0.0.9")),
        peer
    );
    let fwd = proxies(ClientIpSource::Forwarded);
    assert_eq!(fwd.client_ip(peer, &one("forwarded", "for=1.2.3.4")), peer);
    let real = proxies("X-Real-IP".parse().unwrap());
    assert_eq!(real.client_ip(peer, &one("x-real-ip", "1.2.3.4")), peer);
    // A zone in X-Real-IP: garbage, the peer.
    assert_eq!(
        real.client_ip(ip(PROXY), &one("x-real-ip", "fe80::1%eth0")),
        ip(PROXY)
    );
}

/// Thousands of lines and a 1 MiB line of commas: read in bounded time,
/// the proxy's own entry wins.
#[test]
fn huge_and_many_forwarding_headers_are_bounded() {
    let xff = proxies(ClientIpSource::XForwardedFor);
    let mut headers = HeaderMap::new();
    for i in 0..10_000u32 {
        let value = format!("6.6.{}.{}", i / 256 % 256, i % 256);
        headers.append("x-forwarded-for", HeaderValue::from_str(&value).unwrap());
    }
    headers.append("x-forwarded-for", HeaderValue::from_static("203.0.113.7"));
    let start = Instant::now();
    assert_eq!(xff.client_ip(ip(PROXY), &headers), ip("203.0.113.7"));
    let big = format!("{}203.0.113.7", "6.6.6.6,".repeat(1 << 17));
    let start_big = Instant::now();
    assert_eq!(
        xff.client_ip(ip(PROXY), &one("x-forwarded-for", &big)),
        ip("203.0.113.7")
    );
    // All trusted, 1 MiB of them: stops at 64 hops.
    let trusted = "10.0.0.1,".repeat(1 << 17) + "10.0.0.2";
    assert_eq!(
        xff.client_ip(ip(PROXY), &one("x-forwarded-for", &trusted)),
        ip("10.0.0.1")
    );
    let commas = ",".repeat(1 << 20);
    assert_eq!(
        xff.client_ip(ip(PROXY), &one("x-forwarded-for", &commas)),
        ip(PROXY)
    );
    // Linear, some milliseconds; a reading quadratic in the length would
    // take hours. The bounds are loose so that a loaded machine passes.
    assert!(start_big.elapsed() < Duration::from_secs(10));
    assert!(start.elapsed() < Duration::from_secs(20));
}

/// A header key keeps its bytes: distinct values, distinct keys, among
/// values that read as each other's escapes.
#[test]
fn header_keys_of_distinct_bytes_are_distinct() {
    let key = Header(::http::header::AUTHORIZATION);
    let of = |value: &[u8]| {
        let request = Request::builder()
            .header("authorization", HeaderValue::from_bytes(value).unwrap())
            .body(())
            .unwrap();
        key.key(&request).unwrap()
    };
    let values: [&[u8]; 10] = [
        b"a",
        b"a\\",
        b"a\\\\",
        b"a\xff",
        b"a\\xff",
        b"a\\\\xff",
        b"a\xc3",
        b"a\xc3\xa9",
        "aé".as_bytes(),
        b"a\t",
    ];
    let keys: std::collections::HashSet<String> = values.iter().map(|v| of(v)).collect();
    // `a\xc3\xa9` and `aé` are the same bytes.
    assert_eq!(keys.len(), values.len() - 1);
    let missing = Request::builder().body(()).unwrap();
    assert_eq!(key.key(&missing).unwrap(), of(b""));
}

/// A long header value makes a short key: a client sending a new value of
/// 100 000 bytes with each request (each one a key) had every key hold
/// 400 000 bytes (a byte that is not UTF-8 is written `\xNN`), so that
/// `max_keys` bounded how many keys were held but not their memory: 10 000
/// keys, 4 GB. A value over 256 bytes is keyed by its first 256, its length
/// and a digest of the whole; values that differ anywhere stay apart.
#[test]
fn a_long_header_value_makes_a_short_key() {
    let key = Header(::http::header::AUTHORIZATION);
    let of = |value: &[u8]| {
        let request = Request::builder()
            .header("authorization", HeaderValue::from_bytes(value).unwrap())
            .body(())
            .unwrap();
        key.key(&request).unwrap()
    };
    let long = vec![0xff; 100_000];
    assert!(of(&long).len() <= 1_100, "{}", of(&long).len());
    let mut last = long.clone();
    last[99_999] = 0xfe;
    let mut first = long.clone();
    first[0] = 0xfe;
    let longer = vec![0xff; 100_001];
    let keys: std::collections::HashSet<String> =
        [&long, &last, &first, &longer].map(|v| of(v)).into();
    assert_eq!(keys.len(), 4);
    // Up to 256 bytes, a value is its key, as before.
    assert_eq!(of(&[b'a'; 256]), "a".repeat(256));
    assert_ne!(of(&[b'a'; 257]), of(&[b'a'; 256]));
    assert!(of(&[b'a'; 257]).starts_with(&"a".repeat(256)));
}
