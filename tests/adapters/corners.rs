//! Probes of the adapters' documented promises at their corners: streams,
//! byte readers and writers, tower services.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::{self, FusedStream};
use futures::{Stream, StreamExt};
use paceline::clock::{Clock, FakeClock};
use paceline::io::{ThrottledReader, ThrottledWriter};
use paceline::stream::ThrottleExt;
use paceline::{Error, KeyedRateLimiter, Limit, Limiter, Local, RateLimiter};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::common::{manual, noop};
use crate::support::manual::ManualClock;

const MS: Duration = Duration::from_millis(1);

/// Two limits: 10/s with a burst of 5, and 30 per 10 s with a burst of 2.
fn two_limits<C: Clock + Clone>(clock: &C) -> RateLimiter<Local, C> {
    RateLimiter::builder()
        .limit(Limit::per_second(10.0).burst(5))
        .limit(Limit::per(30.0, Duration::from_secs(10)).burst(2))
        .clock(clock.clone())
        .build()
        .unwrap()
}

// ---------------------------------------------------------------- stream

/// A throttled stream releases each item exactly when a caller acquiring
/// the same permits in turn would be let through: same schedule, with two
/// limits, free items, and items bigger than either burst.
#[tokio::test(flavor = "current_thread")]
async fn stream_schedule_equals_sequential_acquires_with_two_limits() {
    let costs = [1u32, 0, 3, 7, 0, 1, 1, 12, 2, 0, 1, 5, 1, 1, 1, 40, 1];
    let clock_a = FakeClock::new();
    let limiter_a = two_limits(&clock_a);
    let mut released = Vec::new();
    let mut throttled = stream::iter(costs).throttle_by(&limiter_a, |c: &u32| *c);
    while let Some(item) = throttled.next().await {
        released.push((item.unwrap(), clock_a.now()));
    }
    drop(throttled);

    let clock_b = FakeClock::new();
    let limiter_b = two_limits(&clock_b);
    let mut expected = Vec::new();
    for cost in costs {
        if cost != 0 {
            limiter_b.acquire(cost).await.unwrap();
        }
        expected.push((cost, clock_b.now()));
    }
    assert_eq!(released, expected);
    assert_eq!(
        limiter_a.snapshot().unwrap().wait(),
        limiter_b.snapshot().unwrap().wait()
    );
}

/// The same with warming-up limiters: two limits, one warming up.
#[tokio::test(flavor = "current_thread")]
async fn stream_schedule_equals_sequential_acquires_warming_up() {
    fn warm(clock: &FakeClock) -> RateLimiter<Local, FakeClock> {
        RateLimiter::builder()
            .limit(Limit::per_second(10.0).warmup(Duration::from_secs(2)))
            .limit(Limit::per(50.0, Duration::from_secs(10)).burst(3))
            .clock(clock.clone())
            .build()
            .unwrap()
    }
    let costs = [1u32, 0, 3, 7, 0, 1, 1, 12, 2, 0, 1, 5, 1, 1, 1, 40, 1, 1, 1];
    for pause in [Duration::ZERO, Duration::from_secs(30)] {
        let clock_a = FakeClock::new();
        let limiter_a = warm(&clock_a);
        clock_a.advance(pause);
        let mut released = Vec::new();
        let mut throttled = stream::iter(costs).throttle_by(&limiter_a, |c: &u32| *c);
        while let Some(item) = throttled.next().await {
            released.push((item.unwrap(), clock_a.now()));
        }
        drop(throttled);
        let clock_b = FakeClock::new();
        let limiter_b = warm(&clock_b);
        clock_b.advance(pause);
        let mut expected = Vec::new();
        for cost in costs {
            if cost != 0 {
                limiter_b.acquire(cost).await.unwrap();
            }
            expected.push((cost, clock_b.now()));
        }
        assert_eq!(released, expected, "pause {pause:?}");
        assert_eq!(
            limiter_a.snapshot().unwrap().wait(),
            limiter_b.snapshot().unwrap().wait()
        );
    }
}

/// A stream dropped mid-wait on a limiter of two limits, one warming up:
/// the limiter is left as if the item had never been reserved (its next
/// waits equal a twin's that never saw it).
#[tokio::test(flavor = "current_thread")]
async fn stream_dropped_mid_wait_gives_back_exactly_with_two_limits() {
    fn warm(clock: &ManualClock) -> Arc<RateLimiter<Local, ManualClock>> {
        Arc::new(
            RateLimiter::builder()
                .limit(Limit::per_second(10.0).warmup(Duration::from_secs(2)))
                .limit(Limit::per(50.0, Duration::from_secs(10)).burst(3))
                .clock(clock.clone())
                .build()
                .unwrap(),
        )
    }
    let (clock_a, clock_b) = (ManualClock::default(), ManualClock::default());
    let (a, b) = (warm(&clock_a), warm(&clock_b));
    clock_a.advance(Duration::from_secs(5));
    clock_b.advance(Duration::from_secs(5));
    for permits in [2, 1, 4] {
        a.reserve(permits).unwrap();
        b.reserve(permits).unwrap();
    }
    let mut throttled = stream::iter([9u32]).throttle_by(a.clone(), |n: &u32| *n);
    assert!(throttled.poll_next_unpin(&mut noop()).is_pending());
    assert!(a.snapshot().unwrap().wait() > b.snapshot().unwrap().wait());
    drop(throttled);
    for step in 0..6 {
        assert_eq!(
            a.snapshot().unwrap().wait(),
            b.snapshot().unwrap().wait(),
            "step {step}"
        );
        assert_eq!(a.reserve(1).unwrap(), b.reserve(1).unwrap(), "step {step}");
        clock_a.advance(150 * MS);
        clock_b.advance(150 * MS);
    }
}

/// A keyed stream dropped while an item waits gives that key's permits
/// back, and only that key's.
#[tokio::test(flavor = "current_thread")]
async fn keyed_stream_dropped_mid_wait_gives_the_keys_permits_back() {
    let clock = ManualClock::default();
    let keyed = Arc::new(
        KeyedRateLimiter::<u32>::builder()
            .permits_per_second(10.0)
            .max_burst(Duration::ZERO)
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let items = [(1u32, 2u32), (2, 1), (1, 3)];
    let mut throttled =
        stream::iter(items).throttle_keyed(keyed.clone(), |&(k, n): &(u32, u32)| (k, n));
    let mut cx = noop();
    assert!(matches!(
        throttled.poll_next_unpin(&mut cx),
        Poll::Ready(Some(Ok((1, 2))))
    ));
    assert!(matches!(
        throttled.poll_next_unpin(&mut cx),
        Poll::Ready(Some(Ok((2, 1))))
    ));
    assert_eq!(keyed.snapshot(&1).unwrap().wait(), 200 * MS);
    // Key 1's 3 permits wait 200 ms.
    assert!(throttled.poll_next_unpin(&mut cx).is_pending());
    assert_eq!(keyed.snapshot(&1).unwrap().wait(), 500 * MS);
    assert_eq!(keyed.snapshot(&2).unwrap().wait(), 100 * MS);
    drop(throttled);
    assert_eq!(keyed.snapshot(&1).unwrap().wait(), 200 * MS);
    assert_eq!(keyed.snapshot(&2).unwrap().wait(), 100 * MS);
}

/// Many keys, one hot: items keep their order, the hot key's items hold
/// back the cold keys' behind them, and every key is charged its own.
#[tokio::test(flavor = "current_thread")]
async fn keyed_stream_with_a_hot_key_keeps_order_and_charges_each_key() {
    let clock = FakeClock::new();
    let keyed = KeyedRateLimiter::<u32>::builder()
        .permits_per_second(10.0)
        .max_burst(Duration::ZERO)
        .clock(clock.clone())
        .build()
        .unwrap();
    // Key 0 is hot: every other item; keys 1..=50 once each.
    let items: Vec<u32> = (1..=50).flat_map(|k| [0, k]).collect();
    let mut throttled = stream::iter(items.clone()).throttle_keyed(&keyed, |&k: &u32| (k, 1));
    let mut released = Vec::new();
    while let Some(item) = throttled.next().await {
        released.push((item.unwrap(), clock.now()));
    }
    assert_eq!(released.iter().map(|r| r.0).collect::<Vec<_>>(), items);
    // The hot key's 50 items: 100 ms apart, the first at once.
    for (i, (_, at)) in released.iter().step_by(2).enumerate() {
        assert_eq!(*at, 100 * MS * i as u32, "hot item {i}");
    }
    // Each cold item goes with the hot item before it.
    for pair in released.chunks(2) {
        assert_eq!(pair[0].1, pair[1].1);
    }
    assert_eq!(keyed.snapshot(&0).unwrap().wait(), 100 * MS);
    for k in 1..=50 {
        assert_eq!(
            keyed.snapshot(&k).unwrap().wait(),
            (released[2 * k as usize - 1].1 + 100 * MS).saturating_sub(clock.now()),
            "key {k}"
        );
    }
}

/// An inner stream that is pending between items: nothing is reserved
/// while it is, end of stream is seen once and polling after it stays
/// `None`, without polling the inner stream again.
#[tokio::test(flavor = "current_thread")]
async fn stream_inner_pending_and_poll_after_end() {
    let (limiter, clock) = manual(10.0);
    let (tx, rx) = futures::channel::mpsc::unbounded::<u32>();
    let mut throttled = rx.throttle(limiter.clone());
    let mut cx = noop();
    assert!(throttled.poll_next_unpin(&mut cx).is_pending());
    assert_eq!(limiter.snapshot().unwrap().wait(), Duration::ZERO);
    tx.unbounded_send(1).unwrap();
    tx.unbounded_send(2).unwrap();
    assert!(matches!(
        throttled.poll_next_unpin(&mut cx),
        Poll::Ready(Some(Ok(1)))
    ));
    // The second waits 100 ms; the channel closes meanwhile.
    assert!(throttled.poll_next_unpin(&mut cx).is_pending());
    drop(tx);
    assert_eq!(limiter.snapshot().unwrap().wait(), 200 * MS);
    assert_eq!(throttled.size_hint().0, 1);
    assert!(!throttled.is_terminated());
    clock.advance(100 * MS);
    assert!(matches!(
        throttled.poll_next_unpin(&mut cx),
        Poll::Ready(Some(Ok(2)))
    ));
    assert!(matches!(
        throttled.poll_next_unpin(&mut cx),
        Poll::Ready(None)
    ));
    assert!(throttled.is_terminated());
    assert!(matches!(
        throttled.poll_next_unpin(&mut cx),
        Poll::Ready(None)
    ));
    assert_eq!(throttled.size_hint(), (0, Some(0)));
    // The second item was paid: 100 ms owed, nothing more.
    assert_eq!(limiter.snapshot().unwrap().wait(), 100 * MS);
}

/// A limiter of our own whose reservations fail every other call.
struct Flaky {
    calls: AtomicU32,
    clock: FakeClock,
}

#[async_trait]
impl Limiter for Flaky {
    async fn reserve(&self, _: u32) -> Result<Duration, Error> {
        if self.calls.fetch_add(1, Ordering::Relaxed).is_multiple_of(2) {
            Err(Error::Backend(paceline::BackendError::new("down")))
        } else {
            Ok(Duration::ZERO)
        }
    }
    async fn try_reserve(&self, permits: u32, _: Duration) -> Result<Option<Duration>, Error> {
        self.reserve(permits).await.map(Some)
    }
    async fn snapshot(&self) -> Result<paceline::Snapshot, Error> {
        Ok(paceline::Snapshot::waiting(Duration::ZERO, 1000.0))
    }
    fn set_rate(&self, _: f64) -> Result<(), Error> {
        Ok(())
    }
    fn rate(&self) -> f64 {
        1000.0
    }
    fn clock(&self) -> &dyn Clock {
        &self.clock
    }
}

/// A keyed stream's limiter error yields the item; the stream goes on.
#[tokio::test(flavor = "current_thread")]
async fn stream_errors_yield_the_item_for_a_boxed_dyn_limiter() {
    let limiter: Box<dyn Limiter> = Box::new(Flaky {
        calls: AtomicU32::new(0),
        clock: FakeClock::new(),
    });
    let out: Vec<_> = stream::iter([1, 2, 3, 4])
        .throttle(limiter)
        .map(|r| r.map_err(|e| e.into_parts().0))
        .collect()
        .await;
    assert_eq!(out, [Err(1), Ok(2), Err(3), Ok(4)]);
}

// ---------------------------------------------------------------- io

/// An inner writer that accepts at most `max` bytes a write, or fails.
struct Short {
    max: usize,
    fail_next: bool,
    written: Vec<u8>,
}

impl AsyncWrite for Short {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if std::mem::take(&mut this.fail_next) {
            return Poll::Ready(Err(std::io::Error::other("inner failed")));
        }
        let n = buf.len().min(this.max);
        this.written.extend_from_slice(&buf[..n]);
        Poll::Ready(Ok(n))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// An inner writer error after the chunk was paid keeps it as credit: the
/// retry is not charged again.
#[tokio::test(flavor = "current_thread")]
async fn writer_inner_error_keeps_the_paid_chunk_as_credit() {
    let (limiter, clock) = manual(1000.0); // 10-byte chunks
    let mut writer = ThrottledWriter::new(
        Short {
            max: usize::MAX,
            fail_next: true,
            written: Vec::new(),
        },
        limiter.clone(),
    );
    let mut cx = noop();
    let r = Pin::new(&mut writer).poll_write(&mut cx, &[1; 10]);
    assert!(matches!(r, Poll::Ready(Err(_))));
    assert_eq!(limiter.snapshot().unwrap().wait(), 10 * MS);
    let r = Pin::new(&mut writer).poll_write(&mut cx, &[1; 10]);
    assert!(matches!(r, Poll::Ready(Ok(10))), "{r:?}");
    assert_eq!(limiter.snapshot().unwrap().wait(), 10 * MS);
    clock.advance(10 * MS);
    assert_eq!(limiter.snapshot().unwrap().wait(), Duration::ZERO);
}

/// Every byte that reaches the inner writer is charged exactly once, with
/// a writer that takes 3 bytes a write, through write_all, write_vectored,
/// flush and shutdown.
#[tokio::test(flavor = "current_thread")]
async fn writer_short_writes_and_vectored_writes_charge_each_byte_once() {
    let clock = FakeClock::new();
    let limiter = Arc::new(
        RateLimiter::builder()
            .permits_per_second(1000.0)
            .max_burst(Duration::ZERO)
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let mut writer = ThrottledWriter::new(
        Short {
            max: 3,
            fail_next: false,
            written: Vec::new(),
        },
        limiter.clone(),
    );
    writer.write_all(&[1; 25]).await.unwrap();
    let bufs = [
        std::io::IoSlice::new(&[2; 4]),
        std::io::IoSlice::new(&[3; 4]),
    ];
    let mut n = 0;
    while n < 1 {
        n = writer.write_vectored(&bufs).await.unwrap();
    }
    writer.flush().await.unwrap();
    writer.shutdown().await.unwrap();
    let written = writer.get_ref().written.len();
    // Charged: what was written, plus at most one chunk of credit.
    let charged = clock.now() + limiter.snapshot().unwrap().wait();
    assert!(charged >= MS * written as u32, "{charged:?} for {written}");
    assert!(
        charged < MS * (written as u32 + 10),
        "{charged:?} for {written}"
    );
}

/// `set_rate` while a writer is mid-stream: the next chunk follows the new
/// rate.
#[tokio::test(flavor = "current_thread")]
async fn writer_chunk_follows_set_rate() {
    #[derive(Default)]
    struct Sizes(Vec<usize>);
    impl AsyncWrite for Sizes {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            self.get_mut().0.push(buf.len());
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }
    let clock = FakeClock::new();
    let limiter = Arc::new(
        RateLimiter::builder()
            .permits_per_second(100_000.0)
            .max_burst(Duration::ZERO)
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let mut writer = ThrottledWriter::new(Sizes::default(), limiter.clone());
    writer.write_all(&[0; 2000]).await.unwrap();
    limiter.set_rate(10_000.0).unwrap();
    writer.write_all(&[0; 300]).await.unwrap();
    assert_eq!(writer.get_ref().0, [1000, 1000, 100, 100, 100]);
}

/// A reader whose inner reader returns fewer bytes than asked, then end of
/// file: charged what it returned, EOF free; a reader's `into_inner` while
/// its chunk waits gives the reservation back.
#[tokio::test(flavor = "current_thread")]
async fn reader_into_inner_mid_wait_gives_back() {
    let (limiter, _clock) = manual(1000.0); // 10-byte chunks
    let data = [7u8; 30];
    let mut reader = ThrottledReader::new(&data[..], limiter.clone());
    let mut cx = noop();
    let mut storage = [0u8; 64];
    let mut buf = ReadBuf::new(&mut storage);
    assert!(matches!(
        Pin::new(&mut reader).poll_read(&mut cx, &mut buf),
        Poll::Ready(Ok(()))
    ));
    assert_eq!(buf.filled().len(), 10);
    assert_eq!(limiter.snapshot().unwrap().wait(), 10 * MS);
    let mut buf = ReadBuf::new(&mut storage);
    assert!(
        Pin::new(&mut reader)
            .poll_read(&mut cx, &mut buf)
            .is_pending()
    );
    assert_eq!(limiter.snapshot().unwrap().wait(), 20 * MS);
    let rest = reader.into_inner();
    assert_eq!(rest.len(), 10);
    assert_eq!(limiter.snapshot().unwrap().wait(), 10 * MS);
}

/// An inner reader that hands out 3 bytes a read then fails once, then
/// goes on.
struct ErrOnce {
    data: Vec<u8>,
    reads: usize,
}

impl AsyncRead for ErrOnce {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        this.reads += 1;
        if this.reads == 2 {
            return Poll::Ready(Err(std::io::Error::other("inner read failed")));
        }
        let n = this.data.len().min(3).min(buf.remaining());
        buf.put_slice(&this.data[..n]);
        this.data.drain(..n);
        Poll::Ready(Ok(()))
    }
}

/// Inner read errors are charged nothing; short reads their bytes.
#[tokio::test(flavor = "current_thread")]
async fn reader_inner_error_charges_nothing() {
    let clock = FakeClock::new();
    let limiter = Arc::new(
        RateLimiter::builder()
            .permits_per_second(1000.0)
            .max_burst(Duration::ZERO)
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let mut reader = ThrottledReader::new(
        ErrOnce {
            data: vec![1; 10],
            reads: 0,
        },
        limiter.clone(),
    );
    let mut out = Vec::new();
    let first = tokio::io::AsyncReadExt::read_to_end(&mut reader, &mut out).await;
    assert!(first.is_err());
    tokio::io::AsyncReadExt::read_to_end(&mut reader, &mut out)
        .await
        .unwrap();
    assert_eq!(out.len(), 10);
    assert_eq!(clock.now() + limiter.snapshot().unwrap().wait(), 10 * MS);
}

// ---------------------------------------------------------------- tower

#[cfg(feature = "tower")]
mod tower_probes {
    use super::*;
    use paceline::tower::{RateLimitLayer, Throttled};
    use tower_layer::Layer;
    use tower_service::Service;

    use crate::common::Counter;

    async fn ready<S: Service<u32>>(service: &mut S) -> Result<(), S::Error> {
        std::future::poll_fn(|cx| service.poll_ready(cx)).await
    }

    /// With two limits, a refusal's `retry_after` is the binding limit's
    /// wait, and the refusal reserves nothing in either limit.
    #[tokio::test(flavor = "current_thread")]
    async fn tower_refusal_with_two_limits_reserves_nothing_and_says_the_wait() {
        let clock = FakeClock::new();
        let limiter = Arc::new(
            RateLimiter::builder()
                .limit(Limit::per_second(10.0).burst(1))
                .limit(Limit::per(60.0, Duration::from_secs(60)).burst(1))
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
        let counter = Counter::default();
        let layer = RateLimitLayer::new(limiter.clone()).max_wait(500 * MS);
        let mut service = layer.layer(counter.clone());
        ready(&mut service).await.unwrap();
        service.call(1).await.unwrap();
        ready(&mut service).await.unwrap();
        let refused = service.call(2).await.unwrap_err();
        let throttled = refused.downcast_ref::<Throttled>().expect("Throttled");
        assert_eq!(throttled.retry_after, Duration::from_secs(1));
        assert_eq!(counter.0.load(Ordering::Relaxed), 1);
        assert_eq!(limiter.snapshot().unwrap().wait(), Duration::from_secs(1));
        clock.advance(Duration::from_secs(1));
        ready(&mut service).await.unwrap();
        assert_eq!(service.call(3).await.unwrap(), 3);
        assert_eq!(clock.now(), Duration::from_secs(1));
    }

    /// A clone made while the original waits starts without a permit;
    /// each holds its own, and dropping one gives only its own back.
    #[tokio::test(flavor = "current_thread")]
    async fn tower_clone_mid_wait_holds_its_own_permit() {
        let (limiter, clock) = manual(10.0);
        let layer = RateLimitLayer::new(limiter.clone());
        let mut first = layer.layer(Counter::default());
        let mut cx = noop();
        assert!(matches!(first.poll_ready(&mut cx), Poll::Ready(Ok(()))));
        first.call(0).await.unwrap();
        assert!(first.poll_ready(&mut cx).is_pending());
        assert_eq!(limiter.snapshot().unwrap().wait(), 200 * MS);
        let mut second = first.clone();
        assert_eq!(limiter.snapshot().unwrap().wait(), 200 * MS);
        assert!(second.poll_ready(&mut cx).is_pending());
        assert_eq!(limiter.snapshot().unwrap().wait(), 300 * MS);
        drop(first);
        assert_eq!(limiter.snapshot().unwrap().wait(), 200 * MS);
        clock.advance(200 * MS);
        assert!(matches!(second.poll_ready(&mut cx), Poll::Ready(Ok(()))));
        assert_eq!(second.call(5).await.unwrap(), 5);
        assert_eq!(limiter.snapshot().unwrap().wait(), Duration::ZERO);
    }

    /// `call` without `poll_ready` panics (the tower contract), and the
    /// service is not called.
    #[tokio::test(flavor = "current_thread")]
    #[should_panic(expected = "before poll_ready")]
    async fn tower_call_without_poll_ready_panics() {
        let (limiter, _clock) = manual(10.0);
        let mut service = RateLimitLayer::new(limiter).layer(Counter::default());
        drop(service.call(1));
    }

    /// A limiter error surfaces from `call` as the crate's `Error`, without
    /// calling the inner service; the next request tries afresh.
    #[tokio::test(flavor = "current_thread")]
    async fn tower_limiter_errors_surface_from_call() {
        let limiter: Arc<dyn Limiter> = Arc::new(Flaky {
            calls: AtomicU32::new(0),
            clock: FakeClock::new(),
        });
        for layer in [
            RateLimitLayer::new(limiter.clone()),
            RateLimitLayer::new(limiter.clone()).max_wait(MS),
        ] {
            let counter = Counter::default();
            let mut service = layer.layer(counter.clone());
            ready(&mut service).await.unwrap();
            let error = service.call(1).await.unwrap_err();
            assert!(
                matches!(error.downcast_ref::<Error>(), Some(Error::Backend(_))),
                "{error}"
            );
            assert_eq!(counter.0.load(Ordering::Relaxed), 0);
            ready(&mut service).await.unwrap();
            assert_eq!(service.call(2).await.unwrap(), 2);
            assert_eq!(counter.0.load(Ordering::Relaxed), 1);
        }
    }

    /// A refusal found by `poll_ready` is not re-checked by a later
    /// `poll_ready`: a second later, with a permit free, `call` is still
    /// refused with the old `retry_after`.
    #[tokio::test(flavor = "current_thread")]
    async fn tower_a_refusal_is_rechecked_by_a_later_poll_ready() {
        let clock = FakeClock::new();
        let limiter = Arc::new(
            RateLimiter::builder()
                .permits_per_second(1.0)
                .max_burst(Duration::ZERO)
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
        let mut service = RateLimitLayer::new(limiter.clone())
            .max_wait(Duration::ZERO)
            .layer(Counter::default());
        ready(&mut service).await.unwrap();
        service.call(1).await.unwrap();
        ready(&mut service).await.unwrap(); // refused: 1 s to wait
        clock.advance(Duration::from_secs(2));
        assert_eq!(limiter.snapshot().unwrap().wait(), Duration::ZERO);
        ready(&mut service).await.unwrap();
        let answer = service.call(2).await;
        assert_eq!(answer.map_err(|e| e.to_string()).unwrap(), 2);
    }

    /// The keyed layer's refusal: `Throttled` with the key's wait, nothing
    /// reserved; another key goes at once.
    #[tokio::test(flavor = "current_thread")]
    async fn tower_keyed_refusal_reserves_nothing() {
        let clock = FakeClock::new();
        let keyed = Arc::new(
            KeyedRateLimiter::<u32>::builder()
                .limit(Limit::per_second(10.0).burst(1))
                .limit(Limit::per(60.0, Duration::from_secs(60)).burst(1))
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
        let counter = Counter::default();
        let layer = RateLimitLayer::keyed(keyed.clone(), |r: &u32| *r % 2).max_wait(500 * MS);
        let mut service = layer.layer(counter.clone());
        ready(&mut service).await.unwrap();
        service.call(2).await.unwrap();
        ready(&mut service).await.unwrap();
        let refused = service.call(4).await.unwrap_err();
        let throttled = refused.downcast_ref::<Throttled>().expect("Throttled");
        assert_eq!(throttled.retry_after, Duration::from_secs(1));
        assert_eq!(keyed.snapshot(&0).unwrap().wait(), Duration::from_secs(1));
        ready(&mut service).await.unwrap();
        assert_eq!(service.call(3).await.unwrap(), 3);
        assert_eq!(counter.0.load(Ordering::Relaxed), 2);
        assert_eq!(clock.now(), Duration::ZERO);
    }
}

/// A keyed stream's pending item whose key is evicted at the cap, then
/// used afresh: dropping the stream gives nothing back to the new entry
/// (its reservation belonged to the evicted one).
#[tokio::test(flavor = "current_thread")]
async fn keyed_stream_give_back_after_its_key_was_evicted_takes_nothing_from_the_new_entry() {
    let clock = ManualClock::default();
    let keyed = Arc::new(
        KeyedRateLimiter::<u32>::builder()
            .permits_per_second(10.0)
            .max_burst(Duration::ZERO)
            .max_keys(2)
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    keyed.reserve(&1, 1).unwrap();
    let mut throttled =
        stream::iter([(1u32, 3u32)]).throttle_keyed(keyed.clone(), |&(k, n): &(u32, u32)| (k, n));
    assert!(throttled.poll_next_unpin(&mut noop()).is_pending());
    assert_eq!(keyed.snapshot(&1).unwrap().wait(), 400 * MS);
    // Keys owing more than key 1 push it out at the cap.
    for k in 2..10 {
        keyed.reserve(&k, 20).unwrap();
    }
    assert!(keyed.stats().dropped_unfinished >= 1, "{:?}", keyed.stats());
    // Key 1 is held afresh and owes 100 ms + 500 ms.
    keyed.reserve(&1, 1).unwrap();
    keyed.reserve(&1, 5).unwrap();
    let owed = keyed.snapshot(&1).unwrap().wait();
    assert_eq!(owed, 600 * MS);
    drop(throttled);
    assert!(
        keyed.snapshot(&1).unwrap().wait() >= owed,
        "{:?} < {owed:?}",
        keyed.snapshot(&1).unwrap().wait()
    );
}

#[cfg(feature = "tower")]
mod tower_bounded {
    use super::*;
    use paceline::tower::RateLimitLayer;
    use tower_layer::Layer;
    use tower_service::Service;

    #[derive(Clone, Default)]
    struct Echo;
    impl Service<u32> for Echo {
        type Response = u32;
        type Error = std::io::Error;
        type Future = std::future::Ready<Result<u32, std::io::Error>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, request: u32) -> Self::Future {
            std::future::ready(Ok(request))
        }
    }

    /// The bounded mode's wait, dropped, gives its permit back as the
    /// waiting mode's does.
    #[tokio::test(flavor = "current_thread")]
    async fn tower_bounded_wait_dropped_gives_its_permit_back() {
        let (limiter, _clock) = manual(10.0);
        let layer = RateLimitLayer::new(limiter.clone()).max_wait(Duration::from_secs(1));
        let mut first = layer.layer(Echo);
        let mut cx = noop();
        assert!(matches!(first.poll_ready(&mut cx), Poll::Ready(Ok(()))));
        first.call(1).await.unwrap();
        let mut second = layer.layer(Echo);
        assert!(second.poll_ready(&mut cx).is_pending());
        assert_eq!(limiter.snapshot().unwrap().wait(), 200 * MS);
        drop(second);
        assert_eq!(limiter.snapshot().unwrap().wait(), 100 * MS);
    }
}

/// A limiter of our own whose first reservation panics.
struct PanicsOnce {
    calls: AtomicU32,
    clock: FakeClock,
}

#[async_trait]
impl Limiter for PanicsOnce {
    async fn reserve(&self, _: u32) -> Result<Duration, Error> {
        if self.calls.fetch_add(1, Ordering::Relaxed) == 0 {
            panic!("the limiter's own panic");
        }
        Ok(Duration::ZERO)
    }
    async fn try_reserve(&self, permits: u32, _: Duration) -> Result<Option<Duration>, Error> {
        self.reserve(permits).await.map(Some)
    }
    async fn snapshot(&self) -> Result<paceline::Snapshot, Error> {
        Ok(paceline::Snapshot::waiting(Duration::ZERO, 1000.0))
    }
    fn set_rate(&self, _: f64) -> Result<(), Error> {
        Ok(())
    }
    fn rate(&self) -> f64 {
        1000.0
    }
    fn clock(&self) -> &dyn Clock {
        &self.clock
    }
}

/// A writer polled again after its limiter panicked answers the io error
/// the code has for it ("the limiter was lost to a panic"), not a second
/// panic of its own.
#[test]
fn writer_polled_after_its_limiter_panicked_answers_an_error() {
    let limiter: Arc<dyn Limiter> = Arc::new(PanicsOnce {
        calls: AtomicU32::new(0),
        clock: FakeClock::new(),
    });
    let mut writer = ThrottledWriter::new(Vec::<u8>::new(), limiter);
    let first = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Pin::new(&mut writer).poll_write(&mut noop(), &[1; 4])
    }));
    assert!(first.is_err(), "the limiter's panic");
    let second = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Pin::new(&mut writer).poll_write(&mut noop(), &[1; 4])
    }));
    let second = second.map_err(|panic| {
        panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
    });
    assert!(matches!(second, Ok(Poll::Ready(Err(_)))), "{second:?}");
}

#[cfg(feature = "redis")]
mod redis_probes {
    use super::*;
    use crate::support::poll::patient_backend;
    use crate::support::redis_server::RedisServer;
    use paceline::redis::Fallback;
    use std::time::Instant;

    /// Records each write's size.
    #[derive(Default)]
    struct Sizes(Vec<usize>);
    impl AsyncWrite for Sizes {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            self.get_mut().0.push(buf.len());
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// Behind a Redis limiter of two limits, a writer's chunk follows the
    /// slowest (100 bytes/s: 1 byte), not the first (100 kB/s: 1000).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_writer_chunk_follows_the_slowest_limit() {
        let server = RedisServer::start();
        let backend = patient_backend(server.client()).await;
        let limiter: Arc<dyn Limiter> = Arc::new(
            RateLimiter::builder()
                .redis(&backend, "probe-io-slowest")
                .limit(Limit::per_second(100_000.0))
                .limit(Limit::per(6000.0, Duration::from_secs(60)))
                .build()
                .unwrap(),
        );
        assert_eq!(limiter.slowest_rate(), 100.0);
        let mut writer = ThrottledWriter::new(Sizes::default(), limiter);
        assert_eq!(writer.write(&[0; 1000]).await.unwrap(), 1);
        assert_eq!(writer.get_ref().0, [1]);
    }

    /// A stream over a Redis limiter dropped while an item waits gives the
    /// item's permits back (in the background, soon).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_stream_dropped_mid_wait_gives_back() {
        let server = RedisServer::start();
        let backend = patient_backend(server.client()).await;
        let limiter: Arc<dyn Limiter> = Arc::new(
            RateLimiter::builder()
                .permits_per_second(10.0)
                .max_burst(Duration::ZERO)
                .redis(&backend, "probe-stream-drop")
                .build()
                .unwrap(),
        );
        limiter.reserve(1).await.unwrap();
        let mut throttled = stream::iter([20u32]).throttle_by(limiter.clone(), |n: &u32| *n);
        // The item waits about 100 ms; stop it after 30.
        assert!(
            tokio::time::timeout(30 * MS, throttled.next())
                .await
                .is_err()
        );
        let with = limiter.snapshot().await.unwrap().wait();
        assert!(with > Duration::from_millis(1500), "{with:?}");
        drop(throttled);
        let start = Instant::now();
        loop {
            let wait = limiter.snapshot().await.unwrap().wait();
            if wait <= 100 * MS {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(2),
                "still owes {wait:?}"
            );
            tokio::time::sleep(5 * MS).await;
        }
    }

    /// Redis down with `Fallback::FailClosed`: the stream yields the item
    /// with a backend error, a writer an io error, and moves nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_errors_surface_through_stream_and_writer() {
        let server = RedisServer::start();
        let backend = crate::support::poll::backend(server.client()).await;
        let limiter: Arc<dyn Limiter> = Arc::new(
            RateLimiter::builder()
                .permits_per_second(10.0)
                .redis(&backend, "probe-fail-closed")
                .fallback(Fallback::FailClosed)
                .build()
                .unwrap(),
        );
        limiter.reserve(1).await.unwrap();
        drop(server);
        let out: Vec<_> = stream::iter([7u32])
            .throttle(limiter.clone())
            .collect()
            .await;
        let [Err(error)] = &out[..] else {
            panic!("{out:?}")
        };
        assert!(format!("{error:?}").contains("Backend"), "{error:?}");
        let mut writer = ThrottledWriter::new(Sizes::default(), limiter.clone());
        assert!(writer.write(&[0; 10]).await.is_err());
        assert!(writer.get_ref().0.is_empty());
    }
}
