//! Rates and durations as the command line writes them.

use std::time::Duration;

/// A rate: `permits` per `period`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub permits: f64,
    pub period: Duration,
}

impl Rate {
    pub fn per_second(&self) -> f64 {
        self.permits / self.period.as_secs_f64()
    }
}

/// Parses `N/UNIT`: `10/s`, `600/min`, `1000/h`, `5/day` (also `sec`,
/// `second`, `m`, `minute`, `hour`, `d`); with `bytes`, `N` may carry a
/// size suffix: `5MiB/s`, `100KB/s`, `1.5GiB/min` (`K`, `M`, `G` and `T`
/// are powers of 1000, `Ki`, `Mi`, `Gi`, `Ti` of 1024; a trailing `B` is
/// optional).
pub fn parse_rate(text: &str, bytes: bool) -> Result<Rate, String> {
    let bad = |why: &str| {
        let example = if bytes {
            "5MiB/s"
        } else {
            "10/s, 600/min, 1000/h, 5/day"
        };
        format!("bad rate {text:?}: {why} (write it as {example})")
    };
    let (amount, unit) = text.split_once('/').ok_or_else(|| bad("no '/'"))?;
    let period = match unit.trim() {
        "s" | "sec" | "second" => Duration::from_secs(1),
        "m" | "min" | "minute" => Duration::from_secs(60),
        "h" | "hour" => Duration::from_secs(3600),
        "d" | "day" => Duration::from_secs(86_400),
        _ => return Err(bad("the period must be s, min, h or day")),
    };
    let permits = if bytes {
        parse_size(amount.trim()).ok_or_else(|| bad("not a size"))?
    } else {
        amount
            .trim()
            .parse::<f64>()
            .map_err(|_| bad("not a number"))?
    };
    if permits.is_nan() {
        return Err(bad("not a number"));
    }
    if permits == f64::INFINITY {
        return Err(bad("too large: it reads as infinite"));
    }
    if permits <= 0.0 {
        return Err(bad("it must be more than zero"));
    }
    let rate = Rate { permits, period };
    if rate.per_second() == 0.0 {
        return Err(bad("too small: it reads as zero a second"));
    }
    Ok(rate)
}

/// `5MiB`, `100KB`, `1.5G`, `4096`: bytes.
fn parse_size(text: &str) -> Option<f64> {
    let text = text.strip_suffix('B').unwrap_or(text);
    let (number, factor) = [
        ("Ki", 1024f64),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("K", 1e3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
    ]
    .iter()
    .find_map(|(suffix, factor)| text.strip_suffix(suffix).map(|n| (n, *factor)))
    .unwrap_or((text, 1.0));
    Some(number.trim().parse::<f64>().ok()? * factor)
}

/// `64MiB`, `1GiB`, `100000`: the most bytes a record may hold, at least
/// one, and a whole number of them (`1.5KiB` is, `1.5` is not).
pub fn parse_record_size(text: &str) -> Result<usize, String> {
    let bad = |why: &str| format!("bad size {text:?}: {why} (write it as 64MiB, 1GiB or 100000)");
    let size = parse_size(text.trim()).ok_or_else(|| bad("not a size"))?;
    if size.is_nan() || size < 1.0 {
        return Err(bad("it must be at least one byte"));
    }
    // Past this, no machine holds the record anyway.
    if size > (1u64 << 48) as f64 {
        return Err(bad("it must be at most 256TiB"));
    }
    if size.fract() != 0.0 {
        return Err(bad("it must be a whole number of bytes"));
    }
    Ok(size as usize)
}

/// `250ms`, `2s`, `1.5s`, `3min`, `1h`, `500us`: a duration, to the
/// nanosecond. One too long to hold (past about 584 years), or more than
/// zero but under a nanosecond (which would read as zero), is refused.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = |why: &str| format!("bad duration {text:?}{why} (write it as 250ms, 2s, 3min or 1h)");
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| bad(""))?;
    let (number, unit) = text.split_at(split);
    let unit_nanos: u128 = match unit {
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" | "min" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return Err(bad("")),
    };
    // Read exactly, in nanoseconds: the whole units, then the fraction's
    // first 24 digits (those after them are worth less than 10^-24 of an
    // hour, under a nanosecond), truncated.
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
        return Err(bad(""));
    }
    let too_long = || bad(": too long");
    let whole: u128 = match whole {
        "" => 0,
        // (Digits alone: it fails only past a u128.)
        whole => whole.parse().map_err(|_| too_long())?,
    };
    let kept = &fraction[..fraction.len().min(24)];
    let digits: u128 = match kept {
        "" => 0,
        kept => kept.parse().map_err(|_| bad(""))?,
    };
    let places = u32::try_from(kept.len()).unwrap_or(24);
    let nanos = whole
        .checked_mul(unit_nanos)
        .and_then(|nanos| nanos.checked_add(digits * unit_nanos / 10u128.pow(places)))
        .ok_or_else(too_long)?;
    let seconds = u64::try_from(nanos / 1_000_000_000).map_err(|_| too_long())?;
    let duration = Duration::new(seconds, (nanos % 1_000_000_000) as u32);
    if duration.is_zero() && (whole > 0 || fraction.bytes().any(|b| b != b'0')) {
        return Err(bad(": under a nanosecond, it would read as zero"));
    }
    Ok(duration)
}

/// `text` with each long decimal fraction in it (more than 12
/// characters: `0.000011574074074074073`, or a 1 three hundred places
/// after the point) written short: four significant digits (the whole
/// part in full where it has more), `0.00001157`, `1e-300`. Integers,
/// and numbers already short, stay.
pub fn readable_numbers(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(|c: char| c.is_ascii_digit()) {
        out.push_str(&rest[..start]);
        let number = &rest[start..];
        let len = number
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(number.len());
        // A point that ends it ends a sentence.
        let number = number[..len].trim_end_matches('.');
        match number.parse::<f64>() {
            Ok(value) if number.len() > 12 && number.contains('.') && value.is_finite() => {
                out.push_str(&readable(value));
            }
            _ => out.push_str(number),
        }
        rest = &rest[start + number.len()..];
    }
    out.push_str(rest);
    out
}

/// `value` with four significant digits (its whole part in full where it
/// has more): written out from a millionth to a quadrillion, else as
/// `1.157e-12`.
fn readable(value: f64) -> String {
    if value == 0.0 {
        return "0".to_owned();
    }
    let exponent = value.abs().log10().floor();
    if (-6.0..15.0).contains(&exponent) {
        let decimals = (3.0 - exponent).max(0.0) as usize;
        let text = format!("{value:.decimals$}");
        match text.contains('.') {
            true => text.trim_end_matches('0').trim_end_matches('.').to_owned(),
            false => text,
        }
    } else {
        let text = format!("{value:.3e}");
        match text.split_once('e') {
            Some((mantissa, exponent)) => {
                let mantissa = mantissa.trim_end_matches('0').trim_end_matches('.');
                format!("{mantissa}e{exponent}")
            }
            None => text,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_fractions_read_in_four_digits() {
        let tiny = format!("at 0.{}1 per second", "0".repeat(299));
        assert_eq!(readable_numbers(&tiny), "at 1e-300 per second");
        assert_eq!(
            readable_numbers("at 0.000011574074074074073 per second (2^53 µs: at most 104250)."),
            "at 0.00001157 per second (2^53 µs: at most 104250)."
        );
        assert_eq!(
            readable_numbers("1234567.891234567 and 0.1 and 12.5."),
            "1234568 and 0.1 and 12.5."
        );
        assert_eq!(readable_numbers("0.3333333333333333"), "0.3333");
        assert_eq!(readable_numbers("1.2.3.4.5.6.7.8"), "1.2.3.4.5.6.7.8");
        assert_eq!(readable_numbers(""), "");
    }

    #[test]
    fn rates_read_as_written() {
        let rate = parse_rate("10/s", false).unwrap();
        assert_eq!((rate.permits, rate.period), (10.0, Duration::from_secs(1)));
        assert_eq!(parse_rate("600/min", false).unwrap().per_second(), 10.0);
        assert_eq!(parse_rate("3600/h", false).unwrap().per_second(), 1.0);
        assert_eq!(
            parse_rate(" 86400 / day ", false).unwrap().per_second(),
            1.0
        );
        assert_eq!(parse_rate("1e9/s", false).unwrap().per_second(), 1e9);
        assert_eq!(
            parse_rate("5MiB/s", true).unwrap().permits,
            5.0 * 1024.0 * 1024.0
        );
        assert_eq!(parse_rate("100KB/s", true).unwrap().permits, 100_000.0);
        assert_eq!(parse_rate("1.5k/s", true).unwrap().permits, 1500.0);
        assert_eq!(parse_rate("4096/s", true).unwrap().permits, 4096.0);
        for bad in [
            "10",
            "10/fortnight",
            "x/s",
            "0/s",
            "-1/s",
            "NaN/s",
            "inf/s",
            "5MiB/s",
        ] {
            assert!(parse_rate(bad, false).is_err(), "{bad}");
        }
        assert!(parse_rate("5XB/s", true).is_err());
        for (bad, says) in [
            ("1e309/s", "too large"),
            ("inf/s", "too large"),
            ("-inf/s", "more than zero"),
            ("0/s", "more than zero"),
            ("NaN/s", "not a number"),
            ("1e-320/day", "too small"),
        ] {
            let error = parse_rate(bad, false).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
        let error = parse_rate("1e308GiB/s", true).unwrap_err();
        assert!(error.contains("too large"), "{error}");
    }

    #[test]
    fn record_sizes_read_as_written() {
        assert_eq!(parse_record_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_record_size("1.5KiB").unwrap(), 1536);
        assert_eq!(parse_record_size("0.5K").unwrap(), 500);
        assert_eq!(parse_record_size("100000").unwrap(), 100_000);
        // No part of a byte: not cut off to the byte below.
        for bad in ["1.5", "2.9", "1.0001KiB", "0.5", "0", "x", "inf"] {
            assert!(parse_record_size(bad).is_err(), "{bad}");
        }
        let error = parse_record_size("1.5").unwrap_err();
        assert!(error.contains("whole number of bytes"), "{error}");
    }

    /// A small deterministic generator (xorshift); never seeded with 0.
    fn next(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    /// Any text, near valid or not, neither panics nor reads as a rate,
    /// size or duration that is not one; a number written as Rust writes
    /// it reads back to the bit.
    #[test]
    fn random_text_reads_as_written_or_is_refused() {
        const PIECES: [&str; 24] = [
            "1", "0", "9", ".", "e", "-", "+", "/", " ", "s", "min", "h", "day", "ms", "us", "µs",
            "K", "Ki", "M", "GiB", "B", "inf", "NaN", "\u{0}",
        ];
        let mut state = 0x5EED_u64;
        for _ in 0..20_000 {
            let text: String = (0..next(&mut state) % 8)
                .map(|_| PIECES[(next(&mut state) % PIECES.len() as u64) as usize])
                .collect();
            for bytes in [false, true] {
                if let Ok(rate) = parse_rate(&text, bytes) {
                    let per_second = rate.per_second();
                    assert!(per_second > 0.0 && per_second.is_finite(), "{text:?}");
                }
            }
            if let Ok(size) = parse_record_size(&text) {
                assert!((1..=1 << 48).contains(&size), "{text:?}");
            }
            if let Ok(duration) = parse_duration(&text) {
                assert!(
                    !duration.is_zero() || !text.contains(['1', '9']),
                    "{text:?}"
                );
            }
            let _ = readable_numbers(&text);
            // A number as Rust writes it, from every magnitude.
            let number = f64::from_bits(next(&mut state) & (u64::MAX >> 1));
            if number.is_finite() && number > 0.0 {
                let read = parse_rate(&format!("{number}/s"), false);
                match read {
                    Ok(rate) => assert_eq!(rate.permits, number),
                    Err(error) => assert!(error.contains("too small"), "{number}: {error}"),
                }
            }
        }
    }

    #[test]
    fn durations_read_as_written() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("3min").unwrap(), Duration::from_secs(180));
        assert_eq!(parse_duration("500us").unwrap(), Duration::from_micros(500));
        // To the nanosecond, however long (it went through a double: a few
        // nanoseconds off past about 100 days).
        assert_eq!(
            parse_duration("123456789123ms").unwrap(),
            Duration::from_millis(123_456_789_123)
        );
        assert_eq!(
            parse_duration("2562047.788015215h").unwrap(),
            Duration::new(9_223_372_036, 854_774_000)
        );
        assert_eq!(
            parse_duration("18446744073.709551615s").unwrap(),
            Duration::new(18_446_744_073, 709_551_615)
        );
        assert_eq!(parse_duration(".5s").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1.s").unwrap(), Duration::from_secs(1));
        for bad in ["", "5", "ms", "1e999s", "-1s", "2 weeks", ".s", "1.2.3s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        // Zero is zero; more than zero never reads as zero (`--timeout
        // 0.0000000001s` was told it "must be more than zero", and
        // `--max-wait` took it as zero), and what is too long says so.
        assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO);
        assert_eq!(
            parse_duration("0.000000001s").unwrap(),
            Duration::from_nanos(1)
        );
        for (bad, says) in [
            ("0.0000000001s", "under a nanosecond"),
            ("0.0001us", "under a nanosecond"),
            ("99999999999999999999s", "too long"),
            ("18446744073709551616s", "too long"),
            ("0.0000000000000000000000000001h", "under a nanosecond"),
            ("999999999999999999h", "too long"),
        ] {
            let error = parse_duration(bad).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }
}
