//! Throttling bytes: [`ThrottledReader`] and [`ThrottledWriter`].
//!
//! Either wraps a Tokio reader or writer and a limiter, and passes bytes
//! through at the limiter's rate: **one permit is one byte**. The limiter is
//! anything that derefs to a [`Limiter`]: an `Arc<RateLimiter>`, an
//! `Arc<dyn Limiter>`, a `Box` of either, a `&'static` reference, a Redis
//! limiter in an `Arc`. Several readers and writers can share one limiter and
//! so one budget of bytes per second.
//!
//! ```
//! use std::sync::Arc;
//! use paceline::RateLimiter;
//! use paceline::io::ThrottledWriter;
//! use tokio::io::AsyncWriteExt;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! let limiter = Arc::new(RateLimiter::bursty(1024.0 * 1024.0).map_err(std::io::Error::other)?);
//! // At most 1 MiB/s into the sink, whatever the buffer sizes.
//! let mut writer = ThrottledWriter::new(tokio::io::sink(), limiter);
//! writer.write_all(&[0u8; 4096]).await?;
//! writer.flush().await?;
//! # Ok(()) }
//! ```
//!
//! # Chunks
//!
//! A read or a write moves at most one *chunk*: the bytes the limiter's
//! current [`slowest_rate`](Limiter::slowest_rate) (its slowest limit's
//! rate, with several) allows in [`CHUNK_TIME`] (10 ms), rounded
//! down, at least 1 byte and at most [`MAX_CHUNK`] (64 KiB), and never
//! more than the caller's buffer:
//!
//! * **Short waits.** A reservation waits for the debt left by the one
//!   before it, so no read or write waits for more than about one chunk's
//!   worth of time (10 ms; one byte's time below 100 bytes per second) plus
//!   whatever other users of a shared limiter owe. A 1 MiB `write_all` at
//!   100 KiB/s is about a thousand waits of 10 ms, not one wait of ten
//!   seconds, and cancelling it leaves at most the chunk in flight
//!   reserved: the writer keeps it for its next write, and gives it back
//!   if it is dropped (see "Cancellation").
//! * **An exact schedule.** The next chunk is reserved as soon as the
//!   previous one has been passed on. As long as a timer wakes up less than
//!   one chunk's time late (10 ms, against Tokio's 1 ms timer resolution),
//!   the next reservation is made before the previous one's debt is paid
//!   and the schedule loses nothing to late wake-ups. Chunks much cheaper
//!   than a timer tick (a fast rate and a small caller buffer, e.g. 8 KiB
//!   writes at 1 GiB/s) rely on the limiter's burst to absorb the late
//!   wake-ups; the default burst of one second does (as does one of 5 ms),
//!   while a limiter built with `max_burst(Duration::ZERO)` loses them and
//!   runs slower than its rate (about a tenth of it at 1 GiB/s with 64 KiB
//!   chunks: `cargo bench -p paceline-benches --bench io`).
//! * **Bounded.** 64 KiB bounds the reader's buffer and a shared limiter's
//!   granularity: several streams sharing one limiter take turns in pieces
//!   of at most 64 KiB (10 ms at rates up to 6.25 MiB/s, less above).
//!
//! # Accounting
//!
//! * The [writer](ThrottledWriter) reserves a chunk, waits for it, then
//!   writes it. What the inner writer does not accept (a short write, or a
//!   write that returns `Pending`) stays paid for as *credit*, which the
//!   next writes use before reserving again: every byte written is charged
//!   once, and at most one chunk of credit is ever outstanding (lost if the
//!   writer is dropped with it).
//! * The [reader](ThrottledReader) reads a chunk from the inner reader into
//!   its own buffer, reserves exactly the bytes it got, waits, then hands
//!   them over. Short reads are charged what they returned, end of file
//!   costs nothing, and no byte reaches the caller before its permits are
//!   due.
//!
//! # Cancellation
//!
//! Every poll is cancel-safe in the sense of `AsyncRead` and `AsyncWrite`:
//! the pending reservation lives in the reader or writer, not in the future
//! of one call, so a call that is dropped and made again (with the same or
//! another buffer) picks the same reservation up and nothing is charged
//! twice. Dropping the reader or writer itself while it waits gives the
//! pending reservation back to the limiter, as dropping a
//! [`Reservation`](crate::Reservation) does. (A reader dropped while it
//! waits also drops the bytes it had read for that reservation.)

use std::fmt;
use std::future::Future;
use std::io;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::{Error, Limiter};

/// The time a chunk may cost at most, at the limiter's rate (above the
/// minimum of one byte): 10 ms. See the [module docs](self#chunks).
///
/// ```
/// use std::time::Duration;
/// assert_eq!(paceline::io::CHUNK_TIME, Duration::from_millis(10));
/// ```
pub const CHUNK_TIME: Duration = Duration::from_millis(10);

/// The largest chunk, in bytes: 64 KiB. See the [module docs](self#chunks).
///
/// ```
/// assert_eq!(paceline::io::MAX_CHUNK, 65_536);
/// ```
pub const MAX_CHUNK: usize = 64 * 1024;

/// The largest chunk a read or write moves at `rate` bytes per second: the
/// bytes of [`CHUNK_TIME`] at that rate, rounded down, at least 1 and at most
/// [`MAX_CHUNK`]. A read or write also moves no more than its buffer.
pub(crate) fn chunk_limit(rate: f64) -> usize {
    // The conversion truncates and saturates (NaN, which no limiter
    // reports, to 0): the clamp does the rest.
    ((rate * CHUNK_TIME.as_secs_f64()) as usize).clamp(1, MAX_CHUNK)
}

/// A pending reservation's future: it reserves and waits, and hands the
/// limiter back with the outcome.
pub(crate) type Wait<'a, L, T> = Pin<Box<dyn Future<Output = (L, Result<T, Error>)> + Send + 'a>>;

/// A limiter handle, idle or lent to the one reservation pending: what a
/// throttled reader, writer or stream holds between polls, so that a call
/// dropped and made again picks the same reservation up.
pub(crate) enum Gate<'a, L, T> {
    /// No reservation pending.
    Idle(L),
    /// A reservation pending: dropping it gives the permits back. In a
    /// mutex that is never locked (the future is reached only through
    /// `&mut`), so that the gate is `Sync` though the future is not, as a
    /// body that boxes its stream asks.
    Waiting(Mutex<Wait<'a, L, T>>),
    /// Only if a reservation panicked: the limiter went with it.
    Gone,
}

impl<'a, L, T> Gate<'a, L, T> {
    /// The limiter, if no reservation is pending.
    pub(crate) fn idle(&self) -> Option<&L> {
        match self {
            Gate::Idle(limiter) => Some(limiter),
            _ => None,
        }
    }

    /// Lends the limiter to the reservation `wait` makes with it. Does
    /// nothing unless idle.
    pub(crate) fn start(&mut self, wait: impl FnOnce(L) -> Wait<'a, L, T>) {
        if let Gate::Idle(_) = self
            && let Gate::Idle(limiter) = std::mem::replace(self, Gate::Gone)
        {
            *self = Gate::Waiting(Mutex::new(wait(limiter)));
        }
    }

    /// Polls the pending reservation: `None` if there is none, else its
    /// outcome once it is due, the limiter idle again.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<T, Error>>> {
        // Out of the gate while it is polled: a reservation that panics
        // leaves the gate `Gone`, not a future that panics again.
        let mut waiting = match std::mem::replace(self, Gate::Gone) {
            Gate::Waiting(waiting) => waiting.into_inner().unwrap_or_else(PoisonError::into_inner),
            other => {
                *self = other;
                return Poll::Ready(None);
            }
        };
        match waiting.as_mut().poll(cx) {
            Poll::Pending => {
                *self = Gate::Waiting(Mutex::new(waiting));
                Poll::Pending
            }
            Poll::Ready((limiter, outcome)) => {
                *self = Gate::Idle(limiter);
                Poll::Ready(Some(outcome))
            }
        }
    }
}

impl<L, T> fmt::Debug for Gate<'_, L, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Gate::Idle(_) => "Idle",
            Gate::Waiting(_) => "Waiting",
            Gate::Gone => "Gone",
        })
    }
}

/// The gate of a reader or writer: what it pays for is bytes.
impl<L: Deref<Target: Limiter> + Send + Sync + 'static> Gate<'static, L, usize> {
    /// The largest chunk at the limiter's rate, if no reservation is
    /// pending.
    fn chunk_limit(&self) -> Option<usize> {
        self.idle()
            .map(|limiter| chunk_limit(limiter.slowest_rate()))
    }

    /// Starts reserving `bytes` (at least 1, at most `MAX_CHUNK`). Does
    /// nothing unless idle.
    fn reserve(&mut self, bytes: usize) {
        // At most MAX_CHUNK, so the conversion never saturates.
        let permits = u32::try_from(bytes).unwrap_or(u32::MAX);
        self.start(|limiter| {
            Box::pin(async move {
                let paid = limiter.acquire(permits).await;
                (limiter, paid.map(|_| bytes))
            })
        });
    }

    /// Polls the pending reservation: the bytes paid for once it is due,
    /// or the limiter's error (nothing paid). Idle again when ready.
    fn paid(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        Poll::Ready(match ready!(self.poll(cx)) {
            Some(paid) => paid.map_err(io::Error::other),
            None => Err(io::Error::other(
                "paceline: the limiter was lost to a panic in an earlier reservation",
            )),
        })
    }
}

/// An [`AsyncWrite`] that passes bytes to its inner writer at a limiter's
/// rate, one permit per byte.
///
/// Each write reserves one [chunk](self#chunks), waits, then writes it;
/// see [accounting](self#accounting) and [cancellation](self#cancellation).
/// Flush and shutdown pass straight through. The inner writer must be
/// [`Unpin`]; pin one that is not with `Box::pin`.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use paceline::clock::{Clock, FakeClock};
/// use paceline::io::ThrottledWriter;
/// use paceline::{Limiter, RateLimiter};
/// use tokio::io::AsyncWriteExt;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let clock = FakeClock::new();
/// let limiter: Arc<dyn Limiter> = Arc::new(
///     RateLimiter::builder()
///         .permits_per_second(1_000_000.0) // 1 MB/s
///         .max_burst(Duration::ZERO)
///         .clock(clock.clone())
///         .build()?,
/// );
/// let mut writer = ThrottledWriter::new(Vec::new(), limiter.clone());
/// writer.write_all(&[7u8; 100_000]).await?; // ten chunks of 10 kB
/// // Nine chunks waited 10 ms each; the last one's debt is left to the next caller.
/// assert_eq!(clock.now(), Duration::from_millis(90));
/// assert_eq!(limiter.snapshot().await?.wait(), Duration::from_millis(10));
/// assert_eq!(writer.into_inner().len(), 100_000);
/// # Ok(()) }
/// ```
pub struct ThrottledWriter<W, L> {
    inner: W,
    gate: Gate<'static, L, usize>,
    /// Bytes reserved and waited for but not yet written.
    credit: usize,
}

impl<W, L> ThrottledWriter<W, L>
where
    W: AsyncWrite + Unpin,
    L: Deref<Target: Limiter> + Send + Sync + 'static,
{
    /// Wraps `inner`, writing to it at `limiter`'s rate in bytes per second.
    pub fn new(inner: W, limiter: L) -> Self {
        ThrottledWriter {
            inner,
            gate: Gate::Idle(limiter),
            credit: 0,
        }
    }
}

impl<W, L> ThrottledWriter<W, L> {
    /// The inner writer.
    pub fn get_ref(&self) -> &W {
        &self.inner
    }

    /// The inner writer, mutably. Writing to it directly bypasses the limiter.
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }

    /// Unwraps the inner writer. A pending reservation is given back; credit
    /// (bytes paid for and not written) is lost.
    pub fn into_inner(self) -> W {
        self.inner
    }
}

// The limiter is never pinned (it moves in and out of the pending
// reservation), so only the inner writer decides.
impl<W: Unpin, L> Unpin for ThrottledWriter<W, L> {}

impl<W, L> AsyncWrite for ThrottledWriter<W, L>
where
    W: AsyncWrite + Unpin,
    L: Deref<Target: Limiter> + Send + Sync + 'static,
{
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if buf.is_empty() {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        }
        if this.credit == 0 {
            if let Some(limit) = this.gate.chunk_limit() {
                this.gate.reserve(buf.len().min(limit));
            }
            // On an error nothing was paid and the gate is idle again: the
            // next write tries afresh.
            this.credit = ready!(this.gate.paid(cx))?;
        }
        let chunk = this.credit.min(buf.len());
        let written = ready!(Pin::new(&mut this.inner).poll_write(cx, &buf[..chunk]))?;
        this.credit -= written.min(chunk);
        Poll::Ready(Ok(written))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<W: fmt::Debug, L> fmt::Debug for ThrottledWriter<W, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThrottledWriter")
            .field("inner", &self.inner)
            .field("reservation", &self.gate)
            .field("credit", &self.credit)
            .finish()
    }
}

/// An [`AsyncRead`] that passes bytes from its inner reader at a limiter's
/// rate, one permit per byte.
///
/// Each read reads up to one [chunk](self#chunks), reserves the bytes it
/// got, waits, then hands them over; see [accounting](self#accounting) and
/// [cancellation](self#cancellation). The inner reader must be [`Unpin`];
/// pin one that is not with `Box::pin`.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use paceline::RateLimiter;
/// use paceline::clock::{Clock, FakeClock};
/// use paceline::io::ThrottledReader;
/// use tokio::io::AsyncReadExt;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let clock = FakeClock::new();
/// let limiter = Arc::new(
///     RateLimiter::builder()
///         .permits_per_second(1_000_000.0) // 1 MB/s
///         .max_burst(Duration::ZERO)
///         .clock(clock.clone())
///         .build()?,
/// );
/// let data = vec![7u8; 25_000];
/// let mut reader = ThrottledReader::new(&data[..], limiter.clone());
/// let mut out = Vec::new();
/// reader.read_to_end(&mut out).await?; // in chunks of at most 10 kB
/// assert_eq!(out, data);
/// // 25 kB at 1 MB/s: the schedule ends at 25 ms. The reader returned the
/// // last chunk when it was granted, leaving its cost to the next caller.
/// assert_eq!(clock.now() + limiter.snapshot()?.wait(), Duration::from_millis(25));
/// assert!(limiter.snapshot()?.wait() <= Duration::from_millis(10));
/// # Ok(()) }
/// ```
pub struct ThrottledReader<R, L> {
    inner: R,
    gate: Gate<'static, L, usize>,
    /// Storage for bytes read and not yet handed over: `held[start..end]`.
    held: Vec<u8>,
    start: usize,
    end: usize,
    /// Whether the held bytes are paid for.
    paid: bool,
}

impl<R, L> ThrottledReader<R, L>
where
    R: AsyncRead + Unpin,
    L: Deref<Target: Limiter> + Send + Sync + 'static,
{
    /// Wraps `inner`, reading from it at `limiter`'s rate in bytes per second.
    pub fn new(inner: R, limiter: L) -> Self {
        ThrottledReader {
            inner,
            gate: Gate::Idle(limiter),
            held: Vec::new(),
            start: 0,
            end: 0,
            paid: false,
        }
    }
}

impl<R, L> ThrottledReader<R, L> {
    /// The inner reader.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// The inner reader, mutably. Reading from it directly bypasses the
    /// limiter (and skips the bytes this reader holds, if any).
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// Unwraps the inner reader. A pending reservation is given back, and
    /// the bytes this reader holds (read from the inner reader and not yet
    /// handed over, at most one chunk) are lost.
    pub fn into_inner(self) -> R {
        self.inner
    }
}

// The limiter is never pinned (it moves in and out of the pending
// reservation), so only the inner reader decides.
impl<R: Unpin, L> Unpin for ThrottledReader<R, L> {}

impl<R, L> AsyncRead for ThrottledReader<R, L>
where
    R: AsyncRead + Unpin,
    L: Deref<Target: Limiter> + Send + Sync + 'static,
{
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        if this.start == this.end {
            // Nothing held: read a chunk.
            let Some(limit) = this.gate.chunk_limit() else {
                // Unreachable: a reservation is only pending for held bytes.
                return this.gate.paid(cx).map_ok(drop);
            };
            let limit = buf.remaining().min(limit);
            if this.held.len() < limit {
                this.held.resize(limit, 0);
            }
            let mut chunk = ReadBuf::new(&mut this.held[..limit]);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut chunk))?;
            let got = chunk.filled().len();
            if got == 0 {
                return Poll::Ready(Ok(())); // end of file: free
            }
            (this.start, this.end, this.paid) = (0, got, false);
        }
        if !this.paid {
            // A new chunk, or one whose reservation failed before: reserve
            // exactly what is held.
            this.gate.reserve(this.end - this.start);
            ready!(this.gate.paid(cx))?;
            this.paid = true;
        }
        let n = buf.remaining().min(this.end - this.start);
        buf.put_slice(&this.held[this.start..this.start + n]);
        this.start += n;
        if this.start == this.end {
            (this.start, this.end) = (0, 0);
        }
        Poll::Ready(Ok(()))
    }
}

impl<R: fmt::Debug, L> fmt::Debug for ThrottledReader<R, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThrottledReader")
            .field("inner", &self.inner)
            .field("reservation", &self.gate)
            .field("buffered", &(self.end - self.start))
            .field("paid", &self.paid)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::{MAX_CHUNK, chunk_limit};

    #[test]
    fn chunk_limit_is_10_ms_of_the_rate_between_1_byte_and_64_kib() {
        assert_eq!(chunk_limit(1_000_000.0), 10_000);
        assert_eq!(chunk_limit(2.0 * 1024.0 * 1024.0), 20_971);
        assert_eq!(chunk_limit(1000.0), 10);
        assert_eq!(chunk_limit(150.0), 1);
        assert_eq!(chunk_limit(50.0), 1);
        assert_eq!(chunk_limit(1e-3), 1);
        assert_eq!(chunk_limit(6_553_600.0), MAX_CHUNK);
        assert_eq!(chunk_limit(1e9), MAX_CHUNK);
        assert_eq!(chunk_limit(f64::INFINITY), MAX_CHUNK);
    }
}
