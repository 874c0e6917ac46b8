//! Delays written at random in each form a response may use (seconds,
//! durations with units, times since the epoch in each unit, the three
//! HTTP-dates), at random times and from numbers at the limits of `u64`,
//! read back as what they say: the delay from `now`, zero for a time past,
//! cut to a day.
//!
//! Seeded: a failure prints its seed and the header, which replay it.

use super::*;
use crate::support::rng::Rng;

const NANOS: u128 = 1_000_000_000;

/// What `text` says, read back from `now`: `at` (since the epoch) less
/// `now`, zero if past, at most a day.
fn from_now(at_nanos: u128, now: SystemTime) -> Duration {
    let now = now.duration_since(UNIX_EPOCH).unwrap().as_nanos();
    let nanos = at_nanos.saturating_sub(now).min(DAY.as_nanos());
    Duration::from_nanos(nanos as u64)
}

/// A random time between 2001-09-09 (10^9 s since the epoch) and 2100, to
/// the nanosecond.
fn any_now(rng: &mut Rng) -> SystemTime {
    let secs = rng.range(1_000_000_000, 4_102_444_800);
    UNIX_EPOCH + Duration::new(secs, rng.below(1_000_000_000) as u32)
}

/// A delay in nanoseconds: none, a few, about a day, or far more.
fn any_delay(rng: &mut Rng) -> u128 {
    match rng.below(5) {
        0 => 0,
        1 => u128::from(rng.below(10_000_000_000)),
        2 => DAY.as_nanos() - 5 * NANOS + u128::from(rng.below(10_000_000_000)),
        3 => u128::from(rng.next_u64() >> rng.below(64)),
        _ => u128::from(rng.next_u64()) * u128::from(rng.next_u64() >> rng.below(64)),
    }
}

/// `nanos` as seconds, with up to 9 decimals (exact).
fn as_seconds(rng: &mut Rng, nanos: u128) -> String {
    let (whole, fraction) = (nanos / NANOS, nanos % NANOS);
    match rng.below(3) {
        _ if fraction == 0 && rng.chance(0.5) => whole.to_string(),
        0 => format!("{whole}.{fraction:09}"),
        _ => {
            let digits = format!("{fraction:09}");
            let digits = digits.trim_end_matches('0');
            format!("{whole}.{}", if digits.is_empty() { "0" } else { digits })
        }
    }
}

/// `nanos` as a duration with units (`1h2m3.5s`), every part exact.
fn as_units(rng: &mut Rng, nanos: u128) -> String {
    // A unit, its length in nanoseconds, the decimals that stay exact.
    const UNITS: [(&str, u128, u32); 7] = [
        ("h", 3_600 * NANOS, 9),
        ("m", 60 * NANOS, 9),
        ("s", NANOS, 9),
        ("ms", 1_000_000, 6),
        ("us", 1_000, 3),
        ("µs", 1_000, 3),
        ("ns", 1, 0),
    ];
    let mut text = String::new();
    let mut rest = nanos;
    for (at, &(unit, length, decimals)) in UNITS.iter().enumerate() {
        let last = at == UNITS.len() - 1 || rest < length || rng.chance(0.2);
        if !last && rng.chance(0.4) {
            continue;
        }
        // The last part takes all that is left, to the exact decimals it
        // holds; each earlier one some whole units.
        let amount = if last {
            rest
        } else {
            rest / length / (1 + u128::from(rng.below(3))) * length
        };
        let whole = amount / length;
        let step = length / 10u128.pow(decimals).min(length);
        let fraction = amount % length / step;
        if last && fraction * step != amount % length {
            // A part that its decimals cannot write: the rest in ns.
            text += &format!("{}{unit}", whole);
            let left = amount % length;
            text += &format!("{left}ns");
            return text;
        }
        text += &match decimals {
            0 => format!("{whole}{unit}"),
            _ if fraction == 0 => format!("{whole}{unit}"),
            d => format!("{whole}.{fraction:0width$}{unit}", width = d as usize),
        };
        rest -= amount;
        if last {
            return text;
        }
    }
    text
}

/// Days since the epoch as (year, month, day): the civil calendar.
fn civil(days: i64) -> (i64, usize, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let of_era = z.rem_euclid(146_097);
    let year_of_era = (of_era - of_era / 1_460 + of_era / 36_524 - of_era / 146_096) / 365;
    let of_year = of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * of_year + 2) / 153;
    let day = of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month as usize, day)
}

/// `secs` since the epoch as an HTTP-date in one of its three forms.
fn as_http_date(rng: &mut Rng, secs: u64, short_year: bool) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const LONG_DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = (secs / 86_400) as i64;
    let (year, month, day) = civil(days);
    let weekday = days.rem_euclid(7) as usize;
    let (h, m, s) = (secs % 86_400 / 3_600, secs % 3_600 / 60, secs % 60);
    let month = MONTHS[month - 1];
    match rng.below(3) {
        1 if !short_year => as_http_date(rng, secs, short_year),
        0 => format!(
            "{}, {day:02} {month} {year} {h:02}:{m:02}:{s:02} GMT",
            DAYS[weekday]
        ),
        1 => format!(
            "{}, {day:02}-{month}-{:02} {h:02}:{m:02}:{s:02} GMT",
            LONG_DAYS[weekday],
            year % 100
        ),
        _ => format!(
            "{} {month} {day:>2} {h:02}:{m:02}:{s:02} {year}",
            DAYS[weekday]
        ),
    }
}

/// The forms a delay may take.
#[derive(Clone, Copy, PartialEq)]
enum Form {
    Seconds,
    Units,
    Epoch,
    Date,
}

/// Nanoseconds since the epoch that a number of a reset says: seconds from
/// 10^9, milliseconds from 10^12, microseconds from 10^15, nanoseconds from
/// 10^18.
fn epoch_nanos(number: u128) -> u128 {
    match number {
        1_000_000_000_000_000_000.. => number,
        1_000_000_000_000_000.. => number * 1_000,
        1_000_000_000_000.. => number * 1_000_000,
        _ => number * NANOS,
    }
}

/// A delay written at random in one of `forms`, with the delay it says
/// from `now`.
fn any_delay_as(rng: &mut Rng, now: SystemTime, forms: &[Form]) -> (String, Duration) {
    let now_nanos = now.duration_since(UNIX_EPOCH).unwrap().as_nanos();
    let delay = any_delay(rng);
    let said = Duration::from_nanos(delay.min(DAY.as_nanos()) as u64);
    let form = *rng.pick(forms);
    match form {
        // Seconds (where a time since the epoch is read too, under 10^9 of
        // them: more would be one).
        Form::Units if delay > 0 => (as_units(rng, delay), said),
        Form::Seconds | Form::Units
            if !forms.contains(&Form::Epoch) || delay < 1_000_000_000 * NANOS =>
        {
            (as_seconds(rng, delay), said)
        }
        // A time since the epoch, in whole seconds or a finer unit, or in
        // seconds with decimals; a time past reads as zero.
        Form::Epoch | Form::Seconds | Form::Units => {
            let at = if rng.chance(0.3) {
                now_nanos.saturating_sub(delay).max(1_000_000_000 * NANOS)
            } else {
                now_nanos + delay
            };
            let unit = *rng.pick(&[NANOS, 1_000_000, 1_000, 1]);
            let number = at / unit;
            if number > u128::from(u64::MAX) {
                return (number.to_string(), DAY);
            }
            if unit == NANOS && number < 1_000_000_000_000 && rng.chance(0.5) {
                return (as_seconds(rng, at), from_now(at, now));
            }
            (number.to_string(), from_now(epoch_nanos(number), now))
        }
        Form::Date => {
            // In whole seconds, before or after now; two digits of a year
            // are read in the century nearest now, so that form is written
            // within 49 years of it.
            let now_secs = now_nanos / NANOS;
            let back = rng.chance(0.3);
            let years = 49 * 365 * 86_400;
            let mut delay = delay / NANOS;
            if rng.chance(0.5) {
                delay = delay.min(years);
            }
            let secs = match back {
                true => now_secs.saturating_sub(delay),
                false => (now_secs + delay).min(253_402_300_799),
            };
            let text = as_http_date(rng, secs as u64, secs.abs_diff(now_secs) <= years);
            (text, from_now(secs * NANOS, now))
        }
    }
}

/// Optional white space around a value.
fn padded(rng: &mut Rng, text: &str) -> String {
    let pad = |rng: &mut Rng| *rng.pick(&["", "", " ", "\t", "  "]);
    format!("{}{text}{}", pad(rng), pad(rng))
}

#[test]
fn delays_in_every_form_read_back_as_they_say() {
    use Form::*;
    for seed in 0..3000u64 {
        let seed = 0xFEED_0000 + seed;
        let mut rng = Rng::new(seed);
        let now = any_now(&mut rng);
        let case = |what: &str| format!("seed {seed:#x}: {what} at {now:?}");
        // Retry-After: seconds or an HTTP-date.
        let (text, said) = any_delay_as(&mut rng, now, &[Seconds, Date]);
        let text = padded(&mut rng, &text);
        let read = Feedback::from_headers(429, [("Retry-After", text.as_bytes())], now);
        let what = format!("Retry-After: {text:?}");
        assert_eq!(read.retry_after(), Some(said), "{}", case(&what));
        // A reset, alone and as a list's parameter.
        let (text, said) = any_delay_as(&mut rng, now, &[Seconds, Units, Epoch, Date]);
        let header = *rng.pick(&[
            "RateLimit-Reset",
            "X-RateLimit-Reset",
            "x-ratelimit-reset-tokens",
        ]);
        let value = padded(&mut rng, &text);
        let name = header.strip_prefix("x-ratelimit-reset-");
        let read = Feedback::from_headers(200, [(header, value.as_bytes())], now);
        let reset = read.quota(name).and_then(|quota| quota.reset);
        assert_eq!(
            reset,
            Some(said),
            "{}",
            case(&format!("{header}: {value:?}"))
        );
        if !text.contains(',') {
            let list = format!("\"tokens\";r=1;t={value}, \"requests\";r=5");
            let read = Feedback::from_headers(200, [("RateLimit", list.as_bytes())], now);
            let reset = read.quota(Some("tokens")).and_then(|quota| quota.reset);
            assert_eq!(
                reset,
                Some(said),
                "{}",
                case(&format!("RateLimit: {list:?}"))
            );
        }
        // A reset after: seconds or a duration.
        let (text, said) = any_delay_as(&mut rng, now, &[Seconds, Units]);
        let value = padded(&mut rng, &text);
        let header = [("X-RateLimit-Reset-After", value.as_bytes())];
        let reset = Feedback::from_headers(200, header, now)
            .quota(None)
            .and_then(|q| q.reset);
        assert_eq!(
            reset,
            Some(said),
            "{}",
            case(&format!("Reset-After: {value:?}"))
        );
    }
}
