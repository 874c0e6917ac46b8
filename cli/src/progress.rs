//! What a run did: counted as it goes, shown on a progress line while
//! stderr is a terminal (and stdout is not), summed up in JSON at the end
//! (`--json`).

use std::io::{self, IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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

    /// What the run paces, a second: records, or bytes with `--bytes`.
    fn rate(&self) -> f64 {
        let paced = match self.by_bytes {
            true => &self.bytes,
            false => &self.records,
        };
        let seconds = self.elapsed();
        if seconds > 0.0 {
            paced.load(Ordering::Relaxed) as f64 / seconds
        } else {
            0.0
        }
    }

    pub(crate) fn line(&self) -> String {
        let records = self.records.load(Ordering::Relaxed);
        let rate = self.rate();
        format!(
            "{records} records, {} bytes, {rate:.1}/s, {} waited, {} dropped",
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
            say!(
                "{{\"records\":{records},\"bytes\":{},\"seconds\":{seconds:.6},\"rate\":{:.3},\"waited\":{},\"dropped\":{},\"commands\":{},\"failed\":{},\"keys_dropped_unfinished\":{}}}",
                self.bytes.load(Ordering::Relaxed),
                self.rate(),
                self.waited.load(Ordering::Relaxed),
                self.dropped.load(Ordering::Relaxed),
                self.commands.load(Ordering::Relaxed),
                self.failed.load(Ordering::Relaxed),
                self.keys_dropped_unfinished.load(Ordering::Relaxed),
            );
        }
    }
}

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
        self.counts
            .bytes
            .fetch_add(went.len() as u64, Ordering::Relaxed);
        let records = count(went, self.separator) as u64;
        self.counts.records.fetch_add(records, Ordering::Relaxed);
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
