//! [`Feedback`]: the status and rate-limit headers of one response, read from
//! bytes the upstream chose.

use std::time::{Duration, SystemTime};

use values::{cut, integer, long_seconds, reset, retry_after, seconds, units};

mod values;

// The bounds of `Feedback::from_headers`: quotas kept, bytes of a name, items
// of a line (and parameters of an item), lines looked at, rate-limit lines
// read.
const MAX_QUOTAS: usize = 8;
const MAX_NAME: usize = 64;
const MAX_ITEMS: usize = 16;
const MAX_LINES: usize = 256;
const MAX_READ: usize = 32;

/// What one response from the upstream said about its limits.
///
/// Built from the status and headers ([`from_headers`](Self::from_headers), or
/// `from_response` with feature `http`), or by hand for a client that reads
/// them itself ([`new`](Self::new) and the `with_` methods).
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use paceline::outbound::Feedback;
///
/// let headers: [(&str, &[u8]); 3] = [
///     ("RateLimit-Policy", b"\"requests\";q=50;w=1, \"tokens\";q=3000;w=1"),
///     ("RateLimit", b"\"requests\";r=0;t=1, \"tokens\";r=2950;t=1"),
///     ("Retry-After", b"1"),
/// ];
/// let feedback = Feedback::from_headers(429, headers, SystemTime::now());
/// assert!(feedback.is_throttled());
/// assert_eq!(feedback.retry_after(), Some(Duration::from_secs(1)));
/// let tokens = feedback.quota(Some("tokens")).unwrap();
/// assert_eq!((tokens.limit, tokens.remaining), (Some(3000), Some(2950)));
/// assert_eq!(tokens.window, Some(Duration::from_secs(1)));
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Feedback {
    status: u16,
    retry_after: Option<Duration>,
    quotas: Vec<Quota>,
}

/// One limit the upstream reported (one policy, or one `X-RateLimit-*`
/// suffix); each field is what the response said, where it said it.
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub struct Quota {
    /// The limit's name, lowercased: a policy's (`requests` from
    /// `"requests";q=50`) or an `X-RateLimit-*` suffix (`tokens` from
    /// `X-RateLimit-Remaining-Tokens`). `None`: the unnamed limit, the main
    /// one.
    pub name: Option<String>,
    /// The quota per window: `q`, `RateLimit-Limit`, `X-RateLimit-Limit`.
    pub limit: Option<u64>,
    /// The window's length, as sent: `w`.
    pub window: Option<Duration>,
    /// What is left of the quota: `r`, `RateLimit-Remaining`,
    /// `X-RateLimit-Remaining`.
    pub remaining: Option<u64>,
    /// How long after the response the quota resets, at most a day: `t`,
    /// `RateLimit-Reset`, `X-RateLimit-Reset` or `X-RateLimit-Reset-After`.
    pub reset: Option<Duration>,
}

impl Quota {
    /// A quota of this name, every other field `None` (`Quota::default()` is
    /// the unnamed one).
    pub fn named(name: impl Into<String>) -> Quota {
        Quota {
            name: Some(name.into()),
            ..Quota::default()
        }
    }
}

/// A rate-limit header line: when it is read ([`classify`]), the field its
/// value sets (a list's: its header), its `X-RateLimit-*` suffix, its value.
type Line<'h> = (u8, &'static [u8], &'h str, &'h [u8]);

impl Feedback {
    /// A response with this status that said nothing of its limits, for a
    /// client that reads the headers itself.
    ///
    /// ```
    /// use std::time::Duration;
    /// use paceline::outbound::{Feedback, Quota};
    ///
    /// let mut requests = Quota::named("requests");
    /// requests.remaining = Some(0);
    /// let feedback = Feedback::new(429)
    ///     .with_retry_after(Duration::from_secs(2))
    ///     .with_quota(requests);
    /// assert_eq!(feedback.quota(Some("Requests")).unwrap().remaining, Some(0));
    /// ```
    pub fn new(status: u16) -> Feedback {
        Feedback {
            status,
            ..Feedback::default()
        }
    }

    /// With `Retry-After`, cut to a day at most.
    #[must_use]
    pub fn with_retry_after(mut self, after: Duration) -> Feedback {
        self.retry_after = Some(cut(after));
        self
    }

    /// With this quota (its name lowercased, its reset cut to a day), in place
    /// of one of the same name; past 8 distinct names, left out.
    #[must_use]
    pub fn with_quota(mut self, mut quota: Quota) -> Feedback {
        quota.reset = quota.reset.map(cut);
        if let Some(name) = &mut quota.name {
            name.make_ascii_lowercase();
        }
        match self.find(quota.name.as_deref().map(str::as_bytes)) {
            Some(at) => self.quotas[at] = quota,
            None if self.quotas.len() < MAX_QUOTAS => self.quotas.push(quota),
            None => {}
        }
        self
    }

    /// Reads a response's status and headers, as `(name, value)` pairs;
    /// HTTP-dates and resets given as times are read against `now`. Names are
    /// matched ASCII case-insensitively. Read:
    ///
    /// * `Retry-After`: seconds (`120`, or `1.5`) or an HTTP-date (a date past
    ///   is zero).
    /// * `RateLimit-Policy` and `RateLimit`: items `"name";q=50;w=1` and
    ///   `"name";r=49;t=1`, one [`Quota`] per name; an unnamed `50;w=1`; the
    ///   older `limit=50, remaining=49, reset=1`.
    /// * `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`.
    /// * `X-RateLimit-Limit`, `-Remaining`, `-Reset`, `-Reset-After`, and each
    ///   with a suffix naming its quota (`X-RateLimit-Remaining-Tokens`).
    ///
    /// A reset is seconds (`1`, `0.020`), a duration with units (`6m0s`,
    /// `17ms`, `1h2m3.5s`), a time since the Unix epoch in seconds (a number
    /// from 10^9), milliseconds (from 10^12), microseconds (from 10^15) or
    /// nanoseconds (from 10^18), or an HTTP-date;
    /// `-Reset-After` is seconds or a duration.
    ///
    /// Where two headers give the same field of a quota, the first read wins:
    /// the current IETF headers, then their older forms, then `X-RateLimit-*`,
    /// each in the order given. The lines of one `RateLimit-Policy` or
    /// `RateLimit` header are one list, as if joined with commas. Within one
    /// list, items of one name that set different fields are one quota
    /// (`limit=50, remaining=49`), and two that set the same field are two
    /// policies, of which the more restrictive is kept, its rate (`q` with
    /// its `w`) and its remaining (with its reset; of two as few, the later)
    /// each whole. A `Retry-After`
    /// or reset longer than a day is cut to a day (one of more seconds than a
    /// `u64` holds too); what does not parse (any other number that overflows
    /// a `u64`, bytes that are not text) is left out. The work is linear in
    /// the headers' length, and bounded: 256 lines looked at, 32 rate-limit
    /// lines read (`Retry-After` apart: read wherever it comes among the
    /// 256), 16 items of a line (and names of a list) and 16 parameters of an
    /// item, 8 quotas kept, names of 1 to 64 token characters (an item named
    /// otherwise is left out). Nothing is allocated but the quotas.
    pub fn from_headers<'h, I>(status: u16, headers: I, now: SystemTime) -> Feedback
    where
        I: IntoIterator<Item = (&'h str, &'h [u8])>,
    {
        let mut lines: [Line<'h>; MAX_READ] = [(0, b"", "", b""); MAX_READ];
        let mut read = 0;
        let mut feedback = Feedback::new(status);
        for (name, value) in headers.into_iter().take(MAX_LINES) {
            match classify(name) {
                // (Read as it comes: no rate-limit line crowds it out.)
                Some((0, ..)) if feedback.retry_after.is_none() => {
                    feedback.retry_after = retry_after(value, now);
                }
                Some((0, ..)) => {}
                Some((rank, key, suffix)) if read < MAX_READ => {
                    lines[read] = (rank, key, suffix, value);
                    read += 1;
                }
                _ => {}
            }
        }
        let lines = &lines[..read];
        // The lines of one list header are one list, read where it first
        // comes: what a client that joins them with commas reads.
        for (at, &(rank, key, ..)) in lines.iter().enumerate() {
            let of_it = |line: &&Line<'h>| line.0 == 1 && line.1 == key;
            if rank == 1 && !lines[..at].iter().any(|line| of_it(&line)) {
                let values = lines.iter().filter(of_it).map(|line| line.3);
                feedback.read_list(values, b"q", MAX_ITEMS, now);
            }
        }
        for rank in 2..4 {
            for &line in lines.iter().filter(|line| line.0 == rank) {
                feedback.read(line, now);
            }
        }
        feedback
    }

    /// The response's status.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// How long the upstream asked to wait (`Retry-After`), at most a day.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The limits the upstream reported, at most 8, in the order read.
    pub fn quotas(&self) -> &[Quota] {
        &self.quotas
    }

    /// The quota of this name, matched ASCII case-insensitively (`None`: the
    /// unnamed one).
    pub fn quota(&self, name: Option<&str>) -> Option<&Quota> {
        self.find(name.map(str::as_bytes))
            .map(|at| &self.quotas[at])
    }

    /// The upstream refused for rate: `429`, or `503` with a `Retry-After`.
    pub fn is_throttled(&self) -> bool {
        self.status == 429 || (self.status == 503 && self.retry_after.is_some())
    }

    fn find(&self, name: Option<&[u8]>) -> Option<usize> {
        self.quotas
            .iter()
            .position(|quota| same_name(quota.name.as_deref().map(str::as_bytes), name))
    }

    /// Sets the fields of the quota `name` that are unset and `fields` sets,
    /// adding the quota if there is room.
    fn merge(&mut self, name: Option<&[u8]>, fields: Quota) {
        if fields == Quota::default() {
            return;
        }
        let at = match self.find(name) {
            Some(at) => at,
            None if self.quotas.len() < MAX_QUOTAS => {
                // A name is token characters: ASCII.
                let name = name.map(|name| String::from_utf8_lossy(name).to_ascii_lowercase());
                self.quotas.push(Quota {
                    name,
                    ..Quota::default()
                });
                self.quotas.len() - 1
            }
            None => return,
        };
        let quota = &mut self.quotas[at];
        quota.limit = quota.limit.or(fields.limit);
        quota.window = quota.window.or(fields.window);
        quota.remaining = quota.remaining.or(fields.remaining);
        quota.reset = quota.reset.or(fields.reset);
    }

    /// Reads a line of the older IETF headers or of `X-RateLimit-*`.
    fn read(&mut self, (rank, key, suffix, value): Line<'_>, now: SystemTime) {
        if rank == 3 || (rank == 2 && key == b"t" && reset(value, now).is_some()) {
            // (`RateLimit-Reset` whole: an HTTP-date holds a comma.)
            let mut fields = Quota::default();
            set(&mut fields, key, value.trim_ascii(), now);
            let name = Some(suffix.as_bytes()).filter(|suffix| !suffix.is_empty());
            self.merge(name, fields);
        } else {
            // One number first: it sets the header's field.
            self.read_list(std::iter::once(value), key, 1, now);
        }
    }

    /// Reads the items of a list's lines (at most `members` a line), a
    /// number item (`50;w=1`) setting the field `number`: a name's items,
    /// in all its lines, combined (see `combine`), at most 16 names.
    fn read_list<'v>(
        &mut self,
        values: impl Iterator<Item = &'v [u8]>,
        number: &[u8],
        members: usize,
        now: SystemTime,
    ) {
        let mut line: [(Option<&[u8]>, Quota); MAX_ITEMS] = Default::default();
        let mut names = 0;
        for member in values.flat_map(|value| split(value, b',').take(members)) {
            let mut pieces = split(member, b';');
            let Some((name, (key, value))) = item(pieces.next().unwrap_or_default(), number) else {
                continue;
            };
            let mut fields = Quota::default();
            set(&mut fields, key, value, now);
            for (key, value) in pieces.take(MAX_ITEMS).filter_map(pair) {
                set(&mut fields, key, value, now);
            }
            match line[..names]
                .iter_mut()
                .find(|(have, _)| same_name(*have, name))
            {
                Some((_, kept)) => combine(kept, fields),
                None if names < MAX_ITEMS => {
                    line[names] = (name, fields);
                    names += 1;
                }
                None => {}
            }
        }
        for (name, fields) in &mut line[..names] {
            self.merge(*name, std::mem::take(fields));
        }
    }
}

#[cfg(feature = "http")]
impl Feedback {
    /// Reads a response of the `http` crate as
    /// [`from_headers`](Self::from_headers) does, against the system clock.
    /// Only its status and headers are read, so a response's head alone serves
    /// too: `Response::from_parts(parts, ())`.
    pub fn from_response<B>(response: &::http::Response<B>) -> Feedback {
        let lines = response
            .headers()
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_bytes()));
        Feedback::from_headers(response.status().as_u16(), lines, SystemTime::now())
    }
}

/// What a header named `name` is: when it is read (0 `Retry-After`, 1 the IETF
/// headers, 2 their older forms, 3 `X-RateLimit-*`), which field a number in
/// it sets (a list: which list it is), and its `X-RateLimit-*` suffix.
fn classify(name: &str) -> Option<(u8, &'static [u8], &str)> {
    if let Some(rest) = strip(name, "x-ratelimit-") {
        let fields = ["limit", "remaining", "reset-after", "reset"];
        return fields.into_iter().find_map(|field| {
            let suffix = strip(rest, field)?;
            match suffix.strip_prefix('-') {
                _ if suffix.is_empty() => Some((3, field.as_bytes(), "")),
                Some(suffix) if is_name(suffix.as_bytes()) => Some((3, field.as_bytes(), suffix)),
                _ => None,
            }
        });
    }
    let known: [(&str, u8, &'static [u8]); 6] = [
        ("retry-after", 0, b""),
        ("ratelimit-policy", 1, b"policy"),
        ("ratelimit", 1, b"ratelimit"),
        ("ratelimit-limit", 2, b"q"),
        ("ratelimit-remaining", 2, b"r"),
        ("ratelimit-reset", 2, b"t"),
    ];
    let (_, rank, key) = known
        .into_iter()
        .find(|(known, ..)| name.eq_ignore_ascii_case(known))?;
    Some((rank, key, ""))
}

/// `name` past `prefix`, matched ASCII case-insensitively.
fn strip<'n>(name: &'n str, prefix: &str) -> Option<&'n str> {
    let head = name.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| name.get(prefix.len()..))?
}

/// A name: 1 to 64 token characters.
fn is_name(name: &[u8]) -> bool {
    (1..=MAX_NAME).contains(&name.len())
        && name
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&b))
}

/// Sets the field `key` names (`q` or `limit`, `w`, `r` or `remaining`,
/// `t` or `reset`, `reset-after`) from `value`.
fn set(fields: &mut Quota, key: &[u8], value: &[u8], now: SystemTime) {
    match key {
        b"q" | b"limit" => fields.limit = integer(value),
        b"w" => fields.window = seconds(value),
        b"r" | b"remaining" => fields.remaining = integer(value),
        b"t" | b"reset" => fields.reset = reset(value, now),
        b"reset-after" => fields.reset = long_seconds(value).or_else(|| units(value)).map(cut),
        _ => {}
    }
}

/// Whether two names are one (ASCII case-insensitively; `None`, the
/// unnamed limit).
fn same_name(a: Option<&[u8]>, b: Option<&[u8]>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => a.eq_ignore_ascii_case(b),
        _ => false,
    }
}

/// Adds to `kept`, a name's fields from the items of one line so far, those
/// of its next item. Items that set different fields are parts of one
/// quota (`limit=50, remaining=49, reset=1`). One that sets a field again
/// is another policy of that name: the more restrictive of the two is kept,
/// its rate whole (`q` with its `w`: `100;w=60, 5000;w=3600` is 5 000 an
/// hour, and `100, 5000;w=3600` too, never 100 an hour) and its remaining
/// with its reset (the fewer left; as few, the later reset), never a field
/// of one with a field of the other.
fn combine(kept: &mut Quota, next: Quota) {
    let overlaps = (kept.limit.is_some() && next.limit.is_some())
        || (kept.window.is_some() && next.window.is_some())
        || (kept.remaining.is_some() && next.remaining.is_some())
        || (kept.reset.is_some() && next.reset.is_some());
    if !overlaps {
        kept.limit = kept.limit.or(next.limit);
        kept.window = kept.window.or(next.window);
        kept.remaining = kept.remaining.or(next.remaining);
        kept.reset = kept.reset.or(next.reset);
        return;
    }
    let rate = |quota: &Quota| match (quota.limit, quota.window) {
        (Some(limit), Some(window)) if !window.is_zero() => {
            Some(limit as f64 / window.as_secs_f64())
        }
        _ => None,
    };
    if let Some(next_rate) = rate(&next)
        && rate(kept).is_none_or(|kept_rate| next_rate < kept_rate)
    {
        (kept.limit, kept.window) = (next.limit, next.window);
    }
    match (kept.remaining, next.remaining) {
        (_, None) => {}
        (Some(kept_left), Some(left)) if kept_left < left => {}
        // (As few left in both: the later reset, when both have room.)
        (Some(kept_left), Some(left)) if kept_left == left => {
            kept.reset = kept.reset.max(next.reset);
        }
        (_, left) => (kept.remaining, kept.reset) = (left, next.reset),
    }
}

/// A member's item: a name (a string or a token), or a field to set (a
/// number sets the field `number`, `key=value` its own).
fn item<'v>(item: &'v [u8], number: &'v [u8]) -> Option<(Option<&'v [u8]>, Field<'v>)> {
    match item.trim_ascii() {
        // A string that is no name leaves its item out (its parameters are
        // no other quota's).
        [b'"', name @ .., b'"'] => is_name(name).then_some((Some(name), (b"", b""))),
        [b'"', ..] => None,
        item @ [b'0'..=b'9', ..] => Some((None, (number, item))),
        item if is_name(item) => Some((Some(item), (b"", b""))),
        item => Some((None, pair(item)?)),
    }
}

/// A field's key and its value.
type Field<'v> = (&'v [u8], &'v [u8]);

/// `key=value`, each trimmed.
fn pair(text: &[u8]) -> Option<Field<'_>> {
    let at = text.iter().position(|&b| b == b'=')?;
    Some((text[..at].trim_ascii(), text[at + 1..].trim_ascii()))
}

/// The pieces of `bytes` between `separator`s outside quoted strings.
fn split(bytes: &[u8], separator: u8) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(bytes);
    std::iter::from_fn(move || {
        let bytes = rest?;
        let (mut quoted, mut escaped) = (false, false);
        for (at, &b) in bytes.iter().enumerate() {
            match b {
                _ if escaped => escaped = false,
                b'\\' if quoted => escaped = true,
                b'"' => quoted = !quoted,
                _ if b == separator && !quoted => {
                    rest = Some(&bytes[at + 1..]);
                    return Some(&bytes[..at]);
                }
                _ => {}
            }
        }
        rest = None;
        Some(bytes)
    })
}
