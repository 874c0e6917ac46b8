//! What a run did: counted as it goes, shown on a progress line while
//! stderr is a terminal (and stdout is not), summed up in JSON at the end
//! (`--json`).

use std::io::{self, IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::args::Args;
use crate::read::count;
use crate::stdout::writing;

/// What the run did, for the progress line and the summary.
#[derive(Default)]
pub(crate) struct Counts {
    pub(crate) records: AtomicU64,
    pub(crate) bytes: AtomicU64,
    pub(crate) waited: AtomicU64,
    pub(crate) dropped: AtomicU64,
    pub(crate) commands: AtomicU64,
    pub(crate) failed: AtomicU64,
    /// Keys dropped at `--max-keys` before they were full: they forgot
    /// what they owed (the limiter's count, read at the end).
    pub(crate) keys_dropped_unfinished: AtomicU64,
    pub(crate) started: std::sync::OnceLock<Instant>,
    /// When what the run paces went out, for its rate (none yet: `None`).
    pub(crate) span: Mutex<Option<Span>>,
    /// Whether the run paces bytes (`--bytes`): its rate is then bytes a
    /// second (`waited` counts bytes too: what waited is what it paces).
    pub(crate) by_bytes: bool,
    /// The widest progress line drawn yet, in characters.
    pub(crate) widest: AtomicUsize,
}

impl Counts {
    pub(crate) fn elapsed(&self) -> f64 {
        self.started
            .get()
            .map_or(0.0, |started| started.elapsed().as_secs_f64())
    }

    /// Counts `records` and `bytes` out now: written to stdout, or given
    /// to a command that started.
    pub(crate) fn out(&self, records: u64, bytes: u64) {
        self.out_at(records, bytes, Instant::now());
    }

    /// Counts `records` and `bytes` out at `now`, the moment they went
    /// (for commands started one after another, the moment they were
    /// released together).
    pub(crate) fn out_at(&self, records: u64, bytes: u64, now: Instant) {
        let mut span = self.span.lock().unwrap_or_else(PoisonError::into_inner);
        self.records.fetch_add(records, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        let paced = match self.by_bytes {
            true => bytes,
            false => records,
        };
        if paced == 0 {
            return;
        }
        let total = self.paced();
        match span.as_mut() {
            None => {
                *span = Some(Span {
                    opened: now,
                    first: now,
                    at_first: total,
                    last: now,
                });
            }
            Some(span) if now.duration_since(span.opened) <= FIRST_MOMENT => {
                span.first = span.first.max(now);
                span.at_first = total;
                span.last = span.last.max(now);
            }
            Some(span) => span.last = span.last.max(now),
        }
    }

    /// What the run paces, out so far: records, or bytes with `--bytes`.
    fn paced(&self) -> u64 {
        match self.by_bytes {
            true => self.bytes.load(Ordering::Relaxed),
            false => self.records.load(Ordering::Relaxed),
        }
    }

    /// The pace of what the run paces, a second (records, or bytes with
    /// `--bytes`): those out after its first moment over the time from
    /// that moment to the last out; none if none went after it. (Over the
    /// run's seconds, 3 records at 2/s read 3/s: the first goes at once.)
    fn rate(&self) -> Option<f64> {
        let span = self.span.lock().unwrap_or_else(PoisonError::into_inner);
        let span = span.as_ref()?;
        let seconds = span.last.duration_since(span.first).as_secs_f64();
        let after = self.paced().saturating_sub(span.at_first);
        (seconds > 0.0 && after > 0).then(|| after as f64 / seconds)
    }

    pub(crate) fn line(&self) -> String {
        let records = self.records.load(Ordering::Relaxed);
        let rate = self
            .rate()
            .map_or("-".to_owned(), |rate| format!("{rate:.1}"));
        format!(
            "{records} records, {} bytes, {rate}/s, {} waited, {} dropped",
            self.bytes.load(Ordering::Relaxed),
            self.waited.load(Ordering::Relaxed),
            self.dropped.load(Ordering::Relaxed),
        )
    }

    /// The progress line, drawn over the last: back to the line's start,
    /// and padded to the widest drawn yet, so that a shorter one (a rate
    /// that fell below 10/s) leaves nothing of the one before.
    fn redrawn(&self) -> String {
        let line = self.line();
        let width = line.chars().count();
        let widest = self.widest.fetch_max(width, Ordering::Relaxed).max(width);
        format!("\r{line:<widest$}")
    }

    /// Draws the progress line over the last (with stderr locked, so that
    /// nothing said meanwhile goes between).
    fn draw(&self) {
        let mut stderr = io::stderr().lock();
        let line = self.redrawn();
        if write!(stderr, "{line}").is_ok() {
            DRAWN.store(line.chars().count() - 1, Ordering::Relaxed);
        }
    }

    pub(crate) fn finish(&self, args: &Args) {
        if progress_shown(args) {
            say!("{}", self.redrawn());
        }
        if args.json {
            let seconds = self.elapsed();
            let records = self.records.load(Ordering::Relaxed);
            let rate = self
                .rate()
                .map_or("null".to_owned(), |rate| format!("{rate:.3}"));
            say!(
                "{{\"records\":{records},\"bytes\":{},\"seconds\":{seconds:.6},\"rate\":{rate},\"waited\":{},\"dropped\":{},\"commands\":{},\"failed\":{},\"keys_dropped_unfinished\":{}}}",
                self.bytes.load(Ordering::Relaxed),
                self.waited.load(Ordering::Relaxed),
                self.dropped.load(Ordering::Relaxed),
                self.commands.load(Ordering::Relaxed),
                self.failed.load(Ordering::Relaxed),
                self.keys_dropped_unfinished.load(Ordering::Relaxed),
            );
        }
    }
}

/// When what a run paces went out: its first moment (what went within
/// [`FIRST_MOMENT`] of the first out went at once: a burst, a group of the
/// plain copy, writes of a large one, commands released together), and
/// the last out.
pub(crate) struct Span {
    /// When the first went.
    opened: Instant,
    /// When the last of the first moment went, and how much had gone.
    first: Instant,
    at_first: u64,
    last: Instant,
}

/// How long the first moment of a run lasts, for its rate: what went
/// within it went at once (paceline spaces nothing finer than a
/// millisecond).
const FIRST_MOMENT: Duration = Duration::from_millis(1);

/// Stdout, counting what it wrote: each byte that went, and as a record
/// out each separator that went (in a byte stream too: its records are
/// those among its bytes). Counted as the bytes go, not as they are
/// buffered, so that a write that fails (stdout a full disk) counts
/// nothing it did not write; its error says it was stdout's.
pub(crate) struct Written<'a, W> {
    inner: W,
    counts: &'a Counts,
    /// The records' separator.
    separator: u8,
    /// Whether bytes went after the last separator: a record begun.
    begun: bool,
}

impl<'a, W: Write> Written<'a, W> {
    pub(crate) fn new(inner: W, counts: &'a Counts, separator: u8) -> Self {
        Written {
            inner,
            counts,
            separator,
            begun: false,
        }
    }

    /// Whether bytes went after the last separator (at the end of the
    /// input: its last record, unterminated, went whole).
    pub(crate) fn begun(&self) -> bool {
        self.begun
    }
}

impl<W: Write> Write for Written<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let len = loop {
            match self.inner.write(buf) {
                // A stdout left non-blocking (O_NONBLOCK, by whoever made
                // the pipe) and full: wait until it has room, as a
                // blocking write would.
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    crate::stdout::writable();
                }
                other => break other.map_err(writing)?,
            }
        };
        let went = &buf[..len.min(buf.len())];
        let records = count(went, self.separator) as u64;
        self.counts.out(records, went.len() as u64);
        if let Some(last) = went.last() {
            self.begun = *last != self.separator;
        }
        Ok(len)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush().map_err(writing)
    }
}

/// Whether the progress line is drawn: on stderr, a terminal, unless
/// stdout is one too (there the records, or the commands' output, are what
/// it shows: each written after the line's text would join it).
pub(crate) fn progress_shown(args: &Args) -> bool {
    !args.quiet && io::stderr().is_terminal() && !io::stdout().is_terminal()
}

/// The width of the progress line on stderr now: 0 if none is drawn, or
/// it was covered since. Changed with stderr locked.
static DRAWN: AtomicUsize = AtomicUsize::new(0);

/// Covers the progress line, if one is drawn, so that what is said next
/// (with `stderr` still locked) starts a line of its own, not after the
/// line's text.
pub(crate) fn cover(stderr: &mut io::StderrLock<'_>) {
    let width = DRAWN.swap(0, Ordering::Relaxed);
    if width > 0 {
        let _ = write!(stderr, "\r{:width$}\r", "");
    }
}

/// The progress line on stderr, redrawn four times a second while it
/// lives; dropped, it has stopped drawing (the summary drawn after it is
/// the last).
pub(crate) struct Progress(Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>);

impl Progress {
    pub(crate) fn start(args: &Args, counts: &Arc<Counts>) -> Progress {
        if !progress_shown(args) {
            return Progress(None);
        }
        let done = Arc::new(AtomicBool::new(false));
        let (counts, stop) = (Arc::clone(counts), Arc::clone(&done));
        let drawing = std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                counts.draw();
                // Woken sooner when dropped.
                std::thread::park_timeout(Duration::from_millis(250));
            }
        });
        Progress(Some((done, drawing)))
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some((done, drawing)) = self.0.take() {
            done.store(true, Ordering::Relaxed);
            drawing.thread().unpark();
            let _ = drawing.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line shorter than one drawn before is padded to its width: the
    /// old characters are covered.
    #[test]
    fn a_shorter_line_covers_the_longer_one_before() {
        let counts = Counts::default();
        counts.records.store(1_000_000, Ordering::Relaxed);
        let long = counts.redrawn();
        counts.records.store(0, Ordering::Relaxed);
        let short = counts.redrawn();
        assert!(short.trim_end().len() < long.len(), "{short:?} {long:?}");
        assert_eq!(short.chars().count(), long.chars().count());
        assert!(short.starts_with("\r0 records"), "{short:?}");
    }
}
