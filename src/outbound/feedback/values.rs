//! The values in rate-limit headers: numbers, seconds, durations with units,
//! HTTP-dates, read from bytes the upstream chose. Linear in the bytes,
//! allocating nothing.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The longest `Retry-After` or reset kept: a longer one is cut to this, so
/// that no response pauses a client for longer.
const MAX_DELAY: Duration = Duration::from_secs(24 * 60 * 60);

/// A non-negative integer; `None` for anything else, or one past `u64`.
pub(super) fn integer(text: &[u8]) -> Option<u64> {
    text.first().filter(|b| b.is_ascii_digit())?;
    std::str::from_utf8(text).ok()?.parse().ok()
}

/// Seconds, whole or decimal (`1`, `0.020`); digits past the ninth decimal are
/// dropped.
pub(super) fn seconds(text: &[u8]) -> Option<Duration> {
    let (whole, fraction) = match text.iter().position(|&b| b == b'.') {
        Some(at) => (&text[..at], &text[at + 1..]),
        None => (text, &b"0"[..]),
    };
    if fraction.is_empty() || !fraction.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let nanos = fraction
        .iter()
        .chain(std::iter::repeat(&b'0'))
        .take(9)
        .fold(0, |nanos, &b| nanos * 10 + u32::from(b - b'0'));
    Some(Duration::new(integer(whole)?, nanos))
}

/// Whether `text` is seconds as [`seconds`] reads them (`1`, `0.020`) but
/// too many for a `u64`: longer than a day, whatever they say, so not left
/// out (a longer wait must not pause less).
pub(super) fn overflowed(text: &[u8]) -> bool {
    let (whole, fraction) = match text.iter().position(|&b| b == b'.') {
        Some(at) => (&text[..at], Some(&text[at + 1..])),
        None => (text, None),
    };
    !whole.is_empty()
        && whole.iter().all(u8::is_ascii_digit)
        && fraction.is_none_or(|f| !f.is_empty() && f.iter().all(u8::is_ascii_digit))
        && integer(whole).is_none()
}

/// [`seconds`], or a day for seconds too many for a `u64`.
pub(super) fn long_seconds(text: &[u8]) -> Option<Duration> {
    seconds(text).or_else(|| overflowed(text).then_some(MAX_DELAY))
}

/// A duration with units, `6m0s`, `17ms`, `1h2m3.5s` (`h`, `m`, `s`, `ms`,
/// `us` or `µs`, `ns`), at most a day.
pub(super) fn units(mut text: &[u8]) -> Option<Duration> {
    let mut nanos: u128 = 0;
    if text.is_empty() {
        return None;
    }
    while !text.is_empty() {
        let digits = text
            .iter()
            .position(|&b| !b.is_ascii_digit() && b != b'.')
            .unwrap_or(text.len());
        // The amount, read as seconds: whole units and billionths of one
        // (too many for a `u64`: as many as it holds, past a day anyway).
        let amount = match seconds(&text[..digits]) {
            Some(amount) => amount,
            None if overflowed(&text[..digits]) => Duration::MAX,
            None => return None,
        };
        let (unit, length): (u128, usize) = match &text[digits..] {
            [b'h', ..] => (3_600_000_000_000, 1),
            [b'm', b's', ..] => (1_000_000, 2),
            [b'm', ..] => (60_000_000_000, 1),
            [b's', ..] => (1_000_000_000, 1),
            [b'u', b's', ..] => (1_000, 2),
            [0xC2, 0xB5, b's', ..] | [0xCE, 0xBC, b's', ..] => (1_000, 3),
            [b'n', b's', ..] => (1, 2),
            _ => return None,
        };
        let whole = u128::from(amount.as_secs()) * unit;
        nanos =
            nanos.saturating_add(whole + u128::from(amount.subsec_nanos()) * unit / 1_000_000_000);
        text = &text[digits + length..];
    }
    let nanos = nanos.min(MAX_DELAY.as_nanos());
    Some(Duration::from_nanos(u64::try_from(nanos).ok()?))
}

/// At most a day.
pub(super) fn cut(delay: Duration) -> Duration {
    delay.min(MAX_DELAY)
}

/// The time from `now` to `at` (since the epoch): zero if past, at most a day.
fn until(at: Duration, now: SystemTime) -> Duration {
    UNIX_EPOCH.checked_add(at).map_or(MAX_DELAY, |at| {
        cut(at.duration_since(now).unwrap_or(Duration::ZERO))
    })
}

/// `Retry-After`: seconds or an HTTP-date.
pub(super) fn retry_after(value: &[u8], now: SystemTime) -> Option<Duration> {
    let value = value.trim_ascii();
    long_seconds(value)
        .map(cut)
        .or_else(|| http_date(value, now).map(|at| until(at, now)))
}

/// A reset: seconds, a duration with units, a time since the epoch in seconds
/// (from 10^9), milliseconds (from 10^12), microseconds (from 10^15) or
/// nanoseconds (from 10^18), or an HTTP-date.
pub(super) fn reset(value: &[u8], now: SystemTime) -> Option<Duration> {
    let value = value.trim_ascii();
    match seconds(value) {
        Some(at) => Some(match at.as_secs() {
            n @ 1_000_000_000_000_000_000.. => until(Duration::from_nanos(n), now),
            n @ 1_000_000_000_000_000.. => until(Duration::from_micros(n), now),
            n @ 1_000_000_000_000.. => until(Duration::from_millis(n), now),
            1_000_000_000.. => until(at, now),
            _ => cut(at),
        }),
        // (A time since the epoch too, were it read as one: a day.)
        None if overflowed(value) => Some(MAX_DELAY),
        None => units(value).or_else(|| http_date(value, now).map(|at| until(at, now))),
    }
}

/// Whether `text` has the shape of `template`: `a` a letter, `0` a digit, `_`
/// a digit or a space, any other byte itself.
fn shaped(text: &[u8], template: &[u8]) -> bool {
    text.len() == template.len()
        && text.iter().zip(template).all(|(&b, &t)| match t {
            b'a' => b.is_ascii_alphabetic(),
            b'0' => b.is_ascii_digit(),
            b'_' => b == b' ' || b.is_ascii_digit(),
            _ => b == t,
        })
}

/// The number that shaped digits (and spaces) write.
fn digits(text: &[u8]) -> i64 {
    text.iter()
        .filter(|b| b.is_ascii_digit())
        .fold(0, |n, &b| n * 10 + i64::from(b - b'0'))
}

/// An HTTP-date (`Sun, 06 Nov 1994 08:49:37 GMT`, or either obsolete
/// form: `Sunday, 06-Nov-94 08:49:37 GMT`, its century the one that puts it
/// nearest `now`, and `Sun Nov 6 08:49:37 1994`) as time since the epoch
/// (zero before it).
fn http_date(text: &[u8], now: SystemTime) -> Option<Duration> {
    const MONTHS: [&[u8]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
        b"Dec",
    ];
    // The weekday of the RFC 850 form, its full name.
    let weekday = text.iter().position(|&b| b == b',').unwrap_or(0);
    // Day, month, year, time.
    let at: [(usize, usize); 4] = if shaped(text, b"aaa, 00 aaa 0000 00:00:00 GMT") {
        [(5, 7), (8, 11), (12, 16), (17, 25)]
    } else if shaped(text, b"aaa aaa _0 00:00:00 0000") {
        [(8, 10), (4, 7), (20, 24), (11, 19)]
    } else if (6..=9).contains(&weekday)
        && text[..weekday].iter().all(u8::is_ascii_alphabetic)
        && shaped(&text[weekday..], b", 00-aaa-00 00:00:00 GMT")
    {
        [(2, 4), (5, 8), (9, 11), (12, 20)].map(|(from, to)| (weekday + from, weekday + to))
    } else {
        return None;
    };
    let [day, month, year, time] = at.map(|(from, to)| &text[from..to]);
    let month = MONTHS.iter().position(|known| *known == month)? as i64 + 1;
    let [day, hours, minutes, secs] = [day, &time[..2], &time[3..5], &time[6..]].map(digits);
    if !(1..=31).contains(&day) || hours > 23 || minutes > 59 || secs > 60 {
        return None;
    }
    let stamp = |year: i64| {
        let days = days_from_civil(year, month, day);
        days * 86_400 + hours * 3_600 + minutes * 60 + secs
    };
    let stamp = if year.len() == 2 {
        let now = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs() as i64;
        let years = [1900, 2000, 2100].map(|century| stamp(century + digits(year)));
        years.into_iter().min_by_key(|stamp| stamp.abs_diff(now))?
    } else {
        stamp(digits(year))
    };
    Some(Duration::from_secs(u64::try_from(stamp).unwrap_or(0)))
}

/// Days from 1970-01-01 to a proleptic Gregorian date.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let (era, of_era) = (year.div_euclid(400), year.rem_euclid(400));
    let of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let of_era = of_era * 365 + of_era / 4 - of_era / 100 + of_year;
    era * 146_097 + of_era - 719_468
}

#[cfg(test)]
#[test]
fn the_calendar() {
    assert_eq!(days_from_civil(1970, 1, 1), 0);
    assert_eq!(days_from_civil(2000, 3, 1), 11_017);
    assert_eq!(days_from_civil(1969, 12, 31), -1);
    let in_1994 = UNIX_EPOCH + Duration::from_secs(784_111_777);
    for date in [
        &b"Sun, 06 Nov 1994 08:49:37 GMT"[..],
        b"Sunday, 06-Nov-94 08:49:37 GMT",
        b"Sun Nov  6 08:49:37 1994",
    ] {
        assert_eq!(
            http_date(date, in_1994),
            Some(Duration::from_secs(784_111_777))
        );
    }
}
