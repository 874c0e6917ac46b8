//! `paceline`: paces a shell pipeline. Copies stdin to stdout one record
//! (line) at a time at a rate, or runs a command per record; per key if
//! asked; shared with every other `paceline` (and library user) of the same
//! name through Redis if asked. See `paceline --help`.

/// `eprintln!` that does not panic when stderr is closed (its reader went
/// away): what it could not say is lost, and the run goes on to its end.
/// It covers the progress line first, if one is drawn: what it says
/// starts a line of its own.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut stderr = std::io::stderr().lock();
        crate::progress::cover(&mut stderr);
        let _ = writeln!(stderr, $($arg)*);
    }};
}

mod args;
mod closed;
mod commands;
mod copy;
mod key;
mod limiter;
mod progress;
mod read;
mod schedule;
mod signals;
mod stdout;
mod units;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use clap::Parser;
use tokio::sync::mpsc;

use args::{Args, Failure, limits, plain, validate};
use copy::{copy, copy_locally};
use key::KeyOf;
use limiter::{Pacer, pacer};
use progress::{Counts, Progress};
use read::read_stdin;
use schedule::schedule;

fn main() -> ExitCode {
    let args = Args::parse();
    let counts = Arc::new(Counts {
        by_bytes: args.bytes,
        ..Counts::default()
    });
    let checked = validate(&args)
        .and_then(|()| Ok(closed::check()?))
        .and_then(|()| Ok(signals::install()?));
    let result = match checked.map(|()| plain(&args)) {
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
    let code = match result {
        Ok(failed_commands) if failed_commands > 0 => ExitCode::from(1),
        Ok(_) => ExitCode::SUCCESS,
        Err(failure) => {
            match &failure {
                Failure::Usage(why) | Failure::Limiter(why) => say!("paceline: {why}"),
                Failure::Late(number) => say!(
                    "paceline: record {number} would have waited more than --max-wait \
                     (--on-late fail): the records before it went out, each at its moment, none after"
                ),
                Failure::Io(error) => say!("paceline: {error}"),
                Failure::TooLong(max) => say!(
                    "paceline: a record is longer than --max-record ({max} bytes): the records \
                     before it were written, nothing of it was"
                ),
                Failure::KeyTooLong(number, max) => say!(
                    "paceline: the key of record {number} is longer than --max-key ({max} \
                     bytes): the records before it went out, each at its moment, none after"
                ),
                Failure::Signal(_) => {}
            }
            ExitCode::from(failure.code())
        }
    };
    // A signal caught at any point, even as the run was ending anyway,
    // ends it by that signal, as a program that does not catch it.
    if let Some(signal) = signals::caught() {
        signals::end_by(signal);
    }
    code
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
        // Records only: a byte stream is always a plain copy.
        let max_record = args.max_record;
        std::thread::spawn(move || read_stdin(chunks, separator, max_record));
        let done = schedule(args, &pacer, key_of, separator, receiving, &counts).await;
        if let Pacer::Keyed(limiter) = &pacer {
            let dropped = limiter.stats().dropped_unfinished;
            counts
                .keys_dropped_unfinished
                .store(dropped, Ordering::Relaxed);
        }
        done
    }
}
