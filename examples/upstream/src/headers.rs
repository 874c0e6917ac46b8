//! The rate-limit headers, `Retry-After`, and HTTP dates.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use crate::limits::{BucketView, View};
use crate::{RateLimitHeaders, RetryAfter};

const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Writes the rate-limit headers `style` names for `view`.
pub(crate) fn write(headers: &mut HeaderMap, style: RateLimitHeaders, view: &View) {
    let buckets: Vec<(&str, &BucketView)> =
        [("requests", &view.requests), ("tokens", &view.tokens)]
            .into_iter()
            .filter_map(|(name, bucket)| Some((name, bucket.as_ref()?)))
            .collect();
    if buckets.is_empty() {
        return;
    }
    if matches!(style, RateLimitHeaders::All | RateLimitHeaders::Ietf) {
        let (mut policy, mut state) = (String::new(), String::new());
        for (i, (name, bucket)) in buckets.iter().enumerate() {
            let comma = if i == 0 { "" } else { ", " };
            let _ = write!(
                policy,
                "{comma}\"{name}\";q={};w={}",
                bucket.quota, bucket.window_secs
            );
            let _ = write!(
                state,
                "{comma}\"{name}\";r={};t={}",
                bucket.remaining,
                secs_up(bucket.full_in)
            );
        }
        put(headers, RATELIMIT_POLICY, policy);
        put(headers, RATELIMIT, state);
    }
    if matches!(style, RateLimitHeaders::All | RateLimitHeaders::XRateLimit) {
        for (name, bucket) in buckets {
            let header = |what: &str| {
                HeaderName::try_from(format!("x-ratelimit-{what}-{name}")).expect("a header name")
            };
            put(headers, header("limit"), bucket.quota.to_string());
            put(headers, header("remaining"), bucket.remaining.to_string());
            put(headers, header("reset"), format!("{:.3}", bucket.full_in));
        }
    }
}

/// The `Retry-After` value for `wait`, as `mode` writes it.
pub(crate) fn retry_after(mode: RetryAfter, wait: Duration) -> Option<HeaderValue> {
    let value = match mode {
        RetryAfter::Seconds => retry_after_secs(wait).to_string(),
        RetryAfter::HttpDate => {
            let now = SystemTime::now();
            let since_epoch = now.duration_since(UNIX_EPOCH).unwrap_or_default();
            let then = since_epoch + wait.max(Duration::from_secs(1));
            let secs = then.as_secs() + u64::from(then.subsec_nanos() > 0);
            http_date(UNIX_EPOCH + Duration::from_secs(secs))
        }
        RetryAfter::Omitted => return None,
    };
    HeaderValue::try_from(value).ok()
}

/// Whole seconds, rounded up, at least 1 (a client told 0 would come back
/// at once and be refused again).
pub(crate) fn retry_after_secs(wait: Duration) -> u64 {
    (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
}

/// Seconds, rounded up.
fn secs_up(secs: f64) -> u64 {
    // Tiny errors in the buckets' sums must not add a second.
    (secs - 1e-9).ceil().max(0.0) as u64
}

fn put(headers: &mut HeaderMap, name: HeaderName, value: String) {
    if let Ok(value) = HeaderValue::try_from(value) {
        headers.insert(name, value);
    }
}

/// `time` as an HTTP date (IMF-fixdate, `Sun, 06 Nov 1994 08:49:37 GMT`),
/// to the second below; a time before 1970 as 1970's first second.
pub fn http_date(time: SystemTime) -> String {
    let secs = time
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let days = secs / 86_400;
    let of_day = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    format!(
        "{}, {day:02} {} {year:04} {:02}:{:02}:{:02} GMT",
        WEEKDAYS[(days % 7) as usize],
        MONTHS[(month - 1) as usize],
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60,
    )
}

/// The proleptic Gregorian date `days` after 1970-01-01: year, month
/// (1 to 12), day (1 to 31).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    // Counted in 400-year eras from 0000-03-01, so that the leap day ends
    // each year.
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> String {
        http_date(UNIX_EPOCH + Duration::from_secs(secs))
    }

    #[test]
    fn http_dates() {
        assert_eq!(at(784_111_777), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(at(0), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(at(951_782_400), "Tue, 29 Feb 2000 00:00:00 GMT");
        assert_eq!(at(4_133_980_799), "Fri, 31 Dec 2100 23:59:59 GMT");
        assert_eq!(at(1_709_164_800), "Thu, 29 Feb 2024 00:00:00 GMT");
        assert_eq!(at(4_107_542_399), "Sun, 28 Feb 2100 23:59:59 GMT");
    }

    #[test]
    fn retry_after_is_whole_seconds_up_and_at_least_one() {
        let secs = |ms| retry_after_secs(Duration::from_millis(ms));
        assert_eq!(
            [secs(0), secs(1), secs(999), secs(1000), secs(1001)],
            [1, 1, 1, 1, 2]
        );
        let value = |mode, ms| retry_after(mode, Duration::from_millis(ms));
        assert_eq!(value(RetryAfter::Seconds, 2500).unwrap(), "3");
        assert_eq!(value(RetryAfter::Omitted, 2500), None);
        let date = value(RetryAfter::HttpDate, 0).unwrap();
        assert!(date.to_str().unwrap().ends_with(" GMT"));
    }

    #[test]
    fn one_item_per_limit_requests_first() {
        let view = View {
            requests: Some(BucketView {
                quota: 50,
                window_secs: 1,
                remaining: 49,
                full_in: 0.02,
            }),
            tokens: Some(BucketView {
                quota: 3000,
                window_secs: 1,
                remaining: 0,
                full_in: 1.2,
            }),
        };
        let mut headers = HeaderMap::new();
        write(&mut headers, RateLimitHeaders::All, &view);
        let get = |name: &str| headers.get(name).unwrap().to_str().unwrap();
        assert_eq!(
            get("ratelimit-policy"),
            "\"requests\";q=50;w=1, \"tokens\";q=3000;w=1"
        );
        assert_eq!(
            get("ratelimit"),
            "\"requests\";r=49;t=1, \"tokens\";r=0;t=2"
        );
        assert_eq!(get("x-ratelimit-limit-requests"), "50");
        assert_eq!(get("x-ratelimit-remaining-requests"), "49");
        assert_eq!(get("x-ratelimit-reset-requests"), "0.020");
        assert_eq!(get("x-ratelimit-limit-tokens"), "3000");
        assert_eq!(get("x-ratelimit-remaining-tokens"), "0");
        assert_eq!(get("x-ratelimit-reset-tokens"), "1.200");
        assert_eq!(headers.len(), 8);

        let tokens_only = View {
            requests: None,
            ..view
        };
        let mut headers = HeaderMap::new();
        write(&mut headers, RateLimitHeaders::Ietf, &tokens_only);
        assert_eq!(headers.len(), 2);
        assert_eq!(headers["ratelimit"], "\"tokens\";r=0;t=2");
        let mut headers = HeaderMap::new();
        write(&mut headers, RateLimitHeaders::XRateLimit, &view);
        assert_eq!(headers.len(), 6);
        let mut headers = HeaderMap::new();
        write(&mut headers, RateLimitHeaders::None, &view);
        assert!(headers.is_empty());
    }
}
