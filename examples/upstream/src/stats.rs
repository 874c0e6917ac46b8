//! What the upstream admitted, charged and refused: every admission's and
//! charge's time, the same counted per bucket of time, and the totals.

use std::fmt::Write as _;
use std::time::Duration;

use crate::Limits;
use crate::limits::Limit;

/// What happened in one bucket of time ([`Stats::bucket`] long).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Bucket {
    /// When it starts, since the upstream started.
    pub start: Duration,
    /// Calls admitted.
    pub admitted: u64,
    /// Tokens charged (when each call completed).
    pub tokens: u64,
    /// Calls refused (`429`).
    pub refused: u64,
    /// The most calls in flight at any moment in it.
    pub max_in_flight: u32,
}

/// How many refusals each limit took part in (a call refused by two
/// limits counts in both).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Refusals {
    /// By the requests bucket.
    pub requests: u64,
    /// By the tokens bucket, in debt.
    pub tokens: u64,
    /// By the limit of calls in flight.
    pub in_flight: u64,
}

/// Everything since the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Totals {
    /// Calls admitted.
    pub admitted: u64,
    /// Calls completed (their tokens charged).
    pub completed: u64,
    /// Tokens charged.
    pub tokens: u64,
    /// Calls refused (`429`).
    pub refused: u64,
    /// Which limits refused them.
    pub refused_by: Refusals,
    /// The most calls in flight at once.
    pub max_in_flight: u32,
    /// The deepest the tokens bucket went below zero, rounded up.
    pub max_token_debt: u64,
}

/// The most requests admitted and tokens charged in a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Window {
    /// Requests admitted.
    pub requests: u64,
    /// Tokens charged.
    pub tokens: u64,
}

/// What the buckets allow in a window (`None` where that dimension is not
/// limited).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Allowance {
    /// Requests.
    pub requests: Option<u64>,
    /// Tokens.
    pub tokens: Option<u64>,
}

/// A span's requests and tokens as a fraction of the limits' sustained
/// rate (`None` where that dimension is not limited).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Usage {
    /// Requests admitted over `requests per second × span`.
    pub requests: Option<f64>,
    /// Tokens charged over `tokens per second × span`.
    pub tokens: Option<f64>,
}

/// Everything the upstream admitted and refused, from its start to
/// [`elapsed`](Self::elapsed).
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    /// How long it had been running when these were taken.
    pub elapsed: Duration,
    /// The span of each bucket.
    pub bucket: Duration,
    /// The counts per bucket, from the start to the bucket `elapsed` falls
    /// in, each there (a quiet bucket counts zeros).
    pub buckets: Vec<Bucket>,
    /// The totals.
    pub totals: Totals,
    /// The limits it enforced.
    pub limits: Limits,
    /// When each call was admitted, since the start, in order.
    pub admissions: Vec<Duration>,
    /// When each call's tokens were charged (when it completed), since the
    /// start, in order, and how many.
    pub charges: Vec<(Duration, u64)>,
}

impl Stats {
    /// The most requests admitted in any window of `window` (closed: both
    /// ends included), and the most tokens charged in any, sliding over
    /// the exact times.
    pub fn max_in_any_window(&self, window: Duration) -> Window {
        let mut requests = 0;
        let mut first = 0;
        for (last, &at) in self.admissions.iter().enumerate() {
            while at - self.admissions[first] > window {
                first += 1;
            }
            requests = requests.max(last - first + 1);
        }
        let (mut tokens, mut sum) = (0, 0);
        let mut first = 0;
        for &(at, cost) in &self.charges {
            sum += cost;
            while at - self.charges[first].0 > window {
                sum -= self.charges[first].1;
                first += 1;
            }
            tokens = tokens.max(sum);
        }
        Window {
            requests: requests as u64,
            tokens,
        }
    }

    /// What the buckets allow in any window of `window`: a full bucket and
    /// the rate over the window (`capacity + rate × window`, rounded
    /// down). For tokens, also [`Totals::max_token_debt`]: tokens are
    /// charged when a call completes, so calls admitted while the bucket
    /// still held some can take it below zero, and what they took below
    /// zero was charged on top of the allowance.
    ///
    /// An upstream whose limits held has `max_in_any_window(w)` within
    /// `allowance(w)` for every `w`.
    pub fn allowance(&self, window: Duration) -> Allowance {
        let secs = window.as_secs_f64();
        let allow = |rate: f64| rate * f64::from(self.limits.window_secs) + rate * secs;
        Allowance {
            requests: self
                .limits
                .requests_per_second
                .map(|rate| (allow(rate) + 1e-6).floor() as u64),
            tokens: self
                .limits
                .tokens_per_second
                .map(|rate| (allow(rate) + 1e-6).floor() as u64 + self.totals.max_token_debt),
        }
    }

    /// The requests admitted and the tokens charged in `from..to`, over
    /// what the limits' rates allow in it (without the burst a full bucket
    /// adds, so a short span starting with a full bucket can be above 1):
    /// the fraction of the limit a client used.
    pub fn fraction_used(&self, from: Duration, to: Duration) -> Usage {
        let secs = to.saturating_sub(from).as_secs_f64();
        let inside = |at: &Duration| (from..to).contains(at);
        let requests = self.admissions.iter().filter(|at| inside(at)).count() as f64;
        let tokens: u64 = self
            .charges
            .iter()
            .filter(|(at, _)| inside(at))
            .map(|(_, cost)| cost)
            .sum();
        let fraction = |amount: f64, rate: f64| {
            if secs > 0.0 {
                amount / (rate * secs)
            } else {
                0.0
            }
        };
        Usage {
            requests: self
                .limits
                .requests_per_second
                .map(|rate| fraction(requests, rate)),
            tokens: self
                .limits
                .tokens_per_second
                .map(|rate| fraction(tokens as f64, rate)),
        }
    }

    /// The stats as `GET /stats` answers them, on one line (durations in
    /// whole milliseconds; the exact times are left out):
    ///
    /// ```text
    /// {"elapsed_ms":2513,"bucket_ms":100,
    ///  "limits":{"requests_per_second":50,"tokens_per_second":3000,"max_in_flight":null,"window_secs":1},
    ///  "totals":{"admitted":120,"completed":118,"tokens":8410,"refused":35,
    ///            "refused_by":{"requests":30,"tokens":5,"in_flight":0},
    ///            "max_in_flight":50,"max_token_debt":412},
    ///  "buckets":[{"start_ms":0,"admitted":50,"tokens":0,"refused":3,"max_in_flight":50},...]}
    /// ```
    pub fn to_json(&self) -> String {
        let mut json = String::with_capacity(200 + 80 * self.buckets.len());
        let ms = |d: Duration| d.as_millis();
        let or_null = |value: Option<String>| value.unwrap_or_else(|| "null".to_owned());
        let limits = &self.limits;
        let totals = &self.totals;
        let _ = write!(
            json,
            "{{\"elapsed_ms\":{},\"bucket_ms\":{},\"limits\":{{\"requests_per_second\":{},\
             \"tokens_per_second\":{},\"max_in_flight\":{},\"window_secs\":{}}},\
             \"totals\":{{\"admitted\":{},\"completed\":{},\"tokens\":{},\"refused\":{},\
             \"refused_by\":{{\"requests\":{},\"tokens\":{},\"in_flight\":{}}},\
             \"max_in_flight\":{},\"max_token_debt\":{}}},\"buckets\":[",
            ms(self.elapsed),
            ms(self.bucket),
            or_null(limits.requests_per_second.map(|r| r.to_string())),
            or_null(limits.tokens_per_second.map(|r| r.to_string())),
            or_null(limits.max_in_flight.map(|m| m.to_string())),
            limits.window_secs,
            totals.admitted,
            totals.completed,
            totals.tokens,
            totals.refused,
            totals.refused_by.requests,
            totals.refused_by.tokens,
            totals.refused_by.in_flight,
            totals.max_in_flight,
            totals.max_token_debt,
        );
        for (i, bucket) in self.buckets.iter().enumerate() {
            let _ = write!(
                json,
                "{}{{\"start_ms\":{},\"admitted\":{},\"tokens\":{},\"refused\":{},\"max_in_flight\":{}}}",
                if i == 0 { "" } else { "," },
                ms(bucket.start),
                bucket.admitted,
                bucket.tokens,
                bucket.refused,
                bucket.max_in_flight,
            );
        }
        json.push_str("]}");
        json
    }
}

/// Records as they happen; times in nanoseconds since the start.
#[derive(Debug)]
pub(crate) struct Recorder {
    bucket_nanos: u64,
    buckets: Vec<Bucket>,
    admissions: Vec<u64>,
    charges: Vec<(u64, u64)>,
    totals: Totals,
}

impl Recorder {
    pub(crate) fn new(bucket_nanos: u64) -> Recorder {
        Recorder {
            bucket_nanos,
            buckets: Vec::new(),
            admissions: Vec::new(),
            charges: Vec::new(),
            totals: Totals::default(),
        }
    }

    /// The bucket `now` falls in, with those before it, each holding
    /// `in_flight` (the calls in flight all through them) as its most.
    fn bucket(&mut self, now: u64, in_flight: u32) -> &mut Bucket {
        let index = usize::try_from(now / self.bucket_nanos).unwrap_or(usize::MAX);
        fill(&mut self.buckets, index, in_flight, self.bucket_nanos);
        &mut self.buckets[index]
    }

    /// A call admitted at `now`, with `in_flight` others.
    pub(crate) fn admitted(&mut self, now: u64, in_flight: u32) {
        let bucket = self.bucket(now, in_flight);
        bucket.admitted += 1;
        bucket.max_in_flight = bucket.max_in_flight.max(in_flight + 1);
        self.admissions.push(now);
        self.totals.admitted += 1;
        self.totals.max_in_flight = self.totals.max_in_flight.max(in_flight + 1);
    }

    /// A call completed at `now`, `in_flight` with it, charged `cost`;
    /// the tokens bucket's level after, where it is limited.
    pub(crate) fn charged(&mut self, now: u64, in_flight: u32, cost: u64, level: Option<f64>) {
        let bucket = self.bucket(now, in_flight);
        bucket.tokens += cost;
        self.charges.push((now, cost));
        self.totals.completed += 1;
        self.totals.tokens += cost;
        if let Some(level) = level.filter(|&level| level < 0.0) {
            let debt = (-level).ceil() as u64;
            self.totals.max_token_debt = self.totals.max_token_debt.max(debt);
        }
    }

    /// A call refused at `now` by `limits`, with `in_flight` in flight.
    pub(crate) fn refused(&mut self, now: u64, in_flight: u32, limits: &[Limit]) {
        self.bucket(now, in_flight).refused += 1;
        self.totals.refused += 1;
        for limit in limits {
            let count = match limit {
                Limit::Requests => &mut self.totals.refused_by.requests,
                Limit::Tokens => &mut self.totals.refused_by.tokens,
                Limit::InFlight => &mut self.totals.refused_by.in_flight,
            };
            *count += 1;
        }
    }

    pub(crate) fn totals(&self) -> Totals {
        self.totals
    }

    /// A copy at `now`, `in_flight` in flight; the exact times too if
    /// `events`.
    pub(crate) fn stats(&self, now: u64, in_flight: u32, limits: Limits, events: bool) -> Stats {
        let mut buckets = self.buckets.clone();
        let index = usize::try_from(now / self.bucket_nanos).unwrap_or(usize::MAX);
        fill(&mut buckets, index, in_flight, self.bucket_nanos);
        let nanos = Duration::from_nanos;
        Stats {
            elapsed: nanos(now),
            bucket: nanos(self.bucket_nanos),
            buckets,
            totals: self.totals,
            limits,
            admissions: match events {
                true => self.admissions.iter().map(|&at| nanos(at)).collect(),
                false => Vec::new(),
            },
            charges: match events {
                true => self.charges.iter().map(|&(at, c)| (nanos(at), c)).collect(),
                false => Vec::new(),
            },
        }
    }
}

/// Adds the buckets up to `index`, each holding `in_flight` as its most.
fn fill(buckets: &mut Vec<Bucket>, index: usize, in_flight: u32, bucket_nanos: u64) {
    while buckets.len() <= index {
        let start = Duration::from_nanos((buckets.len() as u64).saturating_mul(bucket_nanos));
        buckets.push(Bucket {
            start,
            max_in_flight: in_flight,
            ..Bucket::default()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn limits() -> Limits {
        Limits {
            requests_per_second: Some(10.0),
            tokens_per_second: Some(100.0),
            max_in_flight: None,
            window_secs: 1,
        }
    }

    #[test]
    fn windows_slide_over_the_exact_times() {
        let mut recorder = Recorder::new(100 * MS);
        for at in [0, 10, 20, 500, 1010, 1020, 1030, 1040] {
            recorder.admitted(at * MS, 0);
            recorder.charged(at * MS + 5 * MS, 1, at + 1, None);
        }
        let stats = recorder.stats(1100 * MS, 0, limits(), true);
        // [500, 1500] holds 500 and the four after 1 000; [1010, 1040] those
        // four: closed windows.
        assert_eq!(
            stats
                .max_in_any_window(Duration::from_millis(1000))
                .requests,
            5
        );
        assert_eq!(
            stats.max_in_any_window(Duration::from_millis(999)).requests,
            5
        );
        assert_eq!(
            stats.max_in_any_window(Duration::from_millis(30)).requests,
            4
        );
        assert_eq!(
            stats.max_in_any_window(Duration::from_millis(29)).requests,
            3
        );
        assert_eq!(stats.max_in_any_window(Duration::ZERO).requests, 1);
        // Charges: 1, 11, 21, 501, 1011, 1021, 1031, 1041.
        assert_eq!(
            stats.max_in_any_window(Duration::from_millis(30)).tokens,
            1011 + 1021 + 1031 + 1041
        );
        assert_eq!(
            stats.max_in_any_window(Duration::from_millis(1030)).tokens,
            11 + 21 + 501 + 1011 + 1021 + 1031 + 1041
        );
        assert_eq!(
            Stats {
                admissions: Vec::new(),
                charges: Vec::new(),
                ..stats
            }
            .max_in_any_window(Duration::from_secs(1)),
            Window::default()
        );
    }

    #[test]
    fn buckets_count_and_carry_the_calls_in_flight() {
        let mut recorder = Recorder::new(100 * MS);
        recorder.admitted(10 * MS, 0);
        recorder.admitted(20 * MS, 1);
        recorder.refused(30 * MS, 2, &[Limit::Requests, Limit::Tokens]);
        recorder.charged(350 * MS, 2, 40, Some(-12.5));
        recorder.charged(360 * MS, 1, 60, Some(-70.0));
        let stats = recorder.stats(450 * MS, 0, limits(), true);
        let expected = |admitted, tokens, refused, max_in_flight, start| Bucket {
            start: Duration::from_millis(start),
            admitted,
            tokens,
            refused,
            max_in_flight,
        };
        assert_eq!(
            stats.buckets,
            [
                expected(2, 0, 1, 2, 0),
                expected(0, 0, 0, 2, 100),
                expected(0, 0, 0, 2, 200),
                expected(0, 100, 0, 2, 300),
                expected(0, 0, 0, 0, 400),
            ]
        );
        assert_eq!(
            stats.totals,
            Totals {
                admitted: 2,
                completed: 2,
                tokens: 100,
                refused: 1,
                refused_by: Refusals {
                    requests: 1,
                    tokens: 1,
                    in_flight: 0
                },
                max_in_flight: 2,
                max_token_debt: 70,
            }
        );
        assert_eq!(stats.elapsed, Duration::from_millis(450));
        assert_eq!(
            stats.admissions,
            [Duration::from_millis(10), Duration::from_millis(20)]
        );
        let allowance = stats.allowance(Duration::from_millis(500));
        assert_eq!(
            allowance,
            Allowance {
                requests: Some(15),
                tokens: Some(220)
            }
        );
        let usage = stats.fraction_used(Duration::ZERO, Duration::from_secs(1));
        assert_eq!(
            usage,
            Usage {
                requests: Some(0.2),
                tokens: Some(1.0)
            }
        );
        let json = stats.to_json();
        assert!(
            json.starts_with(
                "{\"elapsed_ms\":450,\"bucket_ms\":100,\"limits\":{\"requests_per_second\":10,\
             \"tokens_per_second\":100,\"max_in_flight\":null,\"window_secs\":1},\
             \"totals\":{\"admitted\":2,\"completed\":2,\"tokens\":100,\"refused\":1,\
             \"refused_by\":{\"requests\":1,\"tokens\":1,\"in_flight\":0},\
             \"max_in_flight\":2,\"max_token_debt\":70},\"buckets\":[\
             {\"start_ms\":0,\"admitted\":2,\"tokens\":0,\"refused\":1,\"max_in_flight\":2},"
            ),
            "{json}"
        );
        assert!(json.ends_with(
            "{\"start_ms\":400,\"admitted\":0,\"tokens\":0,\"refused\":0,\"max_in_flight\":0}]}"
        ));
    }
}
