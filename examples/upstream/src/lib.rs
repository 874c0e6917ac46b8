//! A rate-limited HTTP upstream of our own, shaped like an LLM API, for
//! testing clients that pace their calls to someone else's API: it
//! enforces requests per second, tokens per second and calls in flight the
//! way providers do, answers `429 Too Many Requests` with the headers they
//! send, and records everything it admitted and refused so that a test can
//! check its limits held and a benchmark can draw what went through.
//!
//! ```text
//! cargo run -p paceline-upstream -- --rps 50 --tps 3000 --port 8080
//! curl -i -X POST http://127.0.0.1:8080/v1/complete
//! curl http://127.0.0.1:8080/stats
//! ```
//!
//! # The API
//!
//! * `POST /v1/complete` (any body): a call. The server decides what it
//!   costs, a number of tokens in [`Config::tokens`] that the client
//!   learns only from the answer ([`Config::token_cost`] says which: the
//!   cost of the `n`th call admitted depends only on the seed and `n`),
//!   and answers after [`Config::latency`] (plus up to [`Config::jitter`]),
//!   like a model generating. `200 OK` carries `X-Usage-Tokens: N` and the
//!   body `{"usage":{"total_tokens":N}}`.
//! * `GET /stats`: what it admitted and refused, as JSON (see
//!   [`Stats::to_json`]).
//!
//! # The limits
//!
//! Each optional ([`Limits`]): requests per second, tokens per second, and
//! calls in flight at once. Requests and tokens are each a token bucket
//! holding [`Limits::window_secs`] seconds' worth (one by default), full
//! at the start and refilled continuously. A call is admitted when
//!
//! * the requests bucket holds a whole request (taken at admission),
//! * the tokens bucket is not in debt: a call's tokens are taken when it
//!   completes, at its real cost, so calls admitted together can drive the
//!   bucket below zero, and then it refuses every call until it refills
//!   to zero,
//! * and fewer than the limit of calls are in flight.
//!
//! Otherwise it is refused at once: `429`, with the body
//! `{"error":{"type":"rate_limit_exceeded","limits":["requests"]}}`
//! naming each limit that refused it (`requests`, `tokens`, `in_flight`).
//!
//! # The headers
//!
//! On every answer from `/v1/complete`, `200` and `429` alike, per
//! [`Config::headers`]; one item per limit, requests before tokens, each
//! limit that is set and no other (the in-flight limit has none):
//!
//! * `RateLimit-Policy: "requests";q=50;w=1, "tokens";q=3000;w=1`: `q`
//!   what the bucket holds when full (rounded down), `w`
//!   [`Limits::window_secs`].
//! * `RateLimit: "requests";r=49;t=1, "tokens";r=2950;t=1`: `r` what the
//!   bucket holds now (rounded down; 0 in debt), `t` whole seconds
//!   (rounded up) until it is full again.
//! * `X-RateLimit-Limit-Requests`, `X-RateLimit-Remaining-Requests`,
//!   `X-RateLimit-Reset-Requests`, and the same three with `-Tokens`: `q`,
//!   `r`, and the seconds until full as a decimal number with three
//!   places (`0.020`).
//!
//! A `200` reports the buckets when the call completes, its tokens taken.
//! A `429` carries `Retry-After` ([`Config::retry_after`]): by default
//! whole seconds, rounded up, at least 1, until every limit that refused
//! it would admit a call (for the in-flight limit, until the first call in
//! flight is due to finish).
//!
//! # The records
//!
//! [`Upstream::stats`] returns every admission's time and every call's
//! tokens with the time they were taken, and the same counted per
//! [`Config::stats_bucket`] (100 ms by default).
//! [`Stats::max_in_any_window`] slides a window over the exact times, and
//! [`Stats::allowance`] says what the buckets allow in it, so that a test
//! can assert that the limits held in every window.

pub mod client;
mod headers;
mod limits;
mod server;
mod stats;

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::ops::RangeInclusive;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

pub use headers::http_date;
pub use stats::{Allowance, Bucket, Refusals, Stats, Totals, Usage, Window};

use limits::Shared;

/// The limits the upstream enforces. Each is optional: `None` does not
/// limit that dimension.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Requests admitted per second. Default 50.
    pub requests_per_second: Option<f64>,
    /// Tokens charged per second. Default 3 000.
    pub tokens_per_second: Option<f64>,
    /// Calls in flight at once (admitted, not yet answered). Default none.
    pub max_in_flight: Option<u32>,
    /// What each bucket holds when full, in seconds of its rate: the burst
    /// after an idle spell, and the `w` of `RateLimit-Policy`. Default 1,
    /// at least 1.
    pub window_secs: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            requests_per_second: Some(50.0),
            tokens_per_second: Some(3000.0),
            max_in_flight: None,
            window_secs: 1,
        }
    }
}

/// How a `429` says when to come back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RetryAfter {
    /// `Retry-After: 2`: whole seconds, rounded up, at least 1. The default.
    #[default]
    Seconds,
    /// `Retry-After: Sun, 06 Nov 1994 08:49:37 GMT`: the moment, rounded up
    /// to a whole second and at least one second away.
    HttpDate,
    /// No `Retry-After`.
    Omitted,
}

/// Which rate-limit headers the answers carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RateLimitHeaders {
    /// `RateLimit-Policy`, `RateLimit` and the `X-RateLimit-*` ones. The
    /// default.
    #[default]
    All,
    /// `RateLimit-Policy` and `RateLimit` only.
    Ietf,
    /// The `X-RateLimit-*` ones only.
    XRateLimit,
    /// None.
    None,
}

/// What the upstream is asked to do.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Where it listens: a loopback address (any other is refused), port 0
    /// for a free one. Default `127.0.0.1:0`.
    pub addr: SocketAddr,
    /// The seed of the calls' costs and latencies. Default 1.
    pub seed: u64,
    /// The tokens a call costs, drawn from this range. Default `20..=120`.
    pub tokens: RangeInclusive<u64>,
    /// How long a call takes before it is answered. Default 50 ms.
    pub latency: Duration,
    /// Up to this much more, drawn per call. Default zero.
    pub jitter: Duration,
    /// The limits.
    pub limits: Limits,
    /// How a `429` says when to come back.
    pub retry_after: RetryAfter,
    /// Which rate-limit headers the answers carry.
    pub headers: RateLimitHeaders,
    /// The span of each bucket of [`Stats::buckets`]. Default 100 ms.
    pub stats_bucket: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            seed: 1,
            tokens: 20..=120,
            latency: Duration::from_millis(50),
            jitter: Duration::ZERO,
            limits: Limits::default(),
            retry_after: RetryAfter::default(),
            headers: RateLimitHeaders::default(),
            stats_bucket: Duration::from_millis(100),
        }
    }
}

/// SplitMix64's output function: a well-mixed 64 bits from any 64.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Separates the latencies' draws from the costs'.
const JITTER_STREAM: u64 = 0x6A09_E667_F3BC_C908;

impl Config {
    /// The tokens the `n`th call admitted costs (from 0): a function of
    /// the seed and `n` only, so a run's costs are the same every time
    /// though the clients cannot know them before the answer.
    pub fn token_cost(&self, n: u64) -> u64 {
        let (low, high) = (*self.tokens.start(), *self.tokens.end());
        let draw = mix(self.seed ^ mix(n));
        match (high - low).checked_add(1) {
            Some(span) => low + draw % span,
            None => draw,
        }
    }

    /// How long the `n`th call admitted takes: [`latency`](Self::latency)
    /// and a drawn part of [`jitter`](Self::jitter).
    pub fn call_latency(&self, n: u64) -> Duration {
        let jitter = self.jitter.as_nanos();
        let draw = u128::from(mix(self.seed ^ mix(n ^ JITTER_STREAM)));
        let extra = (jitter * draw) >> 64;
        self.latency + Duration::from_nanos(u64::try_from(extra).unwrap_or(u64::MAX))
    }

    /// Checks the configuration: a loopback address, limits above zero, a
    /// range of costs that is not empty.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |what: &str| Err(ConfigError(what.to_owned()));
        if !self.addr.ip().is_loopback() {
            return bad("the upstream listens on a loopback address only");
        }
        if self.tokens.is_empty() {
            return bad("the range of tokens is empty");
        }
        for (name, rate) in [
            ("requests per second", self.limits.requests_per_second),
            ("tokens per second", self.limits.tokens_per_second),
        ] {
            if rate.is_some_and(|rate| !(rate.is_finite() && rate > 0.0 && rate < 1e15)) {
                return Err(ConfigError(format!("{name} must be above 0")));
            }
        }
        if self.limits.max_in_flight == Some(0) {
            return bad("the calls in flight must be at least 1");
        }
        if self.limits.window_secs == 0 {
            return bad("the window must be at least 1 second");
        }
        if self.stats_bucket.is_zero() {
            return bad("the stats bucket must be longer than zero");
        }
        Ok(())
    }

    /// The configuration from command-line arguments (the program's name
    /// left out); see [`USAGE`].
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Config, ConfigError> {
        let mut config = Config::default();
        let mut args = args.into_iter();
        while let Some(flag) = args.next() {
            let value = args
                .next()
                .ok_or_else(|| ConfigError(format!("{flag} needs a value")))?;
            let bad = || ConfigError(format!("{flag}: cannot read {value:?}"));
            let number = |value: &str| value.parse::<u64>().map_err(|_| bad());
            let rate = |value: &str| match value {
                "none" => Ok(None),
                _ => value.parse::<f64>().map(Some).map_err(|_| bad()),
            };
            let ms = |value: &str| number(value).map(Duration::from_millis);
            let small = |value: &str| value.parse::<u32>().map_err(|_| bad());
            match flag.as_str() {
                "--port" => config.addr.set_port(value.parse().map_err(|_| bad())?),
                "--host" => config.addr.set_ip(value.parse().map_err(|_| bad())?),
                "--rps" => config.limits.requests_per_second = rate(&value)?,
                "--tps" => config.limits.tokens_per_second = rate(&value)?,
                "--in-flight" => {
                    config.limits.max_in_flight = match value.as_str() {
                        "none" => None,
                        _ => Some(small(&value)?),
                    }
                }
                "--window" => config.limits.window_secs = small(&value)?,
                "--tokens" => {
                    let (low, high) = value.split_once('-').unwrap_or((&value, &value));
                    config.tokens = number(low)?..=number(high)?;
                }
                "--latency" => config.latency = ms(&value)?,
                "--jitter" => config.jitter = ms(&value)?,
                "--seed" => config.seed = number(&value)?,
                "--retry-after" => {
                    config.retry_after = match value.as_str() {
                        "seconds" => RetryAfter::Seconds,
                        "date" => RetryAfter::HttpDate,
                        "none" => RetryAfter::Omitted,
                        _ => return Err(bad()),
                    }
                }
                "--headers" => {
                    config.headers = match value.as_str() {
                        "all" => RateLimitHeaders::All,
                        "ietf" => RateLimitHeaders::Ietf,
                        "x" => RateLimitHeaders::XRateLimit,
                        "none" => RateLimitHeaders::None,
                        _ => return Err(bad()),
                    }
                }
                "--bucket-ms" => config.stats_bucket = ms(&value)?,
                other => return Err(ConfigError(format!("unknown option {other}"))),
            }
        }
        config.validate()?;
        Ok(config)
    }
}

/// The command line's options.
pub const USAGE: &str = "\
usage: upstream [OPTION VALUE]...
  --port N             port on 127.0.0.1 (default 0: a free one)
  --host IP            a loopback address (default 127.0.0.1)
  --rps R|none         requests per second (default 50)
  --tps R|none         tokens per second (default 3000)
  --in-flight N|none   calls in flight at once (default none)
  --window S           seconds' worth each bucket holds (default 1)
  --tokens MIN-MAX     a call's cost in tokens (default 20-120)
  --latency MS         a call's time before it is answered (default 50)
  --jitter MS          up to this much more per call (default 0)
  --seed N             the seed of costs and latencies (default 1)
  --retry-after seconds|date|none   (default seconds)
  --headers all|ietf|x|none         rate-limit headers (default all)
  --bucket-ms N        span of each /stats bucket (default 100)";

/// A configuration the upstream cannot run with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

impl From<ConfigError> for io::Error {
    fn from(error: ConfigError) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidInput, error)
    }
}

/// How long a shutdown waits for the calls in flight to be answered
/// before it cuts them off.
const GRACE: Duration = Duration::from_secs(1);

/// A running upstream, on a thread of its own (its own runtime, so that a
/// client under test that blocks its threads does not slow it). Dropping
/// it shuts it down: it stops accepting, answers the calls in flight that
/// finish within a second, closes every connection, and returns when its
/// thread has ended and the port is free.
#[derive(Debug)]
pub struct Upstream {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: tokio::sync::watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
}

impl Upstream {
    /// Starts the upstream: binds its address (so that it is listening
    /// when this returns) and serves on a thread of its own. Need not be
    /// called inside a runtime, and may be.
    pub fn start(config: Config) -> io::Result<Upstream> {
        config.validate()?;
        let listener = std::net::TcpListener::bind(config.addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::new(config));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let serving = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("upstream {addr}"))
            .spawn(move || server::run(listener, serving, stopped, GRACE, ready_tx))?;
        match ready.recv() {
            Ok(Ok(())) => Ok(Upstream {
                addr,
                shared,
                stop,
                thread: Some(thread),
            }),
            Ok(Err(error)) => {
                let _ = thread.join();
                Err(error)
            }
            Err(_) => {
                let _ = thread.join();
                Err(io::Error::other(
                    "the upstream's thread ended before it served",
                ))
            }
        }
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, to which a path is appended.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What it was started with.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// Everything it admitted and refused so far: a copy, made under the
    /// lock the calls take, of every admission's time and every charge (it
    /// keeps 24 bytes a call, and 48 a bucket, for as long as it runs).
    pub fn stats(&self) -> Stats {
        self.shared.stats(true)
    }

    /// The totals alone, without copying the records.
    pub fn totals(&self) -> Totals {
        self.shared.totals()
    }

    /// Shuts it down, as dropping it does.
    pub fn shutdown(self) {}
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_are_the_seeds_and_in_range() {
        let config = Config::default();
        let costs: Vec<u64> = (0..1000).map(|n| config.token_cost(n)).collect();
        assert!(costs.iter().all(|c| (20..=120).contains(c)));
        assert!(costs.iter().any(|&c| c < 30) && costs.iter().any(|&c| c > 110));
        let again: Vec<u64> = (0..1000).map(|n| config.token_cost(n)).collect();
        assert_eq!(costs, again);
        let other = Config {
            seed: 2,
            ..Config::default()
        };
        assert_ne!(
            costs,
            (0..1000).map(|n| other.token_cost(n)).collect::<Vec<_>>()
        );
        let fixed = Config {
            tokens: 7..=7,
            ..Config::default()
        };
        assert!((0..100).all(|n| fixed.token_cost(n) == 7));
        let all = Config {
            tokens: 0..=u64::MAX,
            ..Config::default()
        };
        assert_ne!(all.token_cost(0), all.token_cost(1));
    }

    #[test]
    fn latencies_lie_in_latency_plus_jitter() {
        let config = Config {
            latency: Duration::from_millis(50),
            jitter: Duration::from_millis(20),
            ..Config::default()
        };
        let latencies: Vec<Duration> = (0..1000).map(|n| config.call_latency(n)).collect();
        let (low, high) = (Duration::from_millis(50), Duration::from_millis(70));
        assert!(latencies.iter().all(|l| (low..high).contains(l)));
        assert!(latencies.iter().any(|&l| l < Duration::from_millis(52)));
        assert!(latencies.iter().any(|&l| l > Duration::from_millis(68)));
        assert_eq!(Config::default().call_latency(5), Duration::from_millis(50));
    }

    #[test]
    fn the_command_line_sets_each_option() {
        let args = "--rps 10 --tps none --in-flight 4 --window 2 --tokens 5-9 --latency 30 \
                    --jitter 10 --seed 7 --retry-after date --headers x --port 8080 \
                    --bucket-ms 250";
        let config = Config::parse(args.split(' ').map(String::from)).unwrap();
        assert_eq!(
            config,
            Config {
                addr: "127.0.0.1:8080".parse().unwrap(),
                seed: 7,
                tokens: 5..=9,
                latency: Duration::from_millis(30),
                jitter: Duration::from_millis(10),
                limits: Limits {
                    requests_per_second: Some(10.0),
                    tokens_per_second: None,
                    max_in_flight: Some(4),
                    window_secs: 2,
                },
                retry_after: RetryAfter::HttpDate,
                headers: RateLimitHeaders::XRateLimit,
                stats_bucket: Duration::from_millis(250),
            }
        );
        assert_eq!(Config::parse(Vec::new()).unwrap(), Config::default());
        let parse = |args: &str| Config::parse(args.split(' ').map(String::from));
        assert!(parse("--host 0.0.0.0").is_err());
        assert!(parse("--host ::1").is_ok());
        assert!(parse("--rps 0").is_err());
        assert!(parse("--tokens 9-5").is_err());
        assert!(parse("--in-flight 0").is_err());
        assert!(parse("--window").is_err());
        assert!(parse("--speed 3").is_err());
    }
}
