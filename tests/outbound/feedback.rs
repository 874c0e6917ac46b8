//! The feedback of a response: `Retry-After`, the `RateLimit` fields and
//! the `X-RateLimit-*` headers, read from bytes a client or an upstream
//! controls.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use paceline::outbound::{Feedback, Quota};

/// Wed, 01 May 2024 12:00:00 GMT.
const NOW_SECS: u64 = 1_714_564_800;

fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(NOW_SECS)
}

const DAY: Duration = Duration::from_secs(86_400);

fn secs(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// The feedback of a response with these headers, read at [`now`].
fn read(status: u16, headers: &[(&str, &str)]) -> Feedback {
    let headers = headers
        .iter()
        .map(|(name, value)| (*name, value.as_bytes()));
    Feedback::from_headers(status, headers, now())
}

fn retry_after_of(value: &str) -> Option<Duration> {
    read(429, &[("Retry-After", value)]).retry_after()
}

/// The unnamed quota's reset, from `X-RateLimit-Reset: value`.
fn reset_of(value: &str) -> Option<Duration> {
    let feedback = read(200, &[("X-RateLimit-Reset", value)]);
    feedback.quota(None).and_then(|quota| quota.reset)
}

fn quota(
    name: Option<&str>,
    limit: Option<u64>,
    window: Option<Duration>,
    remaining: Option<u64>,
    reset: Option<Duration>,
) -> Quota {
    let mut quota = name.map_or_else(Quota::default, Quota::named);
    quota.limit = limit;
    quota.window = window;
    quota.remaining = remaining;
    quota.reset = reset;
    quota
}

#[test]
fn retry_after_in_seconds() {
    assert_eq!(retry_after_of("120"), Some(secs(120)));
    assert_eq!(retry_after_of("0"), Some(Duration::ZERO));
    assert_eq!(retry_after_of(" 3\t"), Some(secs(3)));
    assert_eq!(retry_after_of("1.5"), Some(ms(1500)));
    assert_eq!(
        retry_after_of("0.0000000019"),
        Some(Duration::from_nanos(1))
    );
    for bad in ["", "-1", "1e3", "1.", ".5", "1.2.3", "soon", "+5", "0x10"] {
        assert_eq!(retry_after_of(bad), None, "{bad:?}");
    }
}

#[test]
fn retry_after_as_an_http_date_against_now() {
    // The three forms HTTP recipients read; the RFC 850 one's two-digit
    // year in the century nearest now (2024).
    for future in [
        "Wed, 01 May 2024 12:02:00 GMT",
        "Wednesday, 01-May-24 12:02:00 GMT",
        "Wed May  1 12:02:00 2024",
    ] {
        assert_eq!(retry_after_of(future), Some(secs(120)), "{future}");
    }
    for past in [
        "Wed, 01 May 2024 11:59:59 GMT",
        "Sun, 06 Nov 1994 08:49:37 GMT",
        "Sun Nov  6 08:49:37 1994",
        "Sunday, 06-Nov-94 08:49:37 GMT",
        "Thu, 01 Jan 1970 00:00:00 GMT",
        "Mon, 01 Jan 1900 00:00:00 GMT",
    ] {
        assert_eq!(retry_after_of(past), Some(Duration::ZERO), "{past}");
    }
    for bad in [
        "Wed, 01 May 2024 24:00:00 GMT",
        "Wed, 01 May 2024 12:60:00 GMT",
        "Wed, 32 May 2024 12:00:00 GMT",
        "Wed, 00 May 2024 12:00:00 GMT",
        "Wed, 01 Mai 2024 12:00:00 GMT",
        "Wed, 01 may 2024 12:00:00 GMT",
        "Wed, 01 May 2024 12:00:00 UTC",
        "Wed, 1 May 2024 12:00:00 GMT",
        "Wed May 01 12:02:00 24",
        "Wed, 01-May-24 12:02:00 GMT",
        "Wednesdays, 01-May-24 12:02:00 GMT",
        "Wednesday, 01-May-2024 12:02:00 GMT",
        "Wednesday 01-May-24 12:02:00 GMT",
    ] {
        assert_eq!(retry_after_of(bad), None, "{bad}");
    }
    // The calendar itself is checked inside (`values.rs`).
}

#[test]
fn an_absurd_retry_after_is_cut_to_a_day() {
    assert_eq!(retry_after_of("86400"), Some(DAY));
    assert_eq!(retry_after_of("86401"), Some(DAY));
    assert_eq!(retry_after_of("18446744073709551615"), Some(DAY));
    assert_eq!(retry_after_of("Fri, 31 Dec 9999 23:59:59 GMT"), Some(DAY));
    // One past u64: longer still, so a day too (it was once left out, and
    // paused for the default second).
    assert_eq!(retry_after_of("18446744073709551616"), Some(DAY));
    assert_eq!(retry_after_of("-18446744073709551616"), None);
    let built = Feedback::new(429).with_retry_after(Duration::MAX);
    assert_eq!(built.retry_after(), Some(DAY));
}

#[test]
fn policy_and_ratelimit_merge_by_name() {
    let feedback = read(
        200,
        &[
            ("RateLimit", "\"requests\";r=49;t=1, \"tokens\";r=2950;t=1"),
            (
                "RateLimit-Policy",
                "\"requests\";q=50;w=1, \"tokens\";q=3000;w=1",
            ),
        ],
    );
    let (one, none) = (Some(secs(1)), None);
    assert_eq!(
        feedback.quotas(),
        [
            quota(Some("requests"), Some(50), one, Some(49), one),
            quota(Some("tokens"), Some(3000), one, Some(2950), one),
        ]
    );
    assert_eq!(feedback.quota(None), none);
    assert_eq!(feedback.retry_after(), None);
    assert!(feedback.status() == 200 && !feedback.is_throttled());
}

#[test]
fn policies_as_tokens_with_other_parameters() {
    let feedback = read(
        200,
        &[
            (
                "RateLimit-Policy",
                "burst;q=100;w=60;pk=:cHsdsRa894=:, daily;q=1000;w=86400",
            ),
            ("RateLimit", "burst;r=0;t=42;pk=:cHsdsRa894=:"),
        ],
    );
    assert_eq!(
        feedback.quotas(),
        [
            quota(
                Some("burst"),
                Some(100),
                Some(secs(60)),
                Some(0),
                Some(secs(42))
            ),
            quota(Some("daily"), Some(1000), Some(secs(86_400)), None, None),
        ]
    );
}

#[test]
fn the_older_ietf_forms() {
    let separate = read(
        200,
        &[
            ("RateLimit-Limit", "50"),
            ("RateLimit-Remaining", "49"),
            ("RateLimit-Reset", "1"),
        ],
    );
    let unnamed = [quota(None, Some(50), None, Some(49), Some(secs(1)))];
    assert_eq!(separate.quotas(), unnamed);
    let combined = read(200, &[("RateLimit", "limit=50, remaining=49, reset=1")]);
    assert_eq!(combined.quotas(), unnamed);
    let policy = read(200, &[("RateLimit-Policy", "50;w=1")]);
    assert_eq!(
        policy.quotas(),
        [quota(None, Some(50), Some(secs(1)), None, None)]
    );
    let with_window = read(200, &[("RateLimit-Limit", "10, 10;w=1, 50;w=60")]);
    assert_eq!(
        with_window.quotas(),
        [quota(None, Some(10), None, None, None)]
    );
    let windowed = read(200, &[("RateLimit-Limit", "100;w=60")]);
    assert_eq!(windowed.quota(None).unwrap().window, Some(secs(60)));
}

/// Two policies of one name in one line are two limits, the more
/// restrictive one binding: never a field of one with a field of the other
/// (`100, 5000;w=3600` read as 100 an hour, 50 times too slow). Items that
/// set different fields are still one quota.
#[test]
fn two_policies_of_one_name_in_a_line_keep_the_more_restrictive() {
    let hourly = quota(None, Some(5000), Some(secs(3600)), None, None);
    for line in [
        "100, 5000;w=3600",
        "100;w=60, 5000;w=3600",
        "5000;w=3600, 100;w=60",
    ] {
        let feedback = read(200, &[("RateLimit-Policy", line)]);
        assert_eq!(feedback.quotas(), std::slice::from_ref(&hourly), "{line}");
    }
    let named = read(
        200,
        &[(
            "RateLimit-Policy",
            "\"tokens\";q=10;w=1, \"tokens\";q=300;w=60",
        )],
    );
    assert_eq!(
        named.quotas(),
        [quota(Some("tokens"), Some(300), Some(secs(60)), None, None)]
    );
    // The fewer left, with its own reset.
    let left = read(200, &[("RateLimit", "r=5;t=10, r=2;t=30, r=9;t=1")]);
    assert_eq!(
        left.quotas(),
        [quota(None, None, None, Some(2), Some(secs(30)))]
    );
    // Different fields: one quota.
    let parts = read(200, &[("RateLimit", "limit=50, remaining=49, reset=1")]);
    assert_eq!(
        parts.quotas(),
        [quota(None, Some(50), None, Some(49), Some(secs(1)))]
    );
}

#[test]
fn x_ratelimit_unnamed_with_an_epoch_reset() {
    let reset = (NOW_SECS + 3600).to_string();
    let feedback = read(
        200,
        &[
            ("X-RateLimit-Limit", "5000"),
            ("X-RateLimit-Remaining", "4999"),
            ("X-RateLimit-Reset", &reset),
            ("X-RateLimit-Used", "1"),
            ("X-RateLimit-Resource", "core"),
        ],
    );
    assert_eq!(
        feedback.quotas(),
        [quota(None, Some(5000), None, Some(4999), Some(secs(3600)))]
    );
}

#[test]
fn x_ratelimit_with_suffixes() {
    let feedback = read(
        200,
        &[
            ("X-RateLimit-Limit-Requests", "60"),
            ("X-RateLimit-Limit-Tokens", "150000"),
            ("X-RateLimit-Remaining-Requests", "59"),
            ("X-RateLimit-Remaining-Tokens", "149984"),
            ("X-RateLimit-Reset-Requests", "1s"),
            ("X-RateLimit-Reset-Tokens", "6m0s"),
        ],
    );
    assert_eq!(
        feedback.quotas(),
        [
            quota(Some("requests"), Some(60), None, Some(59), Some(secs(1))),
            quota(
                Some("tokens"),
                Some(150_000),
                None,
                Some(149_984),
                Some(secs(360))
            ),
        ]
    );
    let after = read(200, &[("X-RateLimit-Reset-After", "1.234")]);
    assert_eq!(after.quota(None).unwrap().reset, Some(ms(1234)));
    let after = read(200, &[("x-ratelimit-reset-after-tokens", "17ms")]);
    assert_eq!(after.quota(Some("tokens")).unwrap().reset, Some(ms(17)));
}

#[test]
fn resets_in_every_form() {
    let at = |offset: i64| NOW_SECS.checked_add_signed(offset).unwrap().to_string();
    let at_ms = |offset: i64| {
        (NOW_SECS * 1000)
            .checked_add_signed(offset)
            .unwrap()
            .to_string()
    };
    let at_us = |offset: i64| {
        (NOW_SECS * 1_000_000)
            .checked_add_signed(offset)
            .unwrap()
            .to_string()
    };
    let at_ns = |offset: i64| {
        (NOW_SECS * 1_000_000_000)
            .checked_add_signed(offset)
            .unwrap()
            .to_string()
    };
    let cases = [
        ("1", Some(secs(1))),
        ("0", Some(Duration::ZERO)),
        ("0.020", Some(ms(20))),
        ("6m0s", Some(secs(360))),
        ("17ms", Some(ms(17))),
        ("1h2m3.5s", Some(ms(3_723_500))),
        ("1.5h", Some(secs(5400))),
        ("500us", Some(Duration::from_micros(500))),
        ("250µs", Some(Duration::from_micros(250))),
        ("250μs", Some(Duration::from_micros(250))),
        ("10ns", Some(Duration::from_nanos(10))),
        ("0s", Some(Duration::ZERO)),
        (&at(30), Some(secs(30))),
        (&format!("{}.5", at(30)), Some(ms(30_500))),
        (&at(-30), Some(Duration::ZERO)),
        (&at_ms(1500), Some(ms(1500))),
        (&at_ms(-1500), Some(Duration::ZERO)),
        // In microseconds and nanoseconds too (once read as milliseconds,
        // far in the future: a day).
        (&at_us(1_500_000), Some(ms(1500))),
        (&at_us(-1_500_000), Some(Duration::ZERO)),
        (&at_ns(1_500_000_000), Some(ms(1500))),
        (&at_ns(-1_500_000_000), Some(Duration::ZERO)),
        ("Wed, 01 May 2024 12:00:09 GMT", Some(secs(9))),
        // Just under 10^9: seconds from now, cut to a day.
        ("999999999", Some(DAY)),
        ("1000000h", Some(DAY)),
        // 10^18 ns since the epoch: 2001, past.
        ("1000000000000000000", Some(Duration::ZERO)),
        ("18446744073709551615", Some(DAY)),
        ("18446744073709551615ms", Some(DAY)),
        // Past a u64 of seconds: longer still (once left out).
        ("18446744073709551616", Some(DAY)),
        ("18446744073709551616s", Some(DAY)),
    ];
    for (value, reset) in cases {
        assert_eq!(reset_of(value), reset, "{value}");
        // The older IETF header reads each whole too (an HTTP-date holds a
        // comma, which once cut it to `Wed`).
        let older = read(200, &[("RateLimit-Reset", value)]);
        assert_eq!(older.quota(None).and_then(|q| q.reset), reset, "{value}");
    }
    for bad in [
        "", "6x", "m", "1..2s", "-5", "1h-2m", "h1", "1 h", "1hh", "1e9", "1.s", "\u{b5}s",
    ] {
        assert_eq!(reset_of(bad), None, "{bad:?}");
    }
}

#[test]
fn names_match_ascii_case_insensitively() {
    let feedback = read(
        200,
        &[
            ("RATELIMIT-POLICY", "\"Requests\";q=50;w=1"),
            ("ratelimit", "\"REQUESTS\";r=49;t=1"),
            ("x-RateLimit-REMAINING-Tokens", "7"),
            ("X-RATELIMIT-LIMIT-TOKENS", "10"),
            ("x-ratelimit-limit-requests", "999"),
            ("retry-AFTER", "2"),
        ],
    );
    let requests = feedback.quota(Some("requests")).unwrap();
    assert_eq!(requests.name.as_deref(), Some("requests"));
    assert_eq!((requests.limit, requests.remaining), (Some(50), Some(49)));
    let tokens = feedback.quota(Some("TOKENS")).unwrap();
    assert_eq!(tokens.name.as_deref(), Some("tokens"));
    assert_eq!((tokens.limit, tokens.remaining), (Some(10), Some(7)));
    assert_eq!(feedback.retry_after(), Some(secs(2)));
}

#[test]
fn the_ietf_headers_come_first_then_the_older_then_x_ratelimit() {
    let feedback = read(
        200,
        &[
            ("X-RateLimit-Remaining", "9"),
            ("X-RateLimit-Limit", "100"),
            ("RateLimit-Remaining", "8"),
            ("RateLimit", "remaining=5"),
            ("X-RateLimit-Remaining-Requests", "3"),
            ("RateLimit-Policy", "\"requests\";q=50"),
            ("RateLimit", "remaining=4"),
        ],
    );
    assert_eq!(
        feedback.quotas(),
        [
            // (The two `RateLimit` lines are one list: the fewer left.)
            quota(None, Some(100), None, Some(4), None),
            quota(Some("requests"), Some(50), None, Some(3), None),
        ]
    );
}

#[test]
fn throttled() {
    let with_retry = |status| read(status, &[("Retry-After", "5")]);
    assert!(read(429, &[]).is_throttled());
    assert!(with_retry(429).is_throttled());
    assert!(with_retry(503).is_throttled());
    assert!(!read(503, &[]).is_throttled());
    assert!(!read(503, &[("Retry-After", "later")]).is_throttled());
    assert!(!with_retry(200).is_throttled());
    assert!(!read(200, &[]).is_throttled());
    // Which statuses are a success, for learning: `lesson.rs`'s unit tests.
    assert_eq!(with_retry(503).status(), 503);
}

#[test]
fn built_by_hand() {
    let mut requests = Quota::named("requests");
    requests.limit = Some(50);
    requests.reset = Some(Duration::MAX);
    let mut again = Quota::named("REQUESTS");
    again.remaining = Some(3);
    let mut feedback = Feedback::new(200)
        .with_quota(requests.clone())
        .with_quota(again);
    assert_eq!(
        feedback.quotas(),
        [quota(Some("requests"), None, None, Some(3), None)]
    );
    requests.reset = Some(DAY);
    feedback = feedback.with_quota(requests.clone());
    assert_eq!(feedback.quotas(), [requests]);
    for i in 0..10 {
        feedback = feedback.with_quota(Quota::named(format!("q{i}")));
    }
    assert_eq!(feedback.quotas().len(), 8);
    assert!(feedback.quota(Some("q6")).is_some() && feedback.quota(Some("q7")).is_none());
    assert_eq!(Feedback::default(), Feedback::new(0));
}

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const NAMES: [&str; 14] = [
    "Retry-After",
    "RateLimit-Policy",
    "RateLimit",
    "RateLimit-Limit",
    "RateLimit-Remaining",
    "RateLimit-Reset",
    "X-RateLimit-Limit",
    "X-RateLimit-Remaining",
    "X-RateLimit-Reset",
    "X-RateLimit-Reset-After",
    "X-RateLimit-Limit-Requests",
    "X-RateLimit-Remaining-Tokens",
    "X-RateLimit-Reset-Tokens",
    "Content-Type",
];

const PIECES: [&[u8]; 32] = [
    b"\"",
    b";",
    b",",
    b"=",
    b" ",
    b"\\",
    b"(",
    b")",
    b"q=",
    b"w=",
    b"r=",
    b"t=",
    b"limit=",
    b"remaining=",
    b"reset=",
    b"1",
    b"0",
    b"99999999999999999999",
    b".",
    b"-",
    b"h",
    b"ms",
    b"s",
    b"\xc2\xb5s",
    b"\xff",
    b"\x80",
    b"requests",
    b"\"tokens\"",
    b"Sun, 06 Nov 1994 08:49:37 GMT",
    b"1714564800",
    b"GMT",
    b"-requests",
];

#[cfg(feature = "http")]
#[test]
fn from_an_http_response() {
    let response = ::http::Response::builder()
        .status(429)
        .header("retry-after", "Sun, 06 Nov 1994 08:49:37 GMT")
        .header("ratelimit-policy", "\"requests\";q=50;w=1")
        .header("ratelimit", "\"requests\";r=0;t=1")
        .header(
            "x-ratelimit-remaining-tokens",
            ::http::HeaderValue::from_bytes(b"12\xff").unwrap(),
        )
        .header("x-ratelimit-limit-tokens", "3000")
        .body(())
        .unwrap();
    let feedback = Feedback::from_response(&response);
    assert!(feedback.is_throttled());
    assert_eq!(feedback.retry_after(), Some(Duration::ZERO));
    assert_eq!(
        feedback.quotas(),
        [
            quota(
                Some("requests"),
                Some(50),
                Some(secs(1)),
                Some(0),
                Some(secs(1))
            ),
            quota(Some("tokens"), Some(3000), None, None, None),
        ]
    );
    // A response's head alone reads the same.
    let (parts, ()) = response.into_parts();
    let head = ::http::Response::from_parts(parts, ());
    assert_eq!(Feedback::from_response(&head), feedback);
}

#[test]
fn an_x_ratelimit_value_is_read_whole() {
    let feedback = read(
        200,
        &[
            ("X-RateLimit-Limit", "50, 50"),
            ("X-RateLimit-Remaining", " 49 "),
            ("X-RateLimit-Reset", "Wed, 01 May 2024 12:00:09 GMT"),
        ],
    );
    assert_eq!(
        feedback.quotas(),
        [quota(None, None, None, Some(49), Some(secs(9)))]
    );
}

mod forms;
mod hostile;
