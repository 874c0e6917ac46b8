//! The worker side of the outbound benchmark: one process of the fleet,
//! this same binary re-executed with [`WORKER_ENV`] set to a strategy's
//! name. It runs `tasks` tasks that each make one logical call after
//! another to the upstream until the run's deadline, paced and retried as
//! its strategy says, and prints one line per logical call on stdout when
//! the run is over (see [`Record`]).
//!
//! A strategy is one `async fn(Worker) -> Result<(), String>` that builds
//! what it needs (a limiter or none) and hands [`Worker::run`] the body of
//! one logical call: a closure from a [`Call`] to its final [`Answer`].
//! Adding one is that function and its line in [`STRATEGIES`].

use std::future::Future;
use std::pin::Pin;
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicU16, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{HeaderMap, RETRY_AFTER};
use hyper::{Request, StatusCode};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use paceline::outbound::Feedback;
use paceline::redis::{Client as RedisClient, Redis, RedisBackend};
use paceline::{Cost, Limit, Limiter, RateLimiter};

use crate::record::{Outcome, Record};

/// A strategy: its name (`PACELINE_BENCH_STRATEGIES`, the table's rows),
/// what it does (the SVG's panel titles), and its worker's body.
pub struct Strategy {
    pub name: &'static str,
    pub what: &'static str,
    run: fn(Worker) -> Body,
}

/// A worker's body, as a strategy's `async fn` returns it.
type Body = Pin<Box<dyn Future<Output = Result<(), String>>>>;

/// The strategies, in the order a run measures them.
pub const STRATEGIES: &[Strategy] = &[
    Strategy {
        name: "none",
        what: "no limiter; on 429, sleep Retry-After",
        run: |worker| Box::pin(none_worker(worker)),
    },
    Strategy {
        name: "fixed-local",
        what: "a limiter per process at 2x the requests limit; on 429, sleep Retry-After",
        run: |worker| Box::pin(fixed_local_worker(worker)),
    },
    Strategy {
        name: "fixed-redis",
        what: "one limiter through Redis at 2x the requests limit; on 429, sleep Retry-After",
        run: |worker| Box::pin(fixed_redis_worker(worker)),
    },
    Strategy {
        name: "learned",
        what: "one limiter through Redis at 2x both limits, learned from the answers, tokens settled",
        run: |worker| Box::pin(learned_worker(worker)),
    },
];

/// The rate the fixed limiters are configured with: twice the upstream's
/// 50 requests a second, as a user who does not know the limit (or only
/// the requests half of it) would guess it, with `Limit::per_second`'s
/// default burst of one second's worth. `fixed-local` has it in every
/// process (P × 100 a second for the fleet), `fixed-redis` once for the
/// fleet.
pub const FIXED_RATE: f64 = 100.0;

/// How long one HTTP attempt (connection, answer and body) may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long building the Redis backend may take.
const REDIS_TIMEOUT: Duration = Duration::from_secs(10);
/// A worker still running this long after its deadline ends itself.
const WATCHDOG_GRACE: Duration = Duration::from_secs(30);
/// The worker's errors printed in full; the rest are counted.
const ERRORS_SHOWN: u32 = 5;

/// The environment variable that makes the binary a worker, holding the
/// strategy's name; the rest of [`Settings`] travels in `PACELINE_OUTBOUND_*`.
pub const WORKER_ENV: &str = "PACELINE_OUTBOUND_WORKER";

/// What the parent tells a worker.
#[derive(Debug, Clone)]
pub struct Settings {
    pub strategy: String,
    /// `http://127.0.0.1:PORT` of the upstream.
    pub upstream: String,
    /// `redis://127.0.0.1:PORT/`.
    pub redis: String,
    /// The Redis-shared limiters' name (a fresh one per strategy).
    pub key: String,
    /// The common start, in microseconds since the Unix epoch: every
    /// worker starts its tasks then, and every time it reports is since.
    pub start_us: u64,
    pub secs: f64,
    pub tasks: usize,
    /// Which worker this is, from 0, and how many there are.
    pub index: usize,
    pub procs: usize,
}

impl Settings {
    /// Sets the worker's environment on `command`.
    pub fn apply(&self, command: &mut Command) {
        command
            .env(WORKER_ENV, &self.strategy)
            .env("PACELINE_OUTBOUND_UPSTREAM", &self.upstream)
            .env("PACELINE_OUTBOUND_REDIS", &self.redis)
            .env("PACELINE_OUTBOUND_KEY", &self.key)
            .env("PACELINE_OUTBOUND_START_US", self.start_us.to_string())
            .env("PACELINE_OUTBOUND_SECS", self.secs.to_string())
            .env("PACELINE_OUTBOUND_TASKS", self.tasks.to_string())
            .env("PACELINE_OUTBOUND_INDEX", self.index.to_string())
            .env("PACELINE_OUTBOUND_PROCS", self.procs.to_string());
    }

    fn from_env(strategy: String) -> Result<Settings, String> {
        fn var(name: &str) -> Result<String, String> {
            std::env::var(name).map_err(|_| format!("{name} is not set"))
        }
        fn number<T: std::str::FromStr>(name: &str) -> Result<T, String> {
            let value = var(name)?;
            value
                .parse()
                .map_err(|_| format!("{name}: cannot read {value:?}"))
        }
        Ok(Settings {
            strategy,
            upstream: var("PACELINE_OUTBOUND_UPSTREAM")?,
            redis: var("PACELINE_OUTBOUND_REDIS")?,
            key: var("PACELINE_OUTBOUND_KEY")?,
            start_us: number("PACELINE_OUTBOUND_START_US")?,
            secs: number("PACELINE_OUTBOUND_SECS")?,
            tasks: number("PACELINE_OUTBOUND_TASKS")?,
            index: number("PACELINE_OUTBOUND_INDEX")?,
            procs: number("PACELINE_OUTBOUND_PROCS")?,
        })
    }
}

/// Microseconds since the Unix epoch.
pub fn epoch_us() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
}

/// The worker's `main`: runs the strategy named `strategy` with the
/// settings in the environment, prints its records, and says why it
/// failed if it did.
pub fn main(strategy: String) -> ExitCode {
    let settings = match Settings::from_env(strategy.clone()) {
        Ok(settings) => settings,
        Err(why) => {
            eprintln!("outbound worker {strategy}: {why}");
            return ExitCode::FAILURE;
        }
    };
    let who = format!("outbound worker {strategy} #{}", settings.index);
    // However it goes, a worker does not outlive its run by much.
    let life = Duration::from_micros(settings.start_us.saturating_sub(epoch_us()))
        + Duration::from_secs_f64(settings.secs)
        + WATCHDOG_GRACE;
    let watchdog_who = who.clone();
    std::thread::spawn(move || {
        std::thread::sleep(life);
        eprintln!("{watchdog_who}: still running {WATCHDOG_GRACE:?} after its deadline; exiting");
        std::process::exit(3);
    });
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("{who}: cannot start a runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let worker = runtime.block_on(Worker::new(settings, who.clone()));
    let records = Arc::clone(&worker.records);
    let result = match STRATEGIES
        .iter()
        .find(|s| s.name == worker.settings.strategy)
    {
        Some(strategy) => runtime.block_on((strategy.run)(worker)),
        None => Err(format!("no strategy named {strategy:?}")),
    };
    drop(runtime);
    let records = std::mem::take(&mut *records.lock().unwrap_or_else(|e| e.into_inner()));
    let mut out = String::with_capacity(records.len() * 48);
    for record in &records {
        record.write(&mut out);
    }
    // Not print!: a parent gone away must not turn into a panic here.
    if let Err(error) = std::io::Write::write_all(&mut std::io::stdout().lock(), out.as_bytes()) {
        eprintln!("{who}: cannot report its calls: {error}");
        return ExitCode::FAILURE;
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(why) => {
            eprintln!("{who}: {why}");
            ExitCode::FAILURE
        }
    }
}

// The strategies.

/// No limiter: every task calls as fast as the answers come; on a 429 it
/// sleeps what `Retry-After` says and tries again.
async fn none_worker(worker: Worker) -> Result<(), String> {
    worker
        .run(|call| async move { retry_after_429(&call, None).await })
        .await
}

/// A limiter in each process at [`FIXED_RATE`]; on a 429, sleep
/// `Retry-After` and try again (through the limiter again).
async fn fixed_local_worker(worker: Worker) -> Result<(), String> {
    let limiter: Arc<dyn Limiter> = Arc::new(
        RateLimiter::builder()
            .limit(Limit::per_second(FIXED_RATE))
            .build()
            .map_err(|e| format!("cannot build the limiter: {e}"))?,
    );
    worker
        .run(move |call| {
            let limiter = Arc::clone(&limiter);
            async move { retry_after_429(&call, Some(&*limiter)).await }
        })
        .await
}

/// One limiter for the fleet, shared through Redis, at [`FIXED_RATE`]; on
/// a 429, sleep `Retry-After` and try again.
async fn fixed_redis_worker(worker: Worker) -> Result<(), String> {
    let backend = worker.redis().await?;
    let limiter = Arc::new(
        RateLimiter::builder()
            .limit(Limit::per_second(FIXED_RATE))
            .redis(&backend, &worker.settings.key)
            .local_fraction(1.0 / worker.settings.procs as f64)
            .build()
            .map_err(|e| format!("cannot build the limiter: {e}"))?,
    );
    let shared: Arc<dyn Limiter> = limiter.clone();
    let result = worker
        .run(move |call| {
            let limiter = Arc::clone(&shared);
            async move { retry_after_429(&call, Some(&*limiter)).await }
        })
        .await;
    worker.check_fallback(&limiter.stats());
    result
}

/// The learned limiter: the fleet's one limiter through Redis, at twice
/// both of the upstream's limits (requests and tokens, named as the
/// upstream names them), each call reserved at an estimate of
/// [`ESTIMATED_TOKENS`], fed its answer (429s and the rate-limit headers
/// teach the fleet the upstream's rates) and settled at the tokens
/// `X-Usage-Tokens` reports. A refused call comes back through the
/// limiter, which paces it: no sleep of its own.
async fn learned_worker(worker: Worker) -> Result<(), String> {
    let backend = worker.redis().await?;
    let limiter = Arc::new(
        RateLimiter::builder()
            .limit(Limit::per_second(FIXED_RATE).named("requests"))
            .limit(Limit::per_second(FIXED_TOKENS).named("tokens"))
            .redis(&backend, &worker.settings.key)
            .local_fraction(1.0 / worker.settings.procs as f64)
            .build()
            .map_err(|e| format!("cannot build the limiter: {e}"))?,
    );
    let shared = Arc::clone(&limiter);
    let result = worker
        .run(move |call| {
            let limiter = Arc::clone(&shared);
            async move { learned_call(&call, &limiter).await }
        })
        .await;
    worker.check_fallback(&limiter.stats());
    result
}

/// What the learned limiter estimates a call at: the mean of the
/// upstream's 20 to 120 tokens.
const ESTIMATED_TOKENS: u32 = 70;

/// Twice the upstream's 3 000 tokens a second.
const FIXED_TOKENS: f64 = 6_000.0;

/// One logical call through the learned limiter.
async fn learned_call(call: &Call, limiter: &RateLimiter<Redis>) -> Result<Answer, Stop> {
    loop {
        let estimate = Cost::each([1, ESTIMATED_TOKENS]);
        let paced =
            match tokio::time::timeout_at(call.deadline.into(), limiter.call(estimate)).await {
                Ok(Ok(paced)) => paced,
                Ok(Err(error)) => return Err(Stop::Failed(format!("the limiter: {error}"))),
                Err(_) => return Err(Stop::Deadline),
            };
        let answer = call.attempt().await?;
        let headers = answer
            .headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_bytes()));
        let feedback = Feedback::from_headers(answer.status.as_u16(), headers, SystemTime::now());
        paced.learn(&feedback);
        let tokens = u32::try_from(answer.tokens.unwrap_or(0)).unwrap_or(u32::MAX);
        paced
            .settle(Cost::each([1, tokens]))
            .map_err(|error| Stop::Failed(format!("the limiter: {error}")))?;
        if answer.status != StatusCode::TOO_MANY_REQUESTS {
            return Ok(answer);
        }
    }
}

/// One logical call as users write it today: take a permit from `limiter`
/// (if any), call; on a 429, sleep what `Retry-After` says (1 s if it
/// says nothing) and start again. Any other answer is final.
async fn retry_after_429(call: &Call, limiter: Option<&dyn Limiter>) -> Result<Answer, Stop> {
    loop {
        if let Some(limiter) = limiter {
            call.acquire(limiter, 1).await?;
        }
        let answer = call.attempt().await?;
        if answer.status != StatusCode::TOO_MANY_REQUESTS {
            return Ok(answer);
        }
        call.wait(answer.retry_after().unwrap_or(Duration::from_secs(1)))
            .await?;
    }
}

// The machinery the strategies share.

/// hyper's HTTP/1.1 client.
type Client = HttpClient<HttpConnector, Full<Bytes>>;

/// Why a logical call ended without a final answer.
#[derive(Debug)]
pub enum Stop {
    /// The run's deadline came first.
    Deadline,
    /// An attempt failed (no answer in time, a broken connection) or the
    /// limiter did.
    Failed(String),
}

/// An answer from the upstream.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    /// `X-Usage-Tokens`, on a 200.
    pub tokens: Option<u64>,
}

impl Answer {
    /// `Retry-After` in whole seconds, as the upstream sends it.
    pub fn retry_after(&self) -> Option<Duration> {
        let value = self.headers.get(RETRY_AFTER)?.to_str().ok()?;
        value.trim().parse().ok().map(Duration::from_secs)
    }
}

/// One logical call in progress: its attempts, and the waits between them,
/// none of which goes past the run's deadline.
#[derive(Clone)]
pub struct Call {
    client: Client,
    url: Arc<str>,
    deadline: Instant,
    attempts: Arc<AtomicU32>,
    last_status: Arc<AtomicU16>,
}

impl Call {
    /// One attempt: `POST /v1/complete`, within [`CALL_TIMEOUT`]. Refused
    /// ([`Stop::Deadline`]) once the deadline has passed.
    pub async fn attempt(&self) -> Result<Answer, Stop> {
        if Instant::now() >= self.deadline {
            return Err(Stop::Deadline);
        }
        self.attempts.fetch_add(1, Ordering::Relaxed);
        let request = Request::post(&*self.url)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(b"{\"prompt\":\"hello\"}")))
            .map_err(|e| Stop::Failed(format!("cannot build the request: {e}")))?;
        let exchange = async {
            let response = self.client.request(request).await.map_err(|e| causes(&e))?;
            let (parts, body) = response.into_parts();
            body.collect().await.map_err(|e| causes(&e))?;
            Ok::<_, String>(parts)
        };
        let parts = match tokio::time::timeout(CALL_TIMEOUT, exchange).await {
            Ok(Ok(parts)) => parts,
            Ok(Err(why)) => return Err(Stop::Failed(format!("POST {}: {why}", self.url))),
            Err(_) => {
                return Err(Stop::Failed(format!(
                    "POST {}: no answer within {CALL_TIMEOUT:?}",
                    self.url
                )));
            }
        };
        self.last_status
            .store(parts.status.as_u16(), Ordering::Relaxed);
        let tokens = parts
            .headers
            .get("x-usage-tokens")
            .and_then(|v| v.to_str().ok()?.parse().ok());
        Ok(Answer {
            status: parts.status,
            headers: parts.headers,
            tokens,
        })
    }

    /// Sleeps `wait`, or until the deadline and then [`Stop::Deadline`].
    pub async fn wait(&self, wait: Duration) -> Result<(), Stop> {
        let until = Instant::now() + wait;
        if until >= self.deadline {
            tokio::time::sleep_until(self.deadline.into()).await;
            return Err(Stop::Deadline);
        }
        tokio::time::sleep_until(until.into()).await;
        Ok(())
    }

    /// `limiter.acquire(permits)`, given up at the deadline.
    pub async fn acquire(&self, limiter: &dyn Limiter, permits: u32) -> Result<(), Stop> {
        match tokio::time::timeout_at(self.deadline.into(), limiter.acquire(permits)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(Stop::Failed(format!("the limiter: {error}"))),
            Err(_) => Err(Stop::Deadline),
        }
    }
}

/// An error with its sources (hyper's say little on their own: "client
/// error (Connect)").
fn causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// One worker process: its settings, its HTTP client, the run's start
/// and deadline, and the records of its calls.
pub struct Worker {
    pub settings: Settings,
    who: String,
    client: Client,
    url: Arc<str>,
    start: Instant,
    deadline: Instant,
    records: Arc<Mutex<Vec<Record>>>,
}

impl Worker {
    async fn new(settings: Settings, who: String) -> Worker {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(CALL_TIMEOUT));
        connector.set_nodelay(true);
        let client = HttpClient::builder(TokioExecutor::new()).build(connector);
        // The common start as an Instant of this process.
        let (now_us, now) = (epoch_us(), Instant::now());
        let start = if settings.start_us >= now_us {
            now + Duration::from_micros(settings.start_us - now_us)
        } else {
            let late = Duration::from_micros(now_us - settings.start_us);
            now.checked_sub(late).unwrap_or(now)
        };
        let url = format!("{}/v1/complete", settings.upstream).into();
        Worker {
            deadline: start + Duration::from_secs_f64(settings.secs),
            settings,
            who,
            client,
            url,
            start,
            records: Arc::default(),
        }
    }

    /// A Redis backend on the parent's server, built within
    /// [`REDIS_TIMEOUT`].
    pub async fn redis(&self) -> Result<RedisBackend, String> {
        let client = RedisClient::open(self.settings.redis.as_str())
            .map_err(|e| format!("{}: {e}", self.settings.redis))?;
        let building = RedisBackend::builder(client).build();
        match tokio::time::timeout(REDIS_TIMEOUT, building).await {
            Ok(Ok(backend)) => Ok(backend),
            Ok(Err(error)) => Err(format!("Redis at {}: {error}", self.settings.redis)),
            Err(_) => Err(format!(
                "Redis at {}: no backend within {REDIS_TIMEOUT:?}",
                self.settings.redis
            )),
        }
    }

    /// Says so if a Redis limiter served calls from its fallback: the
    /// fleet did not share one limit all along.
    pub fn check_fallback(&self, stats: &paceline::Stats) {
        if stats.fallbacks > 0 || stats.fallback_calls > 0 {
            eprintln!(
                "{}: Redis was unavailable {} time(s); its fallback served {} calls",
                self.who, stats.fallbacks, stats.fallback_calls
            );
        }
    }

    /// Waits for the common start, then runs the tasks: each makes one
    /// logical call after another with `call` until the deadline, and
    /// records each.
    pub async fn run<F, Fut>(&self, call: F) -> Result<(), String>
    where
        F: Fn(Call) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Answer, Stop>> + Send + 'static,
    {
        let late = Instant::now().saturating_duration_since(self.start);
        if late > Duration::from_millis(100) {
            eprintln!("{}: ready {late:?} after the common start", self.who);
        }
        tokio::time::sleep_until(self.start.into()).await;
        let call = Arc::new(call);
        let errors = Arc::new(AtomicU32::new(0));
        let mut tasks = Vec::with_capacity(self.settings.tasks);
        for _ in 0..self.settings.tasks {
            let call = Arc::clone(&call);
            let errors = Arc::clone(&errors);
            let records = Arc::clone(&self.records);
            let (client, url, deadline) =
                (self.client.clone(), Arc::clone(&self.url), self.deadline);
            let who = self.who.clone();
            let start = self.start;
            tasks.push(tokio::spawn(async move {
                let mut mine = Vec::new();
                while Instant::now() < deadline {
                    let this = Call {
                        client: client.clone(),
                        url: Arc::clone(&url),
                        deadline,
                        attempts: Arc::default(),
                        last_status: Arc::default(),
                    };
                    let began = Instant::now();
                    let result = call(this.clone()).await;
                    let ended = Instant::now();
                    let (outcome, tokens) = match result {
                        Ok(answer) if answer.status == StatusCode::OK => {
                            (Outcome::Ok, answer.tokens.unwrap_or(0))
                        }
                        Ok(_) => (Outcome::Http, 0),
                        Err(Stop::Deadline) => (Outcome::Late, 0),
                        Err(Stop::Failed(why)) => {
                            if errors.fetch_add(1, Ordering::Relaxed) < ERRORS_SHOWN {
                                eprintln!("{who}: {why}");
                            }
                            (Outcome::Err, 0)
                        }
                    };
                    let micros = |at: Instant| {
                        let at = at.saturating_duration_since(start);
                        i64::try_from(at.as_micros()).unwrap_or(i64::MAX)
                    };
                    mine.push(Record {
                        start_us: micros(began),
                        end_us: micros(ended),
                        attempts: this.attempts.load(Ordering::Relaxed),
                        outcome,
                        status: this.last_status.load(Ordering::Relaxed),
                        tokens,
                    });
                    if outcome == Outcome::Err {
                        // A failing upstream or limiter is not hammered.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
                records
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend(mine);
            }));
        }
        for task in tasks {
            task.await.map_err(|e| format!("a task failed: {e}"))?;
        }
        let errors = errors.load(Ordering::Relaxed);
        if errors > ERRORS_SHOWN {
            eprintln!("{}: {errors} failed calls in all", self.who);
        }
        let overrun = Instant::now().saturating_duration_since(self.deadline);
        if overrun > Duration::from_secs(2) {
            eprintln!("{}: ended {overrun:?} after its deadline", self.who);
        }
        Ok(())
    }
}
