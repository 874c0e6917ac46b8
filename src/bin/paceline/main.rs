//! `paceline`: paces a shell pipeline. Copies stdin to stdout one record
//! (line) at a time at a rate, or runs a command per record; per key if
//! asked; shared with every other `paceline` (and library user) of the same
//! name through Redis if asked. See `paceline --help`.

mod units;

use std::collections::BinaryHeap;
use std::io::{self, IsTerminal, Read, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use paceline::{Error, KeyedLimiter, Limit, Limiter};
use tokio::sync::mpsc;

use units::{Rate, parse_duration, parse_rate};

const EXAMPLES: &str = "\
Examples:
  seq 100 | paceline 10/s                     ten lines a second, exactly 100 ms apart
  paceline 2/s --burst 5 < urls.txt           up to 5 at once after a pause, 2/s after
  paceline 10/s --limit 1000/h < jobs         10/s, and at most 1 000 in any hour
  paceline --bytes 1MiB/s < big.iso > copy    1 MiB/s of bytes
  paceline 5/s --key 1 < access.log           5 lines/s per value of the first field
  paceline 20/s --max-wait 2s < events        drop what would wait more than 2 s
  paceline 3/s -j 4 -- curl -sO {} < urls     a command per line, 3 starts/s, 4 at once
  paceline 20/s --redis redis://host/ --name crawler < urls
                                              one rate shared by every paceline of that name

Exit status: 0 done; 1 a command failed; 2 bad arguments; 3 a record was
late (--on-late fail); 4 the limiter failed (Redis unreachable, or down
with --on-down closed); 5 reading or writing failed.";

/// Paces stdin to stdout (or a command per record) at a rate: exact
/// spacing, bursts and warm-up, per key, across machines through Redis.
#[derive(Parser, Debug)]
#[command(name = "paceline", version, after_help = EXAMPLES)]
struct Args {
    /// The rate: 10/s, 600/min, 1000/h, 5/day (with --bytes, 5MiB/s). A
    /// second rate is another limit every record must also satisfy, as
    /// --limit.
    #[arg(value_name = "RATE", required = true, num_args = 1..)]
    rates: Vec<String>,

    /// Another limit every record must also satisfy. Limits after the
    /// first are quotas: each lets its whole period's worth go at once.
    #[arg(long = "limit", value_name = "RATE")]
    limits: Vec<String>,

    /// Pace bytes instead of records (the rate in bytes: 5MiB/s, 100KB/s).
    #[arg(long)]
    bytes: bool,

    /// Records end with NUL instead of newline.
    #[arg(short = '0', long = "null")]
    null: bool,

    /// How many records (bytes, with --bytes) may go at once after an idle
    /// spell. Default 1: exact spacing.
    #[arg(long, value_name = "N")]
    burst: Option<u64>,

    /// Start slow after an idle spell and reach the rate over this long
    /// (250ms, 2s, 1min) instead of a burst.
    #[arg(long, value_name = "D", value_parser = parse_duration, conflicts_with = "burst")]
    warmup: Option<Duration>,

    /// Pace each key separately: the key is whitespace field FIELD of the
    /// record (from 1).
    #[arg(long, value_name = "FIELD", conflicts_with = "key_regex")]
    key: Option<usize>,

    /// Pace each key separately: the key is the first group REGEX captures
    /// in the record (or its whole match).
    #[arg(long, value_name = "REGEX")]
    key_regex: Option<String>,

    /// The most keys held at once (least recently used first out).
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    max_keys: usize,

    /// A record that would wait longer than this is late (see --on-late).
    #[arg(long, value_name = "D", value_parser = parse_duration)]
    max_wait: Option<Duration>,

    /// What to do with a late record: drop it (counted), or fail (exit 3).
    #[arg(long, value_enum, value_name = "WHAT", default_value_t = OnLate::Drop)]
    on_late: OnLate,

    /// Run up to N commands at once (with -- CMD).
    #[arg(short = 'j', long, value_name = "N", default_value_t = 1)]
    jobs: usize,

    /// Share the rate through Redis at URL (redis://host:6379/) with every
    /// paceline and library user of the same --name.
    #[arg(long, value_name = "URL")]
    redis: Option<String>,

    /// The shared limiter's name in Redis.
    #[arg(
        long,
        value_name = "NAME",
        default_value = "paceline-cli",
        requires = "redis"
    )]
    name: String,

    /// While Redis is down: pace locally, let everything through, or fail.
    #[arg(long, value_enum, value_name = "WHAT", default_value_t = OnDown::Local, requires = "redis")]
    on_down: OnDown,

    /// The share of the rate this process may use on its own while Redis
    /// is down (1/N when N processes share it).
    #[arg(long, value_name = "F", default_value_t = 1.0, requires = "redis")]
    local_fraction: f64,

    /// Print a JSON summary to stderr at the end.
    #[arg(long)]
    json: bool,

    /// No progress line, even on a terminal.
    #[arg(short, long)]
    quiet: bool,

    /// Run CMD for each record instead of printing it: `{}` in its
    /// arguments is the record; with no `{}`, the record is its stdin.
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OnLate {
    Drop,
    Fail,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OnDown {
    Local,
    Open,
    Closed,
}

/// Why the run stopped early, as an exit status.
#[derive(Debug)]
enum Failure {
    Usage(String),
    Late,
    Limiter(String),
    Io(io::Error),
}

impl Failure {
    fn code(&self) -> u8 {
        match self {
            Failure::Usage(_) => 2,
            Failure::Late => 3,
            Failure::Limiter(_) => 4,
            Failure::Io(_) => 5,
        }
    }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        Failure::Limiter(error.to_string())
    }
}

impl From<io::Error> for Failure {
    fn from(error: io::Error) -> Self {
        Failure::Io(error)
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let counts = Arc::new(Counts::default());
    let result = match validate(&args).map(|()| plain(&args)) {
        Err(failure) => Err(failure),
        Ok(plain) => match plain {
            // A plain copy in this process needs no runtime: it starts as
            // fast as `cat`.
            true if args.redis.is_none() => copy_locally(&args, &counts),
            _ => match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime.block_on(run(&args, Arc::clone(&counts))),
                Err(error) => Err(Failure::Io(error)),
            },
        },
    };
    counts.finish(&args);
    match result {
        Ok(failed_commands) if failed_commands > 0 => ExitCode::from(1),
        Ok(_) => ExitCode::SUCCESS,
        Err(failure) => {
            match &failure {
                Failure::Usage(why) | Failure::Limiter(why) => eprintln!("paceline: {why}"),
                Failure::Late => eprintln!(
                    "paceline: a record would have waited more than --max-wait (--on-late fail)"
                ),
                Failure::Io(error) => eprintln!("paceline: {error}"),
            }
            ExitCode::from(failure.code())
        }
    }
}

/// What the run did, for the progress line and the summary.
#[derive(Default)]
struct Counts {
    records: AtomicU64,
    bytes: AtomicU64,
    waited: AtomicU64,
    dropped: AtomicU64,
    commands: AtomicU64,
    failed: AtomicU64,
    started: std::sync::OnceLock<Instant>,
}

impl Counts {
    fn elapsed(&self) -> f64 {
        self.started
            .get()
            .map_or(0.0, |started| started.elapsed().as_secs_f64())
    }

    fn line(&self) -> String {
        let records = self.records.load(Ordering::Relaxed);
        let seconds = self.elapsed();
        let rate = if seconds > 0.0 {
            records as f64 / seconds
        } else {
            0.0
        };
        format!(
            "{records} records, {} bytes, {rate:.1}/s, {} waited, {} dropped",
            self.bytes.load(Ordering::Relaxed),
            self.waited.load(Ordering::Relaxed),
            self.dropped.load(Ordering::Relaxed),
        )
    }

    fn finish(&self, args: &Args) {
        if progress_shown(args) {
            eprintln!("\r{}", self.line());
        }
        if args.json {
            let seconds = self.elapsed();
            let records = self.records.load(Ordering::Relaxed);
            eprintln!(
                "{{\"records\":{records},\"bytes\":{},\"seconds\":{seconds:.6},\"rate\":{:.3},\"waited\":{},\"dropped\":{},\"commands\":{},\"failed\":{}}}",
                self.bytes.load(Ordering::Relaxed),
                if seconds > 0.0 {
                    records as f64 / seconds
                } else {
                    0.0
                },
                self.waited.load(Ordering::Relaxed),
                self.dropped.load(Ordering::Relaxed),
                self.commands.load(Ordering::Relaxed),
                self.failed.load(Ordering::Relaxed),
            );
        }
    }
}

fn progress_shown(args: &Args) -> bool {
    !args.quiet && io::stderr().is_terminal()
}

/// The limiter: one rate, or one per key; here or through Redis.
enum Pacer {
    One(Arc<dyn Limiter>),
    Keyed(Arc<dyn KeyedLimiter<String>>),
}

impl Pacer {
    /// Reserves `permits` (of `key`): the wait, or `None` if it would
    /// exceed `max_wait` (nothing reserved).
    async fn reserve(
        &self,
        key: Option<String>,
        permits: u32,
        max_wait: Option<Duration>,
    ) -> Result<Option<Duration>, Error> {
        match self {
            Pacer::One(limiter) => match max_wait {
                None => limiter.reserve(permits).await.map(Some),
                Some(max) => limiter.try_reserve(permits, max).await,
            },
            Pacer::Keyed(limiter) => {
                let key = key.unwrap_or_default();
                match max_wait {
                    None => limiter.reserve(&key, permits).await.map(Some),
                    Some(max) => limiter.try_reserve(&key, permits, max).await,
                }
            }
        }
    }
}

/// The limits the arguments describe: the first paces (burst `--burst`,
/// default none, or `--warmup`), the others are quotas (their whole period
/// as burst).
fn limits(args: &Args) -> Result<(Vec<Limit>, f64), Failure> {
    let rates: Vec<Rate> = args
        .rates
        .iter()
        .chain(&args.limits)
        .map(|text| parse_rate(text, args.bytes))
        .collect::<Result<_, _>>()
        .map_err(Failure::Usage)?;
    let slowest = rates
        .iter()
        .map(Rate::per_second)
        .fold(f64::INFINITY, f64::min);
    let limits = rates
        .iter()
        .enumerate()
        .map(|(i, rate)| {
            let limit = Limit::per(rate.permits, rate.period);
            match (i, args.warmup) {
                (0, Some(warmup)) => limit.warmup(warmup),
                (0, None) => limit.burst(args.burst.unwrap_or(1)),
                _ => limit,
            }
        })
        .collect();
    Ok((limits, slowest))
}

async fn pacer(args: &Args, limits: Vec<Limit>, keyed: bool) -> Result<Pacer, Failure> {
    let Some(url) = &args.redis else {
        return Ok(if keyed {
            let mut builder =
                paceline::KeyedBuilder::<String, _>::with_clock(StdClock(Instant::now()))
                    .max_keys(args.max_keys);
            for limit in limits {
                builder = builder.limit(limit);
            }
            Pacer::Keyed(Arc::new(builder.build().map_err(usage)?))
        } else {
            let mut builder = paceline::Builder::with_clock(StdClock(Instant::now()));
            for limit in limits {
                builder = builder.limit(limit);
            }
            Pacer::One(Arc::new(builder.build().map_err(usage)?))
        });
    };
    use paceline::redis::{Client, Fallback, RedisBackend};
    let client = Client::open(url.as_str())
        .map_err(|e| Failure::Usage(format!("bad Redis URL {url:?}: {e}")))?;
    let backend = RedisBackend::builder(client)
        .require_connection(true)
        .build()
        .await
        .map_err(|e| Failure::Limiter(format!("cannot reach Redis at {url}: {e}")))?;
    let fallback = match args.on_down {
        OnDown::Local => Fallback::Local,
        OnDown::Open => Fallback::FailOpen,
        OnDown::Closed => Fallback::FailClosed,
    };
    Ok(if keyed {
        let mut builder = backend
            .keyed_limiter::<String>(&args.name)
            .fallback(fallback)
            .local_fraction(args.local_fraction)
            .max_local_keys(args.max_keys);
        for limit in limits {
            builder = builder.limit(limit);
        }
        Pacer::Keyed(Arc::new(builder.build().map_err(usage)?))
    } else {
        let mut builder = backend
            .limiter(&args.name)
            .fallback(fallback)
            .local_fraction(args.local_fraction);
        for limit in limits {
            builder = builder.limit(limit);
        }
        Pacer::One(Arc::new(builder.build().map_err(usage)?))
    })
}

fn usage(error: Error) -> Failure {
    Failure::Usage(error.to_string())
}

/// How a record's key is found.
enum KeyOf {
    Field(usize),
    Regex(regex::bytes::Regex),
}

impl KeyOf {
    fn key(&self, record: &[u8]) -> String {
        let key: &[u8] = match self {
            KeyOf::Field(n) => record
                .split(|b| b.is_ascii_whitespace())
                .filter(|field| !field.is_empty())
                .nth(n - 1)
                .unwrap_or(b""),
            KeyOf::Regex(regex) => regex
                .captures(record)
                .and_then(|c| c.get(1).or_else(|| c.get(0)))
                .map_or(&b""[..], |m| m.as_bytes()),
        };
        String::from_utf8_lossy(key).into_owned()
    }
}

/// Checks what clap cannot: the arguments that depend on each other.
fn validate(args: &Args) -> Result<(), Failure> {
    if args.key == Some(0) {
        return Err(Failure::Usage("--key fields count from 1".to_owned()));
    }
    if args.jobs == 0 {
        return Err(Failure::Usage("-j must be at least 1".to_owned()));
    }
    if args.max_keys == 0 {
        return Err(Failure::Usage("--max-keys must be at least 1".to_owned()));
    }
    let keyed = args.key.is_some() || args.key_regex.is_some();
    if args.bytes && (keyed || !args.command.is_empty()) {
        return Err(Failure::Usage(
            "--bytes paces a byte stream: it takes no --key and no command".to_owned(),
        ));
    }
    if let Some(regex) = &args.key_regex {
        regex::bytes::Regex::new(regex)
            .map_err(|e| Failure::Usage(format!("bad --key-regex: {e}")))?;
    }
    limits(args).map(|_| ())
}

/// Whether records are simply copied, in order: no key, no bound on the
/// wait, no command.
fn plain(args: &Args) -> bool {
    args.key.is_none()
        && args.key_regex.is_none()
        && args.max_wait.is_none()
        && args.command.is_empty()
}

/// The clock of the command line's local limiters: the standard library's
/// monotonic clock, which needs no calibration at start (a pipeline
/// stage starts often and copies little).
#[derive(Debug, Clone, Copy)]
struct StdClock(Instant);

impl paceline::clock::Clock for StdClock {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }

    fn sleep_blocking(&self, duration: Duration) {
        std::thread::sleep(duration);
    }

    fn sleep(&self, duration: Duration) -> paceline::clock::Sleep {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// A plain copy on a limiter in this process, with no async runtime.
fn copy_locally(args: &Args, counts: &Arc<Counts>) -> Result<u64, Failure> {
    let (limits, slowest) = limits(args)?;
    let mut builder = paceline::Builder::with_clock(StdClock(Instant::now()));
    for limit in limits {
        builder = builder.limit(limit);
    }
    let limiter = builder.build().map_err(usage)?;
    let _ = counts.started.set(Instant::now());
    let _progress = Progress::start(args, counts);
    let separator = if args.null { 0 } else { b'\n' };
    copy(
        args,
        |permits| Ok(limiter.reserve(permits)?),
        slowest,
        separator,
        counts,
    )
}

/// The progress line on stderr, redrawn four times a second while it
/// lives.
struct Progress(Option<Arc<std::sync::atomic::AtomicBool>>);

impl Progress {
    fn start(args: &Args, counts: &Arc<Counts>) -> Progress {
        if !progress_shown(args) {
            return Progress(None);
        }
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (counts, stop) = (Arc::clone(counts), Arc::clone(&done));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                eprint!("\r{}", counts.line());
                std::thread::sleep(Duration::from_millis(250));
            }
        });
        Progress(Some(done))
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(done) = &self.0 {
            done.store(true, Ordering::Relaxed);
        }
    }
}

async fn run(args: &Args, counts: Arc<Counts>) -> Result<u64, Failure> {
    let key_of = match (args.key, &args.key_regex) {
        (Some(field), _) => Some(KeyOf::Field(field)),
        (None, Some(regex)) => Some(KeyOf::Regex(
            regex::bytes::Regex::new(regex)
                .map_err(|e| Failure::Usage(format!("bad --key-regex: {e}")))?,
        )),
        (None, None) => None,
    };
    let (limits, slowest) = limits(args)?;
    let pacer = pacer(args, limits, key_of.is_some()).await?;
    let separator = if args.null { 0 } else { b'\n' };
    let _ = counts.started.set(Instant::now());
    let _progress = Progress::start(args, &counts);
    if plain(args) {
        let runtime = tokio::runtime::Handle::current();
        let reserve = |permits| {
            let wait = runtime.block_on(pacer.reserve(None, permits, None))?;
            Ok(wait.unwrap_or_default())
        };
        tokio::task::block_in_place(|| copy(args, reserve, slowest, separator, &counts))
    } else {
        let (chunks, receiving) = mpsc::channel(2);
        let split = (!args.bytes).then_some(separator);
        std::thread::spawn(move || read_stdin(chunks, split));
        schedule(args, &pacer, key_of, separator, receiving, &counts).await
    }
}

/// A chunk of stdin: `buf[..len]`, whole records (or bytes as read). Its
/// buffer goes back to the reader when it is dropped.
struct Chunk {
    buf: Vec<u8>,
    len: usize,
    pool: std::sync::mpsc::Sender<Vec<u8>>,
}

impl Chunk {
    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        let _ = self.pool.send(std::mem::take(&mut self.buf));
    }
}

/// The size of a read.
const READ_SIZE: usize = 128 * 1024;

/// A page: where reads start.
const PAGE: usize = 4096;

/// Standard input and output as files: read and written directly, with
/// no buffering of their own.
fn std_file(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<std::fs::File> {
    Ok(std::fs::File::from(fd.try_clone_to_owned()?))
}

/// Reads stdin into chunks of whole records (`separator`; `None`: bytes,
/// as read), each sent as soon as it is read; the last record needs no
/// separator. Buffers come back through a pool, so that nothing is
/// allocated or cleared per read.
fn read_stdin(chunks: mpsc::Sender<io::Result<Chunk>>, separator: Option<u8>) {
    use std::os::fd::AsFd;
    let mut stdin = match std_file(io::stdin().as_fd()) {
        Ok(file) => file,
        Err(error) => {
            let _ = chunks.blocking_send(Err(error));
            return;
        }
    };
    let (pool, returned) = std::sync::mpsc::channel::<Vec<u8>>();
    // Bytes of a record begun in the previous read, carried to the next.
    let mut carried: Vec<u8> = Vec::new();
    loop {
        let mut buf = returned.try_recv().unwrap_or_else(|_| vec![0u8; READ_SIZE]);
        // A record longer than a buffer: room for it and a read more.
        if buf.len() < carried.len() + READ_SIZE / 2 {
            buf.resize(carried.len() + READ_SIZE, 0);
        }
        buf[..carried.len()].copy_from_slice(&carried);
        let start = carried.len();
        let read = loop {
            match stdin.read(&mut buf[start..]) {
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                other => break other,
            }
        };
        let read = match read {
            Ok(0) => break,
            Ok(read) => read,
            Err(error) => {
                let _ = chunks.blocking_send(Err(error));
                return;
            }
        };
        let filled = start + read;
        let len = match separator {
            None => filled,
            Some(separator) => match buf[start..filled].iter().rposition(|b| *b == separator) {
                Some(end) => start + end + 1,
                None => 0,
            },
        };
        carried.clear();
        carried.extend_from_slice(&buf[len..filled]);
        if len == 0 {
            let _ = pool.send(buf);
            continue;
        }
        let chunk = Chunk {
            buf,
            len,
            pool: pool.clone(),
        };
        if chunks.blocking_send(Ok(chunk)).is_err() {
            return;
        }
    }
    if !carried.is_empty() {
        let len = carried.len();
        let _ = chunks.blocking_send(Ok(Chunk {
            buf: carried,
            len,
            pool,
        }));
    }
}

/// Standard output, written directly (through `BufWriter`s of the
/// callers').
fn stdout_file() -> io::Result<std::fs::File> {
    use std::os::fd::AsFd;
    std_file(io::stdout().as_fd())
}

/// Whether a write failed because the reader went away (`| head`): the end
/// of the run, not a failure.
fn reader_gone(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::BrokenPipe
}

/// Copies records (or bytes) to stdout, paced, in groups of at most a
/// millisecond's worth at the slowest rate: exact spacing at any rate a
/// timer can keep, and the throughput of a plain copy at rates it never
/// reaches. Runs on the calling thread, as `cat` does: a read, the groups
/// it holds, each reserved (and slept for) then written, a write.
fn copy(
    args: &Args,
    mut reserve: impl FnMut(u32) -> Result<Duration, Failure>,
    slowest: f64,
    separator: u8,
    counts: &Counts,
) -> Result<u64, Failure> {
    use std::os::fd::AsFd;
    let group = (slowest / 1000.0).floor().clamp(1.0, f64::from(u32::MAX)) as usize;
    let mut stdin = std_file(io::stdin().as_fd())?;
    let mut out = io::BufWriter::with_capacity(64 * 1024, stdout_file()?);
    // Every read asks for whole pages into a page boundary, so a file's
    // offsets stay page-aligned too: the kernel then copies whole pages,
    // several times faster than into (or out of) the middle of one.
    let mut window = Window::new(PAGE);
    let result = (|| {
        loop {
            let read = match window.fill(&mut stdin) {
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                other => other?,
            };
            let carried = window.carried;
            let buf = window.bytes();
            let filled = buf.len();
            // Whole records only, but for the last at the end of input.
            let len = match (args.bytes, read) {
                (true, _) | (false, 0) => filled,
                (false, _) => buf[carried..filled]
                    .iter()
                    .rposition(|b| *b == separator)
                    .map_or(0, |end| carried + end + 1),
            };
            let mut rest = &buf[..len];
            while !rest.is_empty() {
                // The next group: `group` bytes, or `group` records.
                let (end, permits) = if args.bytes {
                    let end = rest.len().min(group);
                    (end, end)
                } else if group >= rest.len() {
                    // No more records than bytes: all of them, counted.
                    let records = count(rest, separator);
                    let records = records + usize::from(rest[rest.len() - 1] != separator);
                    (rest.len(), records)
                } else {
                    let mut records = 0;
                    let mut end = rest.len();
                    for (at, byte) in rest.iter().enumerate() {
                        if *byte == separator {
                            records += 1;
                            if records == group {
                                end = at + 1;
                                break;
                            }
                        }
                    }
                    let last = usize::from(end == rest.len() && rest[end - 1] != separator);
                    (end, records + last)
                };
                let wait = reserve(permits as u32)?;
                if !wait.is_zero() {
                    let due = Instant::now() + wait;
                    out.flush()?;
                    counts.waited.fetch_add(permits as u64, Ordering::Relaxed);
                    wait_until(due);
                }
                if end >= 32 * 1024 {
                    // Large: straight to stdout, not through the buffer.
                    out.flush()?;
                    out.get_mut().write_all(&rest[..end])?;
                } else {
                    out.write_all(&rest[..end])?;
                }
                let records = if args.bytes { 0 } else { permits as u64 };
                counts.records.fetch_add(records, Ordering::Relaxed);
                counts.bytes.fetch_add(end as u64, Ordering::Relaxed);
                rest = &rest[end..];
            }
            // What was written goes out before the next read may block.
            out.flush()?;
            if read == 0 {
                return Ok(0);
            }
            window.keep_from(len);
        }
    })();
    match result {
        Err(Failure::Io(error)) if reader_gone(&error) => Ok(0),
        other => other,
    }
}

/// A sleep ends some 50 µs after it was due (the system's timer slack), so
/// a wait shorter than this is spun instead: at rates of millions of records
/// a second the waits are microseconds, and each sleep would lose several
/// times its length.
const SPIN_BELOW: Duration = Duration::from_micros(100);

/// Returns at `due`, not before.
fn wait_until(due: Instant) {
    let now = Instant::now();
    let wait = due.saturating_duration_since(now);
    if wait >= SPIN_BELOW {
        std::thread::sleep(wait);
    }
    while Instant::now() < due {
        std::hint::spin_loop();
    }
}

/// The reading buffer of [`copy`]: a page-aligned place for each read of
/// `READ_SIZE`, and in front of it room for the part of a record carried
/// over from the read before.
struct Window {
    storage: Vec<u8>,
    /// Where the read's place is: a page boundary, `front` bytes in.
    read_at: usize,
    /// The room in front of the read's place (whole pages).
    front: usize,
    /// The bytes carried over, just before the read's place.
    carried: usize,
    /// What the last read brought.
    read: usize,
}

impl Window {
    fn new(front: usize) -> Window {
        let storage = vec![0u8; PAGE + front + READ_SIZE];
        let base = storage.as_ptr().align_offset(PAGE).min(PAGE);
        Window {
            storage,
            read_at: base + front,
            front,
            carried: 0,
            read: 0,
        }
    }

    /// Reads once, after the carried bytes.
    fn fill(&mut self, input: &mut impl Read) -> io::Result<usize> {
        self.read = 0;
        self.read = input.read(&mut self.storage[self.read_at..self.read_at + READ_SIZE])?;
        Ok(self.read)
    }

    /// The carried bytes and what the last read brought.
    fn bytes(&self) -> &[u8] {
        &self.storage[self.read_at - self.carried..self.read_at + self.read]
    }

    /// Carries `bytes()[from..]` over to the next read, making more room
    /// in front if it is longer than the room there.
    fn keep_from(&mut self, from: usize) {
        let range = self.read_at - self.carried + from..self.read_at + self.read;
        let len = range.len();
        if len <= self.front {
            self.storage.copy_within(range, self.read_at - len);
        } else {
            let mut bigger = Window::new(len.next_multiple_of(PAGE));
            let to = bigger.read_at - len;
            bigger.storage[to..bigger.read_at].copy_from_slice(&self.storage[range]);
            *self = bigger;
        }
        self.carried = len;
        self.read = 0;
    }
}

/// How many times `byte` occurs in `bytes`, with the processor's vector
/// instructions.
fn count(bytes: &[u8], byte: u8) -> usize {
    bytecount::count(bytes, byte)
}

/// A record waiting for its moment.
struct Due {
    at: Instant,
    seq: u64,
    record: Vec<u8>,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Due {}

impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Due {
    /// The earliest first (the heap is a max-heap).
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// The most records waiting for their moment before input is held back.
const MAX_DUE: usize = 100_000;

/// Paces record by record: per key (records of other keys pass a key that
/// waits), with a bound on the wait, or starting a command per record.
/// Each record is reserved as it is read and released at its moment.
async fn schedule(
    args: &Args,
    pacer: &Pacer,
    key_of: Option<KeyOf>,
    separator: u8,
    mut receiving: mpsc::Receiver<io::Result<Chunk>>,
    counts: &Counts,
) -> Result<u64, Failure> {
    let mut due: BinaryHeap<Due> = BinaryHeap::new();
    let mut out = io::BufWriter::new(stdout_file()?);
    let mut commands = Commands::new(args);
    let mut seq = 0u64;
    let mut input_open = true;
    let result = async {
        loop {
            // Release what is due.
            let now = Instant::now();
            while due.peek().is_some_and(|d| d.at <= now) {
                let Due { record, .. } = due.pop().expect("peeked");
                counts.records.fetch_add(1, Ordering::Relaxed);
                counts.bytes.fetch_add(record.len() as u64, Ordering::Relaxed);
                if let Some(commands) = &mut commands {
                    out.flush()?;
                    commands.start(record, separator, counts).await;
                } else {
                    out.write_all(&record)?;
                }
            }
            out.flush()?;
            if !input_open && due.is_empty() {
                break;
            }
            let next = due.peek().map(|d| d.at);
            tokio::select! {
                chunk = receiving.recv(), if input_open && due.len() < MAX_DUE => {
                    let Some(chunk) = chunk else {
                        input_open = false;
                        continue;
                    };
                    let chunk = chunk?;
                    for record in records(chunk.bytes(), separator) {
                        let key = key_of.as_ref().map(|k| k.key(trim(record, separator)));
                        match pacer.reserve(key, 1, args.max_wait).await? {
                            Some(wait) => {
                                if !wait.is_zero() {
                                    counts.waited.fetch_add(1, Ordering::Relaxed);
                                }
                                seq += 1;
                                due.push(Due { at: Instant::now() + wait, seq, record: record.to_vec() });
                            }
                            None if args.on_late == OnLate::Fail => return Err(Failure::Late),
                            None => {
                                counts.dropped.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
                () = sleep_until(next), if next.is_some() => {}
            }
        }
        Ok::<(), Failure>(())
    }
    .await;
    let failed = match commands {
        Some(mut commands) => commands.finish(counts).await,
        None => 0,
    };
    match result {
        Ok(()) => Ok(failed),
        Err(Failure::Io(error)) if reader_gone(&error) => Ok(failed),
        Err(failure) => Err(failure),
    }
}

async fn sleep_until(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at.into()).await;
    }
}

/// The records of a chunk, each with its separator (the last may have
/// none).
fn records(chunk: &[u8], separator: u8) -> impl Iterator<Item = &[u8]> {
    chunk.split_inclusive(move |b| *b == separator)
}

/// A record without its separator.
fn trim(record: &[u8], separator: u8) -> &[u8] {
    record.strip_suffix(&[separator]).unwrap_or(record)
}

/// The commands run per record, at most `jobs` at once.
struct Commands {
    program: String,
    args: Vec<String>,
    jobs: usize,
    running: tokio::task::JoinSet<bool>,
    failed: u64,
}

impl Commands {
    fn new(args: &Args) -> Option<Commands> {
        let (program, rest) = args.command.split_first()?;
        Some(Commands {
            program: program.clone(),
            args: rest.to_vec(),
            jobs: args.jobs,
            running: tokio::task::JoinSet::new(),
            failed: 0,
        })
    }

    /// Starts the command for `record`, once fewer than `jobs` run.
    async fn start(&mut self, record: Vec<u8>, separator: u8, counts: &Counts) {
        while self.running.len() >= self.jobs {
            self.reap_one(counts).await;
        }
        let text = String::from_utf8_lossy(trim(&record, separator)).into_owned();
        let substituted = self.args.iter().any(|arg| arg.contains("{}"));
        let mut command = tokio::process::Command::new(&self.program);
        if substituted {
            command.args(self.args.iter().map(|arg| arg.replace("{}", &text)));
            command.stdin(std::process::Stdio::null());
        } else {
            command.args(&self.args);
            command.stdin(std::process::Stdio::piped());
        }
        counts.commands.fetch_add(1, Ordering::Relaxed);
        let program = self.program.clone();
        match command.spawn() {
            Ok(mut child) => {
                let input = (!substituted).then(|| child.stdin.take()).flatten();
                self.running.spawn(async move {
                    if let Some(mut stdin) = input {
                        use tokio::io::AsyncWriteExt;
                        let _ = stdin.write_all(&record).await;
                        drop(stdin);
                    }
                    child.wait().await.is_ok_and(|status| status.success())
                });
            }
            Err(error) => {
                eprintln!("paceline: cannot run {program}: {error}");
                self.failed += 1;
                counts.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    async fn reap_one(&mut self, counts: &Counts) {
        if let Some(done) = self.running.join_next().await
            && !done.unwrap_or(false)
        {
            self.failed += 1;
            counts.failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Waits for every command; how many failed.
    async fn finish(&mut self, counts: &Counts) -> u64 {
        while !self.running.is_empty() {
            self.reap_one(counts).await;
        }
        self.failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Short waits are spun and long ones slept; either way the wait ends
    /// at its moment, never before it.
    #[test]
    fn a_wait_never_ends_before_its_moment() {
        for wait in [0, 1, 7, 40, 99, 100, 101, 350] {
            let due = Instant::now() + Duration::from_micros(wait);
            wait_until(due);
            assert!(Instant::now() >= due, "a wait of {wait} µs ended early");
        }
    }
}
