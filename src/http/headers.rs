//! The rate-limit headers and `Retry-After`: which a layer writes, and
//! their values.

use std::time::Duration;

use ::http::{HeaderMap, HeaderName, HeaderValue};

use crate::Snapshot;

/// The `Retry-After` value for a wait, in whole seconds: rounded up, and
/// at least 1 (a client told 0 would retry at once, and be refused again).
pub(crate) fn retry_after_secs(wait: Duration) -> u64 {
    secs_up(wait).max(1)
}

/// Which rate-limit headers a [`RateLimitLayer`](super::RateLimitLayer) writes
/// on every response it lets through or refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Headers {
    /// None (a refusal still carries `Retry-After`).
    None,
    /// `RateLimit-Policy` and `RateLimit`, as the IETF draft
    /// (draft-ietf-httpapi-ratelimit-headers) names them. The default.
    Ietf,
    /// Those, and the older `X-RateLimit-Limit`, `X-RateLimit-Remaining`
    /// and `X-RateLimit-Reset` for clients that read those.
    IetfAndLegacy,
}

/// The largest integer a structured-field header carries.
const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

/// Whole seconds, rounded up.
fn secs_up(duration: Duration) -> u64 {
    duration
        .as_secs()
        .saturating_add(u64::from(duration.subsec_nanos() > 0))
}

/// The policy's quota and window for `snapshot` (see
/// [`RateLimitLayer::new`](super::RateLimitLayer::new)): `q` requests per
/// `w` seconds.
fn quota(snapshot: &Snapshot) -> (u64, u64) {
    let burst = snapshot.burst().min(SF_INTEGER_MAX);
    let rate = snapshot.rate();
    // A drained key (its next request owing one interval) has its burst
    // back after `burst` intervals: to the microsecond, as the limiter
    // counts time (11 per minute: 11 / (11 / 60) reads 60.000000000000014
    // seconds, which is 60, not 61).
    let refill = burst as f64 / rate;
    let refill = match refill < 1e15 {
        true => (refill * 1e6).round() / 1e6,
        false => refill,
    };
    let window = if refill.is_finite() && refill > 1.0 {
        (refill.ceil() as u64).min(SF_INTEGER_MAX)
    } else {
        1
    };
    // To the millionth of a request, as the window is to the microsecond
    // (15 per 11 s over 11 s reads 14.999999999999998: 15).
    let allowed = rate * window as f64;
    let allowed = match allowed < 1e15 {
        true => ((allowed * 1e6).round() / 1e6).floor(),
        false => allowed.floor(),
    };
    let allowed = if allowed < SF_INTEGER_MAX as f64 {
        allowed as u64
    } else {
        SF_INTEGER_MAX
    };
    (allowed.max(burst), window)
}

/// A header value formatted on the stack (one allocation, the value's
/// own; a value too long for the stack, from a long policy name, is
/// formatted again on the heap).
fn header_value(args: std::fmt::Arguments<'_>) -> Option<HeaderValue> {
    let mut buffer = [0u8; 96];
    let mut rest = &mut buffer[..];
    if std::io::Write::write_fmt(&mut rest, args).is_ok() {
        let len = 96 - rest.len();
        return HeaderValue::from_bytes(&buffer[..len]).ok();
    }
    HeaderValue::from_bytes(args.to_string().as_bytes()).ok()
}

/// A policy's name as a structured-field string (quotes included), and
/// its last `RateLimit-Policy` value, which changes only with the rate.
#[derive(Debug)]
pub(super) struct PolicyName {
    quoted: Box<str>,
    value: std::sync::RwLock<Option<(u64, u64, HeaderValue)>>,
}

impl PolicyName {
    pub(super) fn new(quoted: Box<str>) -> PolicyName {
        PolicyName {
            quoted,
            value: std::sync::RwLock::new(None),
        }
    }

    /// The `RateLimit-Policy` value for `q` requests per `w` seconds.
    fn value(&self, q: u64, w: u64) -> Option<HeaderValue> {
        if let Ok(cached) = self.value.read()
            && let Some((_, _, value)) = cached.as_ref().filter(|(cq, cw, _)| (*cq, *cw) == (q, w))
        {
            return Some(value.clone());
        }
        let value = header_value(format_args!("{};q={q};w={w}", self.quoted))?;
        if let Ok(mut cached) = self.value.write() {
            *cached = Some((q, w, value.clone()));
        }
        Some(value)
    }
}

/// Writes the rate-limit headers for `snapshot` into `headers`, leaving
/// any already there. `refused`: the request was refused, so none remains
/// (a permit that came back between the refusal and the snapshot is not
/// reported).
pub(super) fn write_headers(
    headers: &mut HeaderMap,
    kind: Headers,
    policy: &PolicyName,
    snapshot: &Snapshot,
    refused: bool,
) {
    if kind == Headers::None {
        return;
    }
    let (q, w) = quota(snapshot);
    let r = if refused {
        0
    } else {
        snapshot.remaining().min(SF_INTEGER_MAX)
    };
    let t = secs_up(snapshot.full_in()).min(SF_INTEGER_MAX);
    headers.reserve(if kind == Headers::IetfAndLegacy { 5 } else { 2 });
    // Each value is made only if the header is not there yet.
    let mut put = |name: HeaderName, value: &dyn Fn() -> Option<HeaderValue>| {
        if let ::http::header::Entry::Vacant(vacant) = headers.entry(name)
            && let Some(value) = value()
        {
            vacant.insert(value);
        }
    };
    put(RATELIMIT_POLICY, &|| policy.value(q, w));
    let name = &*policy.quoted;
    put(RATELIMIT, &|| {
        header_value(format_args!("{name};r={r};t={t}"))
    });
    if kind == Headers::IetfAndLegacy {
        put(X_RATELIMIT_LIMIT, &|| Some(HeaderValue::from(q)));
        put(X_RATELIMIT_REMAINING, &|| Some(HeaderValue::from(r)));
        put(X_RATELIMIT_RESET, &|| Some(HeaderValue::from(t)));
    }
}

const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_at_least_a_second() {
        for (wait, secs) in [
            (Duration::ZERO, 1),
            (Duration::from_millis(1), 1),
            (Duration::from_secs(1), 1),
            (Duration::from_millis(1001), 2),
            (Duration::from_secs(59), 59),
            (Duration::MAX, u64::MAX),
        ] {
            assert_eq!(retry_after_secs(wait), secs, "{wait:?}");
        }
    }

    #[test]
    fn a_value_too_long_for_the_stack_is_written_whole() {
        for len in [0, 95, 96, 97, 300] {
            let text = "x".repeat(len);
            let value = header_value(format_args!("{text}")).unwrap();
            assert_eq!(value.as_bytes(), text.as_bytes());
        }
    }
}
