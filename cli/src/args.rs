//! The command line's arguments: what clap reads, what it cannot check,
//! and why a run stops, as an exit status.

use std::io;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use paceline::{Error, Limit};

use crate::units::{Rate, parse_duration, parse_rate, parse_record_size, readable_numbers};

const EXAMPLES: &str = "\
Examples:
  seq 100 | paceline 10/s                     ten lines a second, exactly 100 ms apart
  paceline 2/s --burst 5 < urls.txt           5 at once after a pause, then 2/s
  paceline 10/s --limit 1000/h < jobs         10/s, and 1 000 an hour: the first 1 000 in
                                              100 s, then one every 3.6 s
  paceline --bytes 1MiB/s < big.iso > copy    1 MiB/s of bytes
  paceline 5/s --key 1 < access.log           5 lines/s per value of the first field
  paceline 20/s --max-wait 2s < events        drop what would wait more than 2 s
  paceline 3/s -j 4 --timeout 1min -- curl -sO {} < urls
                                              a command per line, 3 starts/s, 4 at once,
                                              each killed after a minute
  paceline 20/s --redis redis://host/ --name crawler < urls
                                              one rate shared by every paceline of that name

Bytes go through unchanged in every mode: to stdout, in place of {} and to
a command's stdin. Each record is held whole until its moment (at most
--max-record).

A command that fails (exits non-zero, is killed, cannot start, or runs
past --timeout) is named on stderr with its record's number, counted, and
not retried (one whose record in place of {} would make an argument
longer than the system lets one be, on Linux 32 pages (128KiB) less a byte,
or that holds a NUL byte, is not started, and fails so too); every other record still gets its command (unless stdout's
reader goes away, below), and the exit status is 1.

Each command runs as the leader of a process group of its own, apart from
paceline's and the terminal's: --timeout kills the whole group (the
processes the command started too, unless one left the group), and
paceline passes on to it what the terminal sends its own group: SIGINT
and SIGTERM (below), a stop (Ctrl-Z) and the continue after it, a hangup
or a quit (Ctrl-\\; these two then end paceline, as ever). A signal ignored
when paceline starts stays ignored, by the commands too. What is
not passed on: SIGKILL (it cannot be caught), and anything to what a
command left running in its group once it ended. A command that reads
the terminal itself, not its stdin, is stopped as a background job is.

When stdout is a pipe or a socket whose reader goes away (`| head`), the
run ends there, as it does without a command: no command starts after
that (the records left get none), those running are waited for, and one
killed by SIGPIPE then, or a shell exiting 141 as its command was (cut
short with the run), is neither named nor counted. Any other failure still counts: the exit status is 1 if one
came, before the reader went or after, and 0 if none did.

SIGINT or SIGTERM: nothing more is read; the records whose moment has come
are out, those still waiting are not written; no command starts; those
running are sent the same signal, each to its whole process group (so a
terminal's Ctrl-C still reaches them), and waited for; the summary is
printed; then paceline ends by the same signal (a shell reports 130 or
143). A second signal ends it at once, the process groups of the commands
still running killed first (SIGKILL). What is due is written whole, never
cut inside a record: a reader of stdout that is there but does not read
holds the run until it reads, or until a second signal.

Exit status:
  0    done, or stdout's reader went away (`| head`, see above)
  1    a command failed or ran past --timeout (every other record's ran,
       unless stdout's reader went away)
  2    bad arguments
  3    a record was late with --on-late fail
  4    the limiter failed: Redis refused paceline (a wrong password, user
       or database), or, with --on-down closed, could not be reached
  5    reading or writing failed, or stdin or stdout was closed when
       paceline started (`<&-`, `>&-`: nothing is read)
  6    a record was longer than --max-record, or its key than --max-key
  130  ended by SIGINT, 143 by SIGTERM (see above)
A late record, a record too long, a failed limiter or a failed read
stops the reading only: the records granted before it still go out, each
at its moment (their commands run), and none after. Statuses 3 to 6 win
over 1.";

/// Paces stdin to stdout (or a command per record) at a rate: exact
/// spacing, bursts and warm-up, per key, across machines through Redis.
#[derive(Parser, Debug)]
#[command(name = "paceline", version, after_help = EXAMPLES)]
pub(crate) struct Args {
    /// The rate: 10/s, 600/min, 1000/h, 5/day (with --bytes, 5MiB/s). A
    /// second rate is another limit every record must also satisfy, as
    /// --limit.
    #[arg(value_name = "RATE", required = true, num_args = 1..)]
    pub(crate) rates: Vec<String>,

    /// Another limit every record must also satisfy. Limits after the
    /// first are quotas: each lets its whole period's worth go at once.
    #[arg(long = "limit", value_name = "RATE")]
    pub(crate) limits: Vec<String>,

    /// Pace bytes instead of records (the rate in bytes: 5MiB/s, 100KB/s).
    #[arg(long)]
    pub(crate) bytes: bool,

    /// Records end with NUL instead of newline.
    #[arg(short = '0', long = "null")]
    pub(crate) null: bool,

    /// How many records (bytes, with --bytes) may go at once after an idle
    /// spell: N at once, the next one interval after the first. At least 1;
    /// default 1: exact spacing (from 2 000 a second on, without --key,
    /// --max-wait or a command, a millisecond's worth go together, each
    /// group at its moment: no finer spacing is kept by a timer; so after
    /// an idle spell up to N records and a group less one go at once).
    #[arg(long, value_name = "N")]
    pub(crate) burst: Option<u64>,

    /// Start slow after an idle spell and reach the rate over this long
    /// (250ms, 2s, 1min) instead of a burst.
    #[arg(long, value_name = "D", value_parser = parse_duration, conflicts_with = "burst")]
    pub(crate) warmup: Option<Duration>,

    /// Pace each key separately: the key is whitespace field FIELD of the
    /// record (from 1), none the empty key. Keys are bytes: two that differ
    /// in any byte are paced apart. Through Redis a key is named by its
    /// text: UTF-8 as it is but `\` written `\\`, every other byte `\xNN`.
    /// A last record without a separator goes out after every other, and
    /// its command (-- CMD) starts once every other has ended (its bytes
    /// stay its own: written sooner, the next would join it). Memory is
    /// bounded: once 100000 records (or 64MiB of them) wait for their
    /// moment, of every key together, no more input is read until fewer
    /// do, so the records behind a key's deep backlog in the input wait for
    /// that room, whatever their key.
    #[arg(long, value_name = "FIELD", conflicts_with = "key_regex")]
    pub(crate) key: Option<usize>,

    /// Pace each key separately: the key is the first group REGEX captures
    /// in the record (the first that takes part in the match; its whole
    /// match if none does), no match the empty key; bytes,
    /// as with --key. REGEX runs on the record's bytes: its `.`, `\S` and
    /// `[^...]` match whole UTF-8 characters, `(?-u:.)` and `(?-u:\S)`
    /// any byte.
    #[arg(long, value_name = "REGEX")]
    pub(crate) key_regex: Option<String>,

    /// The most keys held at once. At the cap, keys idle long enough to be
    /// full go first, then those nearest to full, which forget what they
    /// owe: such a key, back, starts afresh, though its records still go in
    /// input order, none before one of its records still waiting (raise N
    /// if keys come back sooner than they are full; --json counts such
    /// keys).
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    pub(crate) max_keys: usize,

    /// The longest key (with --key or --key-regex; 1KiB, 64KiB): the keys
    /// held take --max-keys times this at most. A record with a longer key
    /// ends the run with exit status 6, as a record too long does.
    #[arg(long, value_name = "SIZE", default_value = "1KiB", value_parser = parse_record_size)]
    pub(crate) max_key: usize,

    /// A record that would wait longer than this is late (see --on-late):
    /// for its moment, and with a command for one of the -j to be free.
    #[arg(long, value_name = "D", value_parser = parse_duration)]
    pub(crate) max_wait: Option<Duration>,

    /// What to do with a late record: drop it (counted), or fail (exit
    /// status 3, once the records before it are out).
    #[arg(long, value_enum, value_name = "WHAT", default_value_t = OnLate::Drop)]
    pub(crate) on_late: OnLate,

    /// Run up to N commands at once (with -- CMD). They write to stdout
    /// themselves, as they go: with N above 1, what one writes may be cut
    /// into by what another writes (a pipe keeps only writes of up to 4KiB
    /// whole), so give each a file of its own where that matters.
    #[arg(short = 'j', long, value_name = "N", default_value_t = 1)]
    pub(crate) jobs: usize,

    /// Kill a command still running D after it started (250ms, 30s,
    /// 5min) and count it as failed, as a command that exits non-zero:
    /// exit status 1 at the end. Its whole process group is killed
    /// (SIGKILL): the command and the processes it started, unless one
    /// left the group. Default: no bound.
    #[arg(long, value_name = "D", value_parser = parse_duration)]
    pub(crate) timeout: Option<Duration>,

    /// Share the rate through Redis at URL (redis://host:6379/) with every
    /// paceline and library user of the same --name.
    #[arg(long, value_name = "URL")]
    pub(crate) redis: Option<String>,

    /// The shared limiter's name in Redis.
    #[arg(
        long,
        value_name = "NAME",
        default_value = "paceline-cli",
        requires = "redis",
        value_parser = clap::builder::NonEmptyStringValueParser::new()
    )]
    pub(crate) name: String,

    /// While Redis is down, from the start too: pace on a limiter of this
    /// process's own (local: a key there starts with nothing stored, as it
    /// cannot know what the others spent, so no burst or quota's period
    /// goes at once until Redis is back; with --warmup, cold), let
    /// everything through (open),
    /// or fail with exit status 4 (closed: it does not start without
    /// Redis).
    #[arg(long, value_enum, value_name = "WHAT", default_value_t = OnDown::Local, requires = "redis")]
    pub(crate) on_down: OnDown,

    /// The share of the rate this process may use on its own while Redis
    /// is down (1/N when N processes share it).
    #[arg(long, value_name = "F", default_value_t = 1.0, requires = "redis")]
    pub(crate) local_fraction: f64,

    /// The longest record, its separator not counted (64MiB, 1GiB,
    /// 100000): each is held whole until its moment. A longer one ends the
    /// run with exit status 6: the records before it are written (each at
    /// its moment), nothing of it is. Not with --bytes, which holds none.
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = parse_record_size)]
    pub(crate) max_record: usize,

    /// Print a JSON summary to stderr at the end: records and bytes out
    /// (written to stdout, or given to a command that started; with
    /// --bytes, the records among the bytes, by their separators), seconds,
    /// rate (the pace: records a second, with --bytes bytes, counting
    /// those out after the first moment, a burst or the first record, over
    /// the seconds from it to the last out; null if none went after it:
    /// 3 records at 2/s read 2.0), those of the records
    /// out that waited (with --bytes, bytes), late records dropped, commands started,
    /// commands failed (those that could not start too), keys dropped at
    /// --max-keys before they were full.
    #[arg(long)]
    pub(crate) json: bool,

    /// No progress line. Without this, one is drawn on stderr while it is
    /// a terminal and stdout is not (on a terminal, the records are the
    /// progress).
    #[arg(short, long)]
    pub(crate) quiet: bool,

    /// Run CMD for each record instead of printing it: `{}` in its
    /// arguments is the record; with no `{}`, the record is its stdin.
    #[arg(last = true, value_name = "CMD")]
    pub(crate) command: Vec<std::ffi::OsString>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OnLate {
    Drop,
    Fail,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OnDown {
    Local,
    Open,
    Closed,
}

/// Why the run stopped early, as an exit status.
#[derive(Debug)]
pub(crate) enum Failure {
    Usage(String),
    /// A record (this one, counted from 1 as read) would have waited
    /// more than `--max-wait`, with `--on-late fail`.
    Late(u64),
    Limiter(String),
    Io(io::Error),
    /// A record longer than `--max-record` (this many bytes).
    TooLong(usize),
    /// A record (this one, counted from 1 as read) whose key is longer
    /// than `--max-key` (this many bytes).
    KeyTooLong(u64, usize),
    /// SIGINT or SIGTERM (this one) was caught.
    Signal(i32),
}

impl Failure {
    pub(crate) fn code(&self) -> u8 {
        match self {
            Failure::Usage(_) => 2,
            Failure::Late(_) => 3,
            Failure::Limiter(_) => 4,
            Failure::Io(_) => 5,
            Failure::TooLong(_) | Failure::KeyTooLong(..) => 6,
            Failure::Signal(signal) => (128 + signal).clamp(0, 255) as u8,
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

/// Checks what clap cannot: the arguments that depend on each other.
pub(crate) fn validate(args: &Args) -> Result<(), Failure> {
    if args.key == Some(0) {
        return Err(Failure::Usage("--key fields count from 1".to_owned()));
    }
    if args.burst == Some(0) {
        return Err(Failure::Usage(
            "--burst counts the records (bytes, with --bytes) that may go at once: at least 1 \
             (1, the default, is exact spacing)"
                .to_owned(),
        ));
    }
    if args.jobs == 0 {
        return Err(Failure::Usage("-j must be at least 1".to_owned()));
    }
    // Checked before Redis is reached, not after.
    if !(args.local_fraction > 0.0 && args.local_fraction <= 1.0) {
        return Err(Failure::Usage(format!(
            "--local-fraction is a share of the rate: more than 0 and at most 1 (got {})",
            args.local_fraction
        )));
    }
    if args.local_fraction != 1.0 && args.on_down != OnDown::Local {
        return Err(Failure::Usage(
            "--local-fraction shares the rate out while Redis is down with --on-down local \
             only: remove one of them"
                .to_owned(),
        ));
    }
    if args.max_keys == 0 {
        return Err(Failure::Usage("--max-keys must be at least 1".to_owned()));
    }
    let keyed = args.key.is_some() || args.key_regex.is_some();
    // A byte stream has no records to key, run or drop: a late part of it
    // could only be cut out of the middle.
    if args.bytes && (keyed || !args.command.is_empty() || args.max_wait.is_some()) {
        return Err(Failure::Usage(
            "--bytes paces a byte stream: it takes no --key, no --max-wait and no command"
                .to_owned(),
        ));
    }
    if args.timeout.is_some() && args.command.is_empty() {
        return Err(Failure::Usage(
            "--timeout bounds each command: it needs one (-- CMD)".to_owned(),
        ));
    }
    if args.timeout.is_some_and(|timeout| timeout.is_zero()) {
        return Err(Failure::Usage(
            "--timeout must be more than zero".to_owned(),
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
pub(crate) fn plain(args: &Args) -> bool {
    args.key.is_none()
        && args.key_regex.is_none()
        && args.max_wait.is_none()
        && args.command.is_empty()
}

/// The limits the arguments describe: the first paces (burst `--burst`,
/// default 1, or `--warmup`), the others are quotas (their whole period
/// as burst).
pub(crate) fn limits(args: &Args) -> Result<(Vec<Limit>, f64), Failure> {
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
            let limit = match (i, args.warmup) {
                (0, Some(warmup)) => limit.warmup(warmup),
                (0, None) => limit.burst(args.burst.unwrap_or(1)),
                _ => limit,
            };
            checked(limit, i, args)
        })
        .collect::<Result<_, _>>()?;
    Ok((limits, slowest))
}

/// `limit`, the `i`th of the arguments' rates, if a limiter takes it; else
/// the library's reason, said of the argument that made it (`1/day with
/// --burst 200000: its burst of 200000 is more than ...`).
fn checked(limit: Limit, i: usize, args: &Args) -> Result<Limit, Failure> {
    // (On a clock that costs nothing to make: this limiter only checks.)
    let built = paceline::RateLimiter::builder()
        .limit(limit.clone())
        .clock(paceline::clock::FakeClock::new())
        .build();
    let Err(error) = built else {
        return Ok(limit);
    };
    let text = args.rates.iter().chain(&args.limits).nth(i);
    let text = text.map_or("", String::as_str);
    let what = match (i, args.warmup, args.burst) {
        (0, Some(_), _) => format!("{text} with --warmup"),
        (0, None, Some(burst)) => format!("{text} with --burst {burst}"),
        _ if i < args.rates.len() => text.to_owned(),
        _ => format!("--limit {text}"),
    };
    let why = error.to_string();
    let why = why
        .split_once("limit 0: ")
        .map_or(why.as_str(), |(_, why)| why);
    // A tiny rate reads in a few digits, not hundreds.
    let why = readable_numbers(why);
    Err(Failure::Usage(format!("{what}: {why}")))
}
