//! The plain copy: records (or bytes) in order, paced in groups, on the
//! calling thread.

use std::io::{self, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::args::limits;
use crate::args::{Args, Failure};
use crate::limiter::local;
use crate::progress::{Counts, Progress, Written};
use crate::read::{PAGE, Window, count, reading, std_file, too_long};
use crate::signals;
use crate::stdout::stdout_file;

/// A plain copy on a limiter in this process, with no async runtime.
pub(crate) fn copy_locally(args: &Args, counts: &Arc<Counts>) -> Result<u64, Failure> {
    let (limits, slowest) = limits(args)?;
    let limiter = local(limits)?;
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

/// Whether a write failed because the reader went away (`| head`, or a
/// socket reset by its reader: see [`writing`](crate::stdout::writing)):
/// the end of the run, not a failure.
pub(crate) fn reader_gone(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::BrokenPipe
}

/// Copies records (or bytes) to stdout, paced, in groups of at most a
/// millisecond's worth at the slowest rate: exact spacing at any rate a
/// timer can keep, and the throughput of a plain copy at rates it never
/// reaches. Runs on the calling thread, as `cat` does: a read, the groups
/// it holds, each reserved (and slept for) then written, a write.
pub(crate) fn copy(
    args: &Args,
    mut reserve: impl FnMut(u32) -> Result<Duration, Failure>,
    slowest: f64,
    separator: u8,
    counts: &Counts,
) -> Result<u64, Failure> {
    use std::os::fd::{AsFd, AsRawFd};
    let group = (slowest / 1000.0).floor().clamp(1.0, f64::from(u32::MAX)) as usize;
    let mut stdin = std_file(io::stdin().as_fd()).map_err(reading)?;
    // Counted as written: records by their separators (the last,
    // unterminated, below), bytes as they go.
    let stdout = Written::new(stdout_file()?, counts, separator);
    let mut out = io::BufWriter::with_capacity(64 * 1024, stdout);
    // Every read asks for whole pages into a page boundary, so a file's
    // offsets stay page-aligned too: the kernel then copies whole pages,
    // several times faster than into (or out of) the middle of one.
    let mut window = Window::new(PAGE);
    // A file's reads never wait: a glance at the signal is enough, with
    // no `poll` per read.
    let may_wait = !stdin.metadata().is_ok_and(|m| m.is_file());
    let result = (|| {
        loop {
            // Everything whose moment has come is out (flushed below)
            // before a read may block.
            let woken = match may_wait {
                true => signals::readable(stdin.as_raw_fd()),
                false => signals::caught().map(signals::Woken::Signal),
            };
            if let Some(woken) = woken {
                return Err(woken.into());
            }
            let read = match window.fill(&mut stdin) {
                // (Would block: a stdin left non-blocking that another
                // reader emptied since the wait above found it readable.)
                Err(error)
                    if matches!(
                        error.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                    ) =>
                {
                    continue;
                }
                other => other.map_err(reading)?,
            };
            let carried = window.carried();
            let buf = window.bytes();
            let filled = buf.len();
            // Whole records only, but for the last at the end of input;
            // only what the read brought is searched.
            let mut len = match (args.bytes, read) {
                (true, _) | (false, 0) => filled,
                (false, _) => memchr::memrchr(separator, &buf[carried..filled])
                    .map_or(0, |end| carried + end + 1),
            };
            // A record longer than --max-record: those before it go first.
            let too_long = !args.bytes && {
                let at = too_long(&buf[..len], separator, args.max_record);
                len = at.unwrap_or(len);
                at.is_some()
            };
            let mut rest = &buf[..len];
            // When the groups written since the last flush began.
            let mut since = Instant::now();
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
                    match memchr::memchr_iter(separator, rest).nth(group - 1) {
                        Some(at) => (at + 1, group),
                        None => {
                            let records = count(rest, separator);
                            let last = usize::from(rest[rest.len() - 1] != separator);
                            (rest.len(), records + last)
                        }
                    }
                };
                // A signal stops the copy before the next group is
                // reserved, as a wait would: each reservation may be a
                // round trip through Redis, and a read's worth of groups
                // that need no wait took seconds before the signal was
                // seen at the next read.
                if let Some(signal) = signals::caught() {
                    out.flush()?;
                    return Err(Failure::Signal(signal));
                }
                // The groups written go out before more are reserved once
                // reserving has taken a while (each reservation may be a
                // round trip through Redis: a read's groups that needed no
                // wait stayed in the buffer until all were reserved).
                if !out.buffer().is_empty() && since.elapsed() >= signals::SPIN_BELOW {
                    out.flush()?;
                    since = Instant::now();
                }
                let wait = reserve(permits as u32)?;
                if !wait.is_zero() {
                    out.flush()?;
                    if let Some(woken) = signals::sleep_until(later(wait)) {
                        // This group's moment has not come: it stays.
                        return Err(woken.into());
                    }
                }
                if end >= 32 * 1024 {
                    // Large: straight to stdout, not through the buffer.
                    out.flush()?;
                    out.get_mut().write_all(&rest[..end])?;
                } else {
                    out.write_all(&rest[..end])?;
                }
                // Counted as it goes out: one cut short by a signal as it
                // waited never went.
                if !wait.is_zero() {
                    counts.waited.fetch_add(permits as u64, Ordering::Relaxed);
                }
                rest = &rest[end..];
            }
            // What was written goes out before the next read may block.
            out.flush()?;
            if too_long {
                return Err(Failure::TooLong(args.max_record));
            }
            if read == 0 {
                // The last record of the input, unterminated, went whole.
                if out.get_ref().begun() {
                    counts.out(1, 0);
                }
                return Ok(0);
            }
            window.keep_from(len);
            if !args.bytes && window.bytes().len() > args.max_record {
                return Err(Failure::TooLong(args.max_record));
            }
        }
    })();
    match result {
        Err(Failure::Io(error)) if reader_gone(&error) => Ok(0),
        other => other,
    }
}

/// The moment `wait` from now (or as far as the clock goes).
pub(crate) fn later(wait: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(wait)
        .unwrap_or_else(|| now + Duration::from_secs(86_400 * 365 * 30))
}
