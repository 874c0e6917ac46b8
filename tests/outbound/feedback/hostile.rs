//! Bytes a client or an upstream controls: what is not text, numbers that
//! overflow, odd fields, the bounds on what is kept and looked at, garbage,
//! and long values read in one pass.

use super::*;

#[test]
fn bytes_that_are_not_text_are_left_out() {
    let headers: [(&str, &[u8]); 6] = [
        (
            "RateLimit-Policy",
            b"\"requests\";q=5\xff0;w=1, \"tok\xc3\x28\";q=1",
        ),
        ("RateLimit", b"\"requests\";r=\x809;t=1"),
        ("X-RateLimit-Limit", b"\xff\xfe"),
        ("X-RateLimit-Remaining-\u{442}\u{43e}\u{43a}", b"5"),
        ("x-ratelimit-limi\u{e9}", b"5"),
        ("Retry-After", b"1\xff"),
    ];
    let feedback = Feedback::from_headers(429, headers, now());
    assert_eq!(
        feedback.quotas(),
        [quota(
            Some("requests"),
            None,
            Some(secs(1)),
            None,
            Some(secs(1))
        )]
    );
    assert_eq!(feedback.retry_after(), None);
}

#[test]
fn numbers_that_overflow_are_left_out() {
    let feedback = read(
        200,
        &[
            (
                "RateLimit-Policy",
                "\"requests\";q=18446744073709551616;w=1",
            ),
            ("X-RateLimit-Remaining-Requests", "18446744073709551615"),
            ("X-RateLimit-Limit", "99999999999999999999999999"),
            ("RateLimit", "\"tokens\";r=-1;t=1"),
        ],
    );
    assert_eq!(
        feedback.quotas(),
        [
            quota(Some("requests"), None, Some(secs(1)), Some(u64::MAX), None),
            quota(Some("tokens"), None, None, None, Some(secs(1))),
        ]
    );
}

#[test]
fn odd_structured_fields() {
    let feedback = read(
        200,
        &[
            // A quoted comma, an escape, a parameter without a value, spaces.
            (
                "RateLimit-Policy",
                "\"a,b\";q=1, \"c\\\"d\";q=2, \"e\";q;w=3 , \"f\" ; q=4 ; w=5",
            ),
            // No quota without a field; an inner list; an unterminated string.
            (
                "RateLimit-Policy",
                "\"g\", (\"h\";q=1);q=1, \"\";q=1, \"i;q=6",
            ),
            // A string that is no name, with a `=` in it: left out, not read
            // as a field of the unnamed quota (which it once capped to 1 an
            // hour, spent).
            ("RateLimit-Policy", "\"tier=free\";q=1;w=3600"),
            ("RateLimit", "\"tier=free\";r=0;t=3600"),
        ],
    );
    assert_eq!(
        feedback.quotas(),
        [
            quota(Some("e"), None, Some(secs(3)), None, None),
            quota(Some("f"), Some(4), Some(secs(5)), None, None),
        ]
    );
}

#[test]
fn names_are_bounded() {
    let long = "n".repeat(64);
    let too_long = "n".repeat(65);
    let policy = format!("\"{too_long}\";q=1, \"{long}\";q=2");
    let suffixed = format!("X-RateLimit-Limit-{too_long}");
    let feedback = read(200, &[("RateLimit-Policy", &policy), (&suffixed, "3")]);
    assert_eq!(
        feedback.quotas(),
        [quota(Some(&long), Some(2), None, None, None)]
    );
}

#[test]
fn at_most_8_quotas_and_16_items_a_line() {
    let items: Vec<String> = (0..20).map(|i| format!("\"p{i}\";q={i}")).collect();
    let feedback = read(200, &[("RateLimit-Policy", &items.join(", "))]);
    let names: Vec<_> = feedback
        .quotas()
        .iter()
        .map(|q| q.name.clone().unwrap())
        .collect();
    assert_eq!(names, (0..8).map(|i| format!("p{i}")).collect::<Vec<_>>());
    // Merging into a kept quota goes on past 8.
    let remaining = "\"p9\";r=1, \"p0\";r=2";
    let feedback = read(
        200,
        &[
            ("RateLimit-Policy", &items.join(", ")),
            ("RateLimit", remaining),
        ],
    );
    assert_eq!(feedback.quotas()[0].remaining, Some(2));
    assert!(feedback.quota(Some("p9")).is_none());
    // The 17th item of a line is not read.
    let mut items = vec!["x;q=1".to_owned(); 16];
    items.push("\"last\";q=1".to_owned());
    let feedback = read(200, &[("RateLimit-Policy", &items.join(","))]);
    assert!(feedback.quota(Some("last")).is_none());
    // Nor the 17th parameter of an item.
    let policy = |params: usize| format!("\"a\"{};q=1", ";x=1".repeat(params));
    assert_eq!(read(200, &[("RateLimit-Policy", &policy(16))]).quotas(), []);
    let fifteen = read(200, &[("RateLimit-Policy", &policy(15))]);
    assert_eq!(
        fifteen.quotas(),
        [quota(Some("a"), Some(1), None, None, None)]
    );
}

#[test]
fn at_most_256_lines_looked_at_and_32_read() {
    let mut headers = vec![("Set-Cookie", "a=b"); 255];
    headers.push(("X-RateLimit-Limit", "1"));
    headers.push(("X-RateLimit-Remaining", "1"));
    let feedback = read(200, &headers);
    assert_eq!(feedback.quotas(), [quota(None, Some(1), None, None, None)]);
    let mut headers = vec![("X-RateLimit-Remaining-Empty", "x"); 31];
    headers.push(("X-RateLimit-Limit", "1"));
    headers.push(("X-RateLimit-Remaining", "1"));
    let feedback = read(200, &headers);
    assert_eq!(feedback.quotas(), [quota(None, Some(1), None, None, None)]);
}

/// `Retry-After` is no rate-limit line to crowd out: 32 of them before it
/// (an upstream reporting nine quotas of four fields each, say) left it
/// unread, and a refusal asking for a minute paused for the default
/// second. It is read wherever it comes among the 256 lines looked at, the
/// first that parses winning as before.
#[test]
fn a_retry_after_behind_32_rate_limit_lines_is_read() {
    let mut headers = vec![("X-RateLimit-Remaining-Empty", "x"); 32];
    headers.push(("Retry-After", "soon"));
    headers.push(("Retry-After", "60"));
    headers.push(("Retry-After", "5"));
    assert_eq!(read(429, &headers).retry_after(), Some(secs(60)));
    let mut headers = vec![("Set-Cookie", "a=b"); 256];
    headers.push(("Retry-After", "60"));
    assert_eq!(read(429, &headers).retry_after(), None);
}

// The documented bounds (`Feedback::from_headers`): quotas kept, a name's
// bytes and characters.
const MAX_QUOTAS: usize = 8;

fn is_name(name: &[u8]) -> bool {
    (1..=64).contains(&name.len())
        && name
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&b))
}

fn check_bounds(feedback: &Feedback) {
    assert!(feedback.quotas().len() <= MAX_QUOTAS);
    assert!(feedback.retry_after().is_none_or(|after| after <= DAY));
    for quota in feedback.quotas() {
        assert!(quota.reset.is_none_or(|reset| reset <= DAY), "{quota:?}");
        assert!(
            quota
                .name
                .as_ref()
                .is_none_or(|name| is_name(name.as_bytes())),
            "{quota:?}"
        );
        assert_ne!(
            quota,
            &quota.name.clone().map_or_else(Quota::default, Quota::named)
        );
    }
    let names: Vec<_> = feedback
        .quotas()
        .iter()
        .map(|q| q.name.as_ref().map(|n| n.to_ascii_lowercase()))
        .collect();
    for (at, name) in names.iter().enumerate() {
        assert!(!names[..at].contains(name), "{names:?}");
    }
}

#[test]
fn garbage_neither_panics_nor_passes_the_bounds() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for _ in 0..3000 {
        let lines = rng.below(48);
        let mut headers: Vec<(String, Vec<u8>)> = Vec::with_capacity(lines);
        for _ in 0..lines {
            let mut name: String = NAMES[rng.below(NAMES.len())].to_owned();
            if rng.below(4) == 0 {
                name = name.to_ascii_lowercase();
            }
            if rng.below(8) == 0 {
                name.push_str(&format!("-n{}", rng.below(12)));
            }
            let mut value = Vec::new();
            for _ in 0..rng.below(40) {
                if rng.below(8) == 0 {
                    value.push(rng.next() as u8);
                } else {
                    value.extend_from_slice(PIECES[rng.below(PIECES.len())]);
                }
            }
            headers.push((name, value));
        }
        let status = [200, 429, 503, rng.next() as u16][rng.below(4)];
        let pairs = || {
            headers
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_slice()))
        };
        let feedback = Feedback::from_headers(status, pairs(), now());
        check_bounds(&feedback);
        assert_eq!(feedback, Feedback::from_headers(status, pairs(), now()));
    }
    // Any bytes at all, at any time.
    for _ in 0..3000 {
        let value: Vec<u8> = (0..rng.below(64)).map(|_| rng.next() as u8).collect();
        let since = Duration::from_secs(rng.next() >> rng.below(64));
        let at = UNIX_EPOCH.checked_add(since).unwrap_or(UNIX_EPOCH);
        for name in NAMES {
            check_bounds(&Feedback::from_headers(429, [(name, value.as_slice())], at));
        }
    }
}

#[test]
fn long_values_are_read_in_one_pass() {
    const LENGTH: usize = 1 << 20;
    for piece in [
        &b"9"[..],
        b"0",
        b";",
        b",",
        b"\"",
        b"\\",
        b"a",
        b"1h",
        b"1.",
        b"\"a\";q=1;",
    ] {
        let value = piece.repeat(LENGTH / piece.len());
        let headers = NAMES.map(|name| (name, value.as_slice()));
        let started = std::time::Instant::now();
        check_bounds(&Feedback::from_headers(200, headers, now()));
        // Linear: a few passes over 1 MiB per header, far under this even
        // unoptimized on a loaded machine; a quadratic pass would take hours.
        assert!(started.elapsed() < Duration::from_secs(60), "{piece:?}");
    }
}
