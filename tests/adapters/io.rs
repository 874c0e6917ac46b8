//! `paceline::io`: `ThrottledReader` and `ThrottledWriter`.
//!
//! On a `FakeClock` the schedule is exact: a limiter's schedule for N bytes
//! ends at N / rate, so the time the copy took plus the debt it left
//! (the snapshot's `wait`) is exactly N / rate. The copy itself returns when its last
//! chunk is granted, that chunk's cost before the end of the schedule.
//! A `ManualClock` (sleeps end only when the test moves time) lets tests stop
//! a reader or writer mid-wait. Two tests run on the real clock.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use paceline::Local;
use paceline::clock::{Clock, FakeClock};
use paceline::io::{MAX_CHUNK, ThrottledReader, ThrottledWriter};
use paceline::{Error, Limiter, RateLimiter};

use crate::common::manual;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

/// 1 byte per µs: every chunk's cost is a whole number of µs.
const MB_PER_S: f64 = 1_000_000.0;

fn fake(rate: f64) -> (Arc<RateLimiter<Local, FakeClock>>, FakeClock) {
    crate::common::on(rate, FakeClock::new())
}

fn data(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

fn us(micros: u64) -> Duration {
    Duration::from_micros(micros)
}

/// An inner writer that records the size of every write, accepting at most
/// `max` bytes of each; `stutter`: `Pending` on every other poll (waking at
/// once).
#[derive(Default)]
struct Recorder {
    writes: Vec<usize>,
    bytes: Vec<u8>,
    max: Option<usize>,
    stutter: bool,
    polls: usize,
}

impl AsyncWrite for Recorder {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        this.polls += 1;
        if this.stutter && this.polls % 2 == 1 {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let n = this.max.map_or(buf.len(), |max| buf.len().min(max));
        this.writes.push(n);
        this.bytes.extend_from_slice(&buf[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// An inner reader of `data` that is `Pending` on every other poll (waking
/// at once) and hands out at most 5 bytes a read.
struct Trickle<'a> {
    data: &'a [u8],
    polls: usize,
}

impl AsyncRead for Trickle<'_> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        this.polls += 1;
        if this.polls % 2 == 1 {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let n = this.data.len().min(5).min(buf.remaining());
        buf.put_slice(&this.data[..n]);
        this.data = &this.data[n..];
        Poll::Ready(Ok(()))
    }
}

/// Polls once: what `f` returns for this task's context.
async fn poll_once<T>(mut f: impl FnMut(&mut Context<'_>) -> Poll<T>) -> Poll<T> {
    std::future::poll_fn(|cx| Poll::Ready(f(cx))).await
}

async fn poll_write<W: AsyncWrite + Unpin>(
    writer: &mut W,
    buf: &[u8],
) -> Poll<std::io::Result<usize>> {
    poll_once(|cx| Pin::new(&mut *writer).poll_write(cx, buf)).await
}

/// Polls one read into a fresh buffer of `len`: `Some(bytes read)` if ready.
async fn poll_read<R: AsyncRead + Unpin>(reader: &mut R, len: usize) -> Option<Vec<u8>> {
    let mut storage = vec![0u8; len];
    let mut buf = ReadBuf::new(&mut storage);
    match poll_once(|cx| Pin::new(&mut *reader).poll_read(cx, &mut buf)).await {
        Poll::Ready(result) => {
            result.unwrap();
            Some(buf.filled().to_vec())
        }
        Poll::Pending => None,
    }
}

#[tokio::test(flavor = "current_thread")]
async fn write_all_is_split_into_chunks_and_takes_n_over_rate() {
    const N: usize = 1_000_000;
    let (limiter, clock) = fake(MB_PER_S);
    let mut writer = ThrottledWriter::new(Recorder::default(), limiter.clone());
    let bytes = data(N);
    writer.write_all(&bytes).await.unwrap();
    let inner = writer.into_inner();
    assert_eq!(inner.bytes, bytes);
    assert_eq!(inner.writes, vec![10_000; 100]);
    // 99 chunks waited 10 ms each; the last chunk's 10 ms is left as debt.
    assert_eq!(clock.now(), us(990_000));
    assert_eq!(limiter.snapshot().unwrap().wait(), us(10_000));
    assert_eq!(
        clock.now() + limiter.snapshot().unwrap().wait(),
        us(N as u64)
    );
}

#[tokio::test(flavor = "current_thread")]
async fn copy_through_writer_into_sink_takes_n_over_rate() {
    const N: usize = 3_000_001;
    let (limiter, clock) = fake(MB_PER_S);
    let dyn_limiter: Arc<dyn Limiter> = limiter.clone();
    let mut writer = ThrottledWriter::new(tokio::io::sink(), dyn_limiter);
    let bytes = data(N);
    let copied = tokio::io::copy(&mut &bytes[..], &mut writer).await.unwrap();
    assert_eq!(copied, N as u64);
    assert_eq!(
        clock.now() + limiter.snapshot().unwrap().wait(),
        us(N as u64)
    );
    // The debt left is the last chunk's: at most one chunk.
    assert!(limiter.snapshot().unwrap().wait() <= us(10_000));
}

#[tokio::test(flavor = "current_thread")]
async fn copy_through_reader_into_sink_takes_n_over_rate() {
    const N: usize = 3_000_001;
    let (limiter, clock) = fake(MB_PER_S);
    let bytes = data(N);
    let mut reader = ThrottledReader::new(&bytes[..], limiter.clone());
    let copied = tokio::io::copy(&mut reader, &mut tokio::io::sink())
        .await
        .unwrap();
    assert_eq!(copied, N as u64);
    assert_eq!(
        clock.now() + limiter.snapshot().unwrap().wait(),
        us(N as u64)
    );
    assert!(limiter.snapshot().unwrap().wait() <= us(10_000));
}

#[tokio::test(flavor = "current_thread")]
async fn reader_reads_in_chunks_and_end_of_file_is_free() {
    const N: usize = 95_000;
    let (limiter, clock) = fake(MB_PER_S);
    let bytes = data(N);
    let mut reader = ThrottledReader::new(&bytes[..], limiter.clone());
    let mut big = vec![0u8; 1 << 20];
    let (mut out, mut reads) = (Vec::new(), Vec::new());
    loop {
        let n = reader.read(&mut big).await.unwrap();
        if n == 0 {
            break;
        }
        reads.push(n);
        out.extend_from_slice(&big[..n]);
    }
    assert_eq!(out, bytes);
    let mut expected = vec![10_000; 9];
    expected.push(5_000);
    assert_eq!(reads, expected);
    // Nine chunks were paid by waiting; end of file was not charged.
    assert_eq!(clock.now(), us(90_000));
    assert_eq!(limiter.snapshot().unwrap().wait(), us(5_000));
    assert_eq!(reader.read(&mut big).await.unwrap(), 0);
    assert_eq!(limiter.snapshot().unwrap().wait(), us(5_000));
}

#[tokio::test(flavor = "current_thread")]
async fn reader_over_a_duplex_is_charged_exactly_what_it_reads() {
    const N: usize = 200_003;
    let (limiter, clock) = fake(MB_PER_S);
    let (mut near, far) = tokio::io::duplex(1000);
    let bytes = data(N);
    let expected = bytes.clone();
    let write = async move {
        for piece in bytes.chunks(777) {
            near.write_all(piece).await.unwrap();
        }
        drop(near); // end of file
    };
    let mut reader = ThrottledReader::new(far, limiter.clone());
    let read = async {
        let mut out = Vec::new();
        reader.read_to_end(&mut out).await.unwrap();
        out
    };
    let ((), out) = tokio::join!(write, read);
    assert_eq!(out, expected);
    // Short reads (at most 1000 bytes each) are charged what they returned.
    assert_eq!(
        clock.now() + limiter.snapshot().unwrap().wait(),
        us(N as u64)
    );
}

#[tokio::test(flavor = "current_thread")]
async fn short_writes_are_charged_once_through_credit() {
    const N: usize = 95;
    let (limiter, clock) = fake(1000.0); // chunks of 10 bytes, 10 ms each
    let inner = Recorder {
        max: Some(3),
        ..Recorder::default()
    };
    let mut writer = ThrottledWriter::new(inner, limiter.clone());
    let bytes = data(N);
    writer.write_all(&bytes).await.unwrap();
    assert_eq!(
        clock.now() + limiter.snapshot().unwrap().wait(),
        Duration::from_millis(95)
    );
    // No credit is left over: one more byte is reserved and charged.
    writer.write_all(&[0]).await.unwrap();
    assert_eq!(
        clock.now() + limiter.snapshot().unwrap().wait(),
        Duration::from_millis(96)
    );
    let inner = writer.into_inner();
    assert_eq!(inner.bytes[..N], bytes);
    assert_eq!(inner.bytes.len(), N + 1);
    assert!(inner.writes.iter().all(|&n| n <= 3));
}

#[tokio::test(flavor = "current_thread")]
async fn slow_rates_move_one_byte_at_a_time_and_fast_ones_64_kib() {
    let (limiter, clock) = fake(50.0);
    let mut writer = ThrottledWriter::new(Recorder::default(), limiter.clone());
    writer.write_all(b"hello").await.unwrap();
    assert_eq!(writer.get_ref().writes, vec![1; 5]);
    assert_eq!(clock.now(), Duration::from_millis(80));
    assert_eq!(
        limiter.snapshot().unwrap().wait(),
        Duration::from_millis(20)
    );

    let (limiter, _clock) = fake(1e9);
    let mut writer = ThrottledWriter::new(Recorder::default(), limiter);
    writer.write_all(&data(200_000)).await.unwrap();
    assert_eq!(
        writer.get_ref().writes,
        vec![MAX_CHUNK, MAX_CHUNK, MAX_CHUNK, 200_000 - 3 * MAX_CHUNK]
    );
}

#[tokio::test(flavor = "current_thread")]
async fn writer_polls_are_cancel_safe_and_never_charge_twice() {
    let (limiter, clock) = manual(1000.0); // chunks of 10 bytes, 10 ms each
    let mut writer = ThrottledWriter::new(Recorder::default(), limiter.clone());
    // An idle limiter grants the first chunk at once.
    assert!(matches!(
        poll_write(&mut writer, &[1; 10]).await,
        Poll::Ready(Ok(10))
    ));
    assert_eq!(
        limiter.snapshot().unwrap().wait(),
        Duration::from_millis(10)
    );
    // The next chunk waits for the first one's 10 ms.
    assert!(poll_write(&mut writer, &[2; 20]).await.is_pending());
    assert_eq!(
        limiter.snapshot().unwrap().wait(),
        Duration::from_millis(20)
    );
    // Polled again (the caller's future was dropped and made again, with
    // another buffer): the same reservation, not a second one.
    assert!(poll_write(&mut writer, &[3; 5]).await.is_pending());
    assert!(poll_write(&mut writer, &[3; 5]).await.is_pending());
    assert_eq!(
        limiter.snapshot().unwrap().wait(),
        Duration::from_millis(20)
    );
    clock.advance(Duration::from_millis(10));
    // Due: 5 of the 10 bytes paid for are written, 5 stay as credit.
    assert!(matches!(
        poll_write(&mut writer, &[3; 5]).await,
        Poll::Ready(Ok(5))
    ));
    assert_eq!(
        limiter.snapshot().unwrap().wait(),
        Duration::from_millis(10)
    );
    // The credit goes first, without a new reservation: exactly its 5
    // bytes of the 8.
    assert!(matches!(
        poll_write(&mut writer, &[4; 8]).await,
        Poll::Ready(Ok(5))
    ));
    assert_eq!(
        limiter.snapshot().unwrap().wait(),
        Duration::from_millis(10)
    );
    assert_eq!(writer.get_ref().writes, vec![10, 5, 5]);
    assert_eq!(writer.get_ref().bytes.len(), 20);
    // The credit is spent: the next write reserves a chunk of its own.
    assert!(poll_write(&mut writer, &[5; 10]).await.is_pending());
    assert_eq!(
        limiter.snapshot().unwrap().wait(),
        Duration::from_millis(20)
    );
}

#[tokio::test(flavor = "current_thread")]
async fn dropping_a_waiting_writer_leaves_no_debt() {
    let (limiter, _clock) = manual(1000.0);
    let mut writer = ThrottledWriter::new(tokio::io::sink(), limiter.clone());
    assert!(poll_write(&mut writer, &[0; 10]).await.is_ready());
    assert_eq!(
        limiter.snapshot().unwrap().wait(),
        Duration::from_millis(10)
    );
    assert!(poll_write(&mut writer, &[0; 100]).await.is_pending());
    assert_eq!(
        limiter.snapshot().unwrap().wait(),
        Duration::from_millis(20)
    );
    drop(writer);
    assert_eq!(
        limiter.snapshot().unwrap().wait(),
        Duration::from_millis(10)
    );

    // into_inner gives it back too.
    let mut writer = ThrottledWriter::new(tokio::io::sink(), limiter.clone());
    assert!(poll_write(&mut writer, &[0; 100]).await.is_pending());
    assert_eq!(
        limiter.snapshot().unwrap().wait(),
        Duration::from_millis(20)
    );
    let _sink = writer.into_inner();
    assert_eq!(
        limiter.snapshot().unwrap().wait(),
        Duration::from_millis(10)
    );
}

#[tokio::test(flavor = "current_thread")]
async fn reader_polls_are_cancel_safe_and_dropping_a_waiting_reader_leaves_no_debt() {
    let (limiter, clock) = manual(1000.0); // chunks of 10 bytes, 10 ms each
    let bytes = data(100);
    let mut reader = ThrottledReader::new(&bytes[..], limiter.clone());
    assert_eq!(poll_read(&mut reader, 64).await.unwrap(), bytes[..10]);
    assert_eq!(
        limiter.snapshot().unwrap().wait(),
        Duration::from_millis(10)
    );
    // The next chunk is read from the inner reader, reserved, and held.
    assert!(poll_read(&mut reader, 64).await.is_none());
    assert_eq!(reader.get_ref().len(), 80);
    assert_eq!(
        limiter.snapshot().unwrap().wait(),
        Duration::from_millis(20)
    );
    // Polled again with a smaller buffer: the same reservation.
    assert!(poll_read(&mut reader, 4).await.is_none());
    assert_eq!(
        limiter.snapshot().unwrap().wait(),
        Duration::from_millis(20)
    );
    clock.advance(Duration::from_millis(10));
    assert_eq!(poll_read(&mut reader, 4).await.unwrap(), bytes[10..14]);
    // The rest of the chunk is paid for: no new reservation.
    assert_eq!(poll_read(&mut reader, 64).await.unwrap(), bytes[14..20]);
    assert_eq!(
        limiter.snapshot().unwrap().wait(),
        Duration::from_millis(10)
    );
    // Mid-wait on the third chunk, the reader is dropped: given back.
    assert!(poll_read(&mut reader, 64).await.is_none());
    assert_eq!(
        limiter.snapshot().unwrap().wait(),
        Duration::from_millis(20)
    );
    drop(reader);
    assert_eq!(
        limiter.snapshot().unwrap().wait(),
        Duration::from_millis(10)
    );
}

/// Whatever the inner writer does (`Pending` on every other poll, 3 bytes
/// a write at most) and however often writes are dropped after one poll and
/// made again with other buffers, every byte reaches it once and in order,
/// and the schedule charges each byte once: 50 000 bytes at 1 MB/s end it
/// at 50 ms exactly.
#[tokio::test(flavor = "current_thread")]
async fn a_stuttering_inner_writer_and_dropped_writes_charge_each_byte_once() {
    const N: usize = 50_000;
    let (limiter, clock) = fake(MB_PER_S);
    let inner = Recorder {
        max: Some(3),
        stutter: true,
        ..Recorder::default()
    };
    let mut writer = ThrottledWriter::new(inner, limiter.clone());
    let bytes = data(N);
    let (mut at, mut round) = (0, 0);
    while at < N {
        round += 1;
        let end = (at + 1 + (round * 977) % 20_000).min(N);
        if round % 3 == 0 {
            // Dropped after one poll.
            if let Poll::Ready(written) = poll_write(&mut writer, &bytes[at..end]).await {
                at += written.unwrap();
            }
        } else {
            at += writer.write(&bytes[at..end]).await.unwrap();
        }
    }
    assert_eq!(writer.get_ref().bytes, bytes);
    assert_eq!(
        clock.now() + limiter.snapshot().unwrap().wait(),
        us(N as u64)
    );
}

/// Reads into buffers of 1 to 17 bytes from an inner reader that is
/// `Pending` on every other poll and hands out 5 bytes at most, every other
/// read dropped after one poll and made again: no byte is lost, changed or
/// charged twice (3 000 bytes at 1 kB/s end the schedule at 3 s).
#[tokio::test(flavor = "current_thread")]
async fn dropped_reads_into_small_buffers_lose_no_byte_and_charge_each_once() {
    const N: usize = 3_000;
    let (limiter, clock) = fake(1000.0);
    let bytes = data(N);
    let inner = Trickle {
        data: &bytes,
        polls: 0,
    };
    let mut reader = ThrottledReader::new(inner, limiter.clone());
    let mut out = Vec::new();
    for round in 1usize.. {
        let len = 1 + round % 17;
        let read = if round % 2 == 0 {
            // Dropped after one poll.
            let Some(read) = poll_read(&mut reader, len).await else {
                continue;
            };
            read
        } else {
            let mut buf = vec![0u8; len];
            let n = reader.read(&mut buf).await.unwrap();
            buf.truncate(n);
            buf
        };
        if read.is_empty() {
            break;
        }
        out.extend_from_slice(&read);
    }
    assert_eq!(out, bytes);
    assert_eq!(
        clock.now() + limiter.snapshot().unwrap().wait(),
        Duration::from_secs(3)
    );
}

/// Reads and writes of no bytes reserve nothing and wait for nothing.
#[tokio::test(flavor = "current_thread")]
async fn empty_reads_and_writes_reserve_nothing() {
    let (limiter, clock) = fake(1000.0);
    let mut writer = ThrottledWriter::new(Recorder::default(), limiter.clone());
    let bytes = data(10);
    let mut reader = ThrottledReader::new(&bytes[..], limiter.clone());
    for _ in 0..10 {
        assert_eq!(writer.write(&[]).await.unwrap(), 0);
        assert_eq!(reader.read(&mut []).await.unwrap(), 0);
    }
    assert_eq!(limiter.snapshot().unwrap().wait(), Duration::ZERO);
    assert_eq!(clock.now(), Duration::ZERO);
}

/// A limiter whose backend is down: every reservation fails.
struct Broken(FakeClock);

#[async_trait]
impl Limiter for Broken {
    async fn reserve(&self, _: u32) -> Result<Duration, Error> {
        Err(Error::InvalidArgument("broken on purpose".into()))
    }
    async fn try_reserve(&self, _: u32, _: Duration) -> Result<Option<Duration>, Error> {
        Err(Error::InvalidArgument("broken on purpose".into()))
    }
    async fn snapshot(&self) -> Result<paceline::Snapshot, Error> {
        Ok(paceline::Snapshot::waiting(Duration::ZERO, self.rate()))
    }
    fn set_rate(&self, _: f64) -> Result<(), Error> {
        Ok(())
    }
    fn rate(&self) -> f64 {
        1000.0
    }
    fn clock(&self) -> &dyn Clock {
        &self.0
    }
}

#[tokio::test(flavor = "current_thread")]
async fn limiter_errors_are_io_errors_and_nothing_moves() {
    let limiter: Box<dyn Limiter> = Box::new(Broken(FakeClock::new()));
    let mut writer = ThrottledWriter::new(Recorder::default(), limiter);
    let error = writer.write_all(b"abc").await.unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::Other);
    assert!(error.to_string().contains("broken on purpose"), "{error}");
    assert!(writer.get_ref().bytes.is_empty());
    // Still usable: the next write asks the limiter again.
    assert!(writer.write_all(b"abc").await.is_err());

    let mut reader = ThrottledReader::new(&b"abc"[..], Arc::new(Broken(FakeClock::new())));
    assert!(reader.read(&mut [0; 8]).await.is_err());
    // The 3 bytes left the inner reader and are held, unpaid, for the next
    // try, which asks the limiter again.
    assert!(reader.get_ref().is_empty());
    assert!(reader.read(&mut [0; 8]).await.is_err());
}

#[tokio::test(flavor = "current_thread")]
async fn any_handle_that_derefs_to_a_limiter_works() {
    let (limiter, _clock) = fake(MB_PER_S);
    let as_dyn: Arc<dyn Limiter> = limiter.clone();
    let leaked: &'static RateLimiter<Local, FakeClock> = Box::leak(Box::new(
        RateLimiter::builder()
            .permits_per_second(MB_PER_S)
            .clock(FakeClock::new())
            .build()
            .unwrap(),
    ));
    let boxed: Box<dyn Limiter> = Box::new(RateLimiter::bursty(MB_PER_S).unwrap());
    ThrottledWriter::new(tokio::io::sink(), limiter.clone())
        .write_all(b"a")
        .await
        .unwrap();
    ThrottledWriter::new(tokio::io::sink(), as_dyn.clone())
        .write_all(b"b")
        .await
        .unwrap();
    ThrottledWriter::new(tokio::io::sink(), leaked)
        .write_all(b"c")
        .await
        .unwrap();
    ThrottledWriter::new(tokio::io::sink(), boxed)
        .write_all(b"d")
        .await
        .unwrap();
    let mut out = Vec::new();
    ThrottledReader::new(&b"e"[..], as_dyn)
        .read_to_end(&mut out)
        .await
        .unwrap();
    assert_eq!(out, b"e");
    // Readers and writers are Send, so they can be spawned.
    fn is_send<T: Send>(_: &T) {}
    is_send(&ThrottledWriter::new(tokio::io::sink(), limiter.clone()));
    is_send(&ThrottledReader::new(tokio::io::empty(), limiter));
}

/// A reader or writer wrapped into a body that asks for `Send + Sync` (a
/// file streamed as a request body) is both, whatever its pending chunk
/// waits on.
#[test]
fn readers_and_writers_are_sync_for_bodies_that_ask_it() {
    fn assert_send_sync<T: Send + Sync + 'static>(_: &T) {}
    let limiter: Arc<dyn Limiter> = Arc::new(RateLimiter::bursty(MB_PER_S).unwrap());
    assert_send_sync(&ThrottledReader::new(tokio::io::empty(), limiter.clone()));
    assert_send_sync(&ThrottledWriter::new(tokio::io::sink(), limiter));
}

/// 1 MiB at 2 MiB/s with no burst: 0.5 s on the schedule. The copy returns
/// when its last chunk is granted, up to one chunk (10 ms) before the
/// schedule ends, so never before 0.49 s whatever the machine does; late
/// timer wake-ups only add (within 5% on a quiet machine, each one shorter
/// than a chunk being absorbed; a loaded one may add more, so the upper
/// bound here only says the copy does not stall).
const MIB: usize = 1024 * 1024;
const REAL_RATE: f64 = 2.0 * MIB as f64;

fn real_limiter() -> Arc<RateLimiter> {
    Arc::new(
        RateLimiter::builder()
            .permits_per_second(REAL_RATE)
            .max_burst(Duration::ZERO)
            .build()
            .unwrap(),
    )
}

fn assert_half_a_second(what: &str, elapsed: Duration, debt: Duration) {
    println!("{what}: 1 MiB at 2 MiB/s in {elapsed:?} (+ {debt:?} left as debt)");
    assert!(
        (0.49..=5.0).contains(&elapsed.as_secs_f64()),
        "{what}: {elapsed:?}, expected 0.5 s (and never less than 0.49 s)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn real_clock_writer_copies_1_mib_at_2_mib_per_s_in_half_a_second() {
    let limiter = real_limiter();
    let bytes = data(MIB);
    let mut writer = ThrottledWriter::new(tokio::io::sink(), limiter.clone());
    let start = Instant::now();
    let copied = tokio::io::copy(&mut &bytes[..], &mut writer).await.unwrap();
    let elapsed = start.elapsed();
    assert_eq!(copied, MIB as u64);
    assert_half_a_second("writer", elapsed, limiter.snapshot().unwrap().wait());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn real_clock_reader_copies_1_mib_at_2_mib_per_s_in_half_a_second() {
    let limiter = real_limiter();
    let bytes = data(MIB);
    let mut reader = ThrottledReader::new(&bytes[..], limiter.clone());
    let start = Instant::now();
    let copied = tokio::io::copy(&mut reader, &mut tokio::io::sink())
        .await
        .unwrap();
    let elapsed = start.elapsed();
    assert_eq!(copied, MIB as u64);
    assert_half_a_second("reader", elapsed, limiter.snapshot().unwrap().wait());
}

/// 1 MB/s with a burst of one byte and, second, 1 kB/s with a burst of
/// 1 kB: the second limit is the slowest, and the one that binds.
fn slow_second_limit(clock: &FakeClock) -> Arc<RateLimiter<Local, FakeClock>> {
    Arc::new(
        RateLimiter::builder()
            .limit(paceline::Limit::per_second(MB_PER_S).burst(1))
            .limit(paceline::Limit::per_second(1_000.0).burst(1_000))
            .clock(clock.clone())
            .build()
            .unwrap(),
    )
}

/// With several limits, a chunk is 10 ms of the slowest one's rate: one
/// write of 100 kB moves 10 bytes at once, and the next waits about 10 ms.
/// Sized by the first limit's rate, one write moved 10 000 bytes at once
/// (ten times the slow limit's burst), and the next waited 9 s.
#[tokio::test]
async fn a_writers_chunk_follows_the_slowest_limit_not_the_first() {
    let clock = FakeClock::new();
    let limiter = slow_second_limit(&clock);
    assert_eq!(
        (limiter.rate(), limiter.slowest_rate()),
        (MB_PER_S, 1_000.0)
    );
    let mut writer = ThrottledWriter::new(Vec::new(), limiter);
    let data = data(100_000);
    let first = writer.write(&data).await.unwrap();
    assert_eq!((first, clock.now()), (10, Duration::ZERO));
    let second = writer.write(&data[first..]).await.unwrap();
    assert_eq!(second, 10);
    assert!(clock.now() <= us(10_000), "waited {:?}", clock.now());
}

/// The same for the reader.
#[tokio::test]
async fn a_readers_chunk_follows_the_slowest_limit_not_the_first() {
    let clock = FakeClock::new();
    let data = data(100_000);
    let mut reader = ThrottledReader::new(&data[..], slow_second_limit(&clock));
    let mut buf = vec![0u8; 100_000];
    let first = reader.read(&mut buf).await.unwrap();
    assert_eq!((first, clock.now()), (10, Duration::ZERO));
}
