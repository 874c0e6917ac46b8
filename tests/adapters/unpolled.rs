//! The adapters' promises where the other tests do not
//! look: tower services cloned, made ready and dropped, forgotten or
//! parked; services used through `oneshot`; the HTTP layer's numbers after
//! a wait and on a refusal; the outbound layer's settling and learning;
//! streams parked mid-item. Each limiter that saw a cancelled request is
//! compared with a twin that never saw it.

#[cfg(feature = "http")]
use std::convert::Infallible;
#[cfg(feature = "http")]
use std::future::poll_fn;
use std::sync::Arc;
#[cfg(feature = "http")]
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering;
#[cfg(feature = "http")]
use std::task::Context;
use std::task::Poll;
use std::time::Duration;

#[cfg(feature = "http")]
use ::http::{Request, Response, StatusCode};
#[cfg(feature = "http")]
use paceline::Local;
#[cfg(feature = "http")]
use paceline::clock::FakeClock;
#[cfg(feature = "http")]
use paceline::{Cost, Limit};
use paceline::{KeyedRateLimiter, RateLimiter};
use tower::ServiceExt;
use tower_layer::Layer;
use tower_service::Service;

use crate::support::manual::ManualClock;

const MS: Duration = Duration::from_millis(1);

use crate::common::{Counter, manual, noop, poll_once};

// ------------------------------------------------------------------ tower

mod services {
    use super::*;
    use paceline::tower::RateLimitLayer;

    /// A service used through `oneshot`: the future owns the service, which
    /// reserves in `poll_ready`; dropped mid-wait, it gives the permit back,
    /// and the limiter reads as its twin that never saw it.
    #[tokio::test(flavor = "current_thread")]
    async fn oneshot_dropped_mid_wait_leaves_the_limiter_as_its_twin() {
        let (limiter, clock) = manual(10.0);
        let (twin, twin_clock) = manual(10.0);
        let layer = RateLimitLayer::new(Arc::clone(&limiter));
        let counter = Counter::default();
        assert_eq!(layer.layer(counter.clone()).oneshot(1).await.unwrap(), 1);
        twin.try_reserve(1, Duration::ZERO).unwrap().unwrap();
        {
            let mut second = Box::pin(layer.layer(counter.clone()).oneshot(2));
            assert!(poll_once(second.as_mut()).is_pending());
            assert_eq!(limiter.snapshot().unwrap().wait(), 200 * MS);
        }
        assert_eq!(limiter.snapshot().unwrap(), twin.snapshot().unwrap());
        clock.advance(50 * MS);
        twin_clock.advance(50 * MS);
        for _ in 0..3 {
            let a = limiter.reservation(1).unwrap().keep();
            let b = twin.reservation(1).unwrap().keep();
            assert_eq!(a, b);
        }
        assert_eq!(counter.0.load(Ordering::Relaxed), 1);
    }

    /// A service forgotten (`mem::forget`) mid-wait keeps its permit (it is
    /// never given back), but no other caller waits on its being polled:
    /// the next one goes one interval after it, on time.
    #[tokio::test(flavor = "current_thread")]
    async fn a_forgotten_waiting_service_holds_no_one_up() {
        let (limiter, clock) = manual(10.0);
        let layer = RateLimitLayer::new(Arc::clone(&limiter));
        let mut first = layer.layer(Counter::default());
        assert!(first.poll_ready(&mut noop()).is_ready());
        first.call(1).await.unwrap();
        let mut forgotten = layer.layer(Counter::default());
        assert!(forgotten.poll_ready(&mut noop()).is_pending());
        std::mem::forget(forgotten);
        let mut third = layer.layer(Counter::default());
        assert!(third.poll_ready(&mut noop()).is_pending());
        clock.advance(200 * MS);
        assert!(matches!(third.poll_ready(&mut noop()), Poll::Ready(Ok(()))));
        assert_eq!(third.call(3).await.unwrap(), 3);
        // Forgotten: its permit (at 100 ms) is spent; nothing else is owed.
        assert_eq!(limiter.snapshot().unwrap().wait(), 100 * MS);
    }

    /// A service parked mid-wait (kept, never polled again) holds only its
    /// own place: the others go at theirs, and once its moment passes,
    /// dropping it gives nothing back (the permit counts as used), as the
    /// module docs say of a due permit.
    #[tokio::test(flavor = "current_thread")]
    async fn a_parked_waiting_service_holds_only_its_place() {
        let (limiter, clock) = manual(10.0);
        let layer = RateLimitLayer::new(Arc::clone(&limiter));
        let mut first = layer.layer(Counter::default());
        assert!(first.poll_ready(&mut noop()).is_ready());
        first.call(1).await.unwrap();
        let mut parked = layer.layer(Counter::default());
        assert!(parked.poll_ready(&mut noop()).is_pending());
        let mut others = Vec::new();
        for _ in 0..5 {
            let mut other = layer.layer(Counter::default());
            assert!(other.poll_ready(&mut noop()).is_pending());
            others.push(other);
        }
        clock.advance(700 * MS);
        for other in &mut others {
            assert!(matches!(other.poll_ready(&mut noop()), Poll::Ready(Ok(()))));
            other.call(0).await.unwrap();
        }
        let before = limiter.snapshot().unwrap();
        drop(parked);
        assert_eq!(limiter.snapshot().unwrap(), before);
    }

    /// Services cloned per request (as a buffer does), made ready, and the
    /// clone dropped before `call` while it still waits: each gives its
    /// permit back; the limiter reads as a twin that only saw the calls.
    #[tokio::test(flavor = "current_thread")]
    async fn clones_made_ready_and_dropped_give_back_in_any_order() {
        let (limiter, clock) = manual(10.0);
        let (twin, twin_clock) = manual(10.0);
        let layer = RateLimitLayer::new(Arc::clone(&limiter));
        let mut base = layer.layer(Counter::default());
        assert!(base.poll_ready(&mut noop()).is_ready());
        base.call(0).await.unwrap();
        twin.try_reserve(1, Duration::ZERO).unwrap().unwrap();
        let mut waiting: Vec<_> = (0..6)
            .map(|_| {
                let mut clone = base.clone();
                assert!(clone.poll_ready(&mut noop()).is_pending());
                clone
            })
            .collect();
        // Dropped out of order: 2, 5, 0, then the rest kept and called.
        for i in [5, 2, 0] {
            drop(waiting.remove(i.min(waiting.len() - 1)));
        }
        // The clones left keep their moments (200, 400 and 500 ms): the
        // limits are replayed without the others, for those who come next.
        clock.advance(500 * MS);
        for _ in 0..3 {
            twin.reservation(1).unwrap().keep();
        }
        twin_clock.advance(500 * MS);
        for clone in &mut waiting {
            assert!(matches!(clone.poll_ready(&mut noop()), Poll::Ready(Ok(()))));
            clone.call(1).await.unwrap();
        }
        assert_eq!(limiter.snapshot().unwrap(), twin.snapshot().unwrap());
    }

    /// The bounded mode: a service made ready with a permit within the
    /// bound, cloned per request, the clone dropped before `call`: given
    /// back; a later request within the bound is not refused for it.
    #[tokio::test(flavor = "current_thread")]
    async fn bounded_clones_dropped_before_call_do_not_push_others_past_the_bound() {
        let (limiter, clock) = manual(10.0);
        let layer = RateLimitLayer::new(Arc::clone(&limiter)).max_wait(150 * MS);
        let mut base = layer.layer(Counter::default());
        assert!(base.poll_ready(&mut noop()).is_ready());
        base.call(0).await.unwrap();
        for _ in 0..20 {
            let mut clone = base.clone();
            assert!(clone.poll_ready(&mut noop()).is_pending());
            drop(clone);
        }
        let mut next = base.clone();
        assert!(next.poll_ready(&mut noop()).is_pending());
        clock.advance(100 * MS);
        assert!(matches!(next.poll_ready(&mut noop()), Poll::Ready(Ok(()))));
        assert_eq!(next.call(7).await.unwrap(), 7);
    }

    /// On the real clock, from several tasks, each request through a fresh
    /// clone with `ready().await` then `call`, half of them abandoned by a
    /// timeout: the calls made never exceed the rate, and the limiter is
    /// never left owing more than the calls made.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn many_tasks_with_timeouts_never_exceed_the_rate() {
        let limiter = Arc::new(
            RateLimiter::builder()
                .permits_per_second(100.0)
                .max_burst(Duration::ZERO)
                .build()
                .unwrap(),
        );
        let counter = Counter::default();
        let service = RateLimitLayer::new(Arc::clone(&limiter)).layer(counter.clone());
        let start = std::time::Instant::now();
        let mut tasks = Vec::new();
        for i in 0..60u32 {
            let service = service.clone();
            tasks.push(tokio::spawn(async move {
                let bound = if i % 2 == 0 { 30 * MS } else { 5 * MS * 1000 };
                let _ = tokio::time::timeout(bound, service.oneshot(i)).await;
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        let made = counter.0.load(Ordering::Relaxed);
        let elapsed = start.elapsed();
        assert!(made >= 30, "{made}");
        // 100 per second, the first at once.
        let allowed = (elapsed.as_secs_f64() * 100.0).floor() as u32 + 1;
        assert!(made <= allowed, "{made} calls in {elapsed:?}");
        // What is owed now is at most one interval per call made since.
        let owed = limiter.snapshot().unwrap().wait();
        assert!(owed <= 20 * MS, "{owed:?} owed after {made} calls");
    }
}

// ------------------------------------------------------------------- http

#[cfg(feature = "http")]
mod http_layer {
    use super::*;
    use paceline::http::{Global, Headers, RateLimitLayer};

    #[derive(Clone, Default)]
    struct Ok200(Arc<AtomicU32>);

    impl Service<Request<()>> for Ok200 {
        type Response = Response<String>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<Response<String>, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<()>) -> Self::Future {
            self.0.fetch_add(1, Ordering::Relaxed);
            std::future::ready(Ok(Response::new("ok".to_owned())))
        }
    }

    fn header<'a>(response: &'a Response<String>, name: &str) -> Option<&'a str> {
        response.headers().get(name).map(|v| v.to_str().unwrap())
    }

    /// `r=` of a `RateLimit` value.
    fn r_of(response: &Response<String>) -> u64 {
        let value = header(response, "ratelimit").unwrap();
        let r = value.split(";r=").nth(1).unwrap();
        r.split(';').next().unwrap().parse().unwrap()
    }

    fn t_of(response: &Response<String>) -> u64 {
        let value = header(response, "ratelimit").unwrap();
        value.split(";t=").nth(1).unwrap().parse().unwrap()
    }

    async fn send<S>(service: &mut S) -> Response<String>
    where
        S: Service<Request<()>, Response = Response<String>>,
        S::Error: std::fmt::Debug,
    {
        poll_fn(|cx| service.poll_ready(cx)).await.unwrap();
        service.call(Request::new(())).await.unwrap()
    }

    /// A refusal's `Retry-After` means what it says: after that many
    /// seconds the request goes, and one second less it would not have
    /// (the wait rounded up). `t` likewise: after `t` seconds a burst of
    /// N goes at once again.
    #[tokio::test(flavor = "current_thread")]
    async fn retry_after_and_t_mean_what_they_say() {
        for (rate, burst) in [(0.5, 3u64), (2.0, 4), (1.0 / 7.0, 2), (3.0, 1)] {
            let clock = FakeClock::new();
            let limiter = Arc::new(
                KeyedRateLimiter::<()>::builder()
                    .limit(Limit::per_second(rate).burst(burst))
                    .clock(clock.clone())
                    .build()
                    .unwrap(),
            );
            let mut service =
                RateLimitLayer::new(Arc::clone(&limiter), Global).layer(Ok200::default());
            let mut last_t = 0;
            for i in 0..burst {
                let response = send(&mut service).await;
                assert_eq!(response.status(), StatusCode::OK, "{rate} {burst} {i}");
                assert_eq!(r_of(&response), burst - 1 - i, "{rate} {burst}");
                last_t = t_of(&response);
            }
            let refused = send(&mut service).await;
            assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
            let retry: u64 = header(&refused, "retry-after").unwrap().parse().unwrap();
            let wait = limiter.snapshot(&()).unwrap().wait();
            assert_eq!(retry, wait.as_secs_f64().ceil().max(1.0) as u64, "{rate}");
            // One second short of it: still refused (when the wait is over
            // a second).
            if retry > 1 {
                clock.advance(Duration::from_secs(retry - 1));
                let early = send(&mut service).await;
                assert_eq!(early.status(), StatusCode::TOO_MANY_REQUESTS, "{rate}");
                clock.advance(Duration::from_secs(1));
            } else {
                clock.advance(Duration::from_secs(retry));
            }
            assert_eq!(send(&mut service).await.status(), StatusCode::OK, "{rate}");
            // From the drained state, `t` seconds later the whole burst goes.
            let clock2 = FakeClock::new();
            let limiter2 = Arc::new(
                KeyedRateLimiter::<()>::builder()
                    .limit(Limit::per_second(rate).burst(burst))
                    .clock(clock2.clone())
                    .build()
                    .unwrap(),
            );
            let mut fresh = RateLimitLayer::new(limiter2, Global).layer(Ok200::default());
            for _ in 0..burst {
                send(&mut fresh).await;
            }
            clock2.advance(Duration::from_secs(last_t));
            for i in 0..burst {
                let response = send(&mut fresh).await;
                assert_eq!(
                    response.status(),
                    StatusCode::OK,
                    "{rate} {burst} after t {i}"
                );
            }
        }
    }

    /// The response after a wait: its headers read as of its answer, equal
    /// to what a request that went then without waiting would have been
    /// told on a twin.
    #[tokio::test(flavor = "current_thread")]
    async fn headers_after_a_wait_read_as_a_twin_answering_then() {
        let clock = ManualClock::default();
        let build = |clock: &ManualClock| {
            Arc::new(
                KeyedRateLimiter::<()>::builder()
                    .limit(Limit::per_second(10.0).burst(3))
                    .clock(clock.clone())
                    .build()
                    .unwrap(),
            )
        };
        let limiter = build(&clock);
        let mut service = RateLimitLayer::new(Arc::clone(&limiter), Global)
            .max_wait(Duration::from_secs(1))
            .headers(Headers::IetfAndLegacy)
            .layer(Ok200::default());
        for _ in 0..3 {
            assert_eq!(send(&mut service).await.status(), StatusCode::OK);
        }
        poll_fn(|cx| service.poll_ready(cx)).await.unwrap();
        let mut waiting = Box::pin(service.call(Request::new(())));
        assert!(poll_once(waiting.as_mut()).is_pending());
        clock.advance(100 * MS);
        let Poll::Ready(Ok(response)) = poll_once(waiting.as_mut()) else {
            panic!("not answered after its wait");
        };
        let snapshot = limiter.snapshot(&()).unwrap();
        assert_eq!(r_of(&response), snapshot.remaining());
        assert_eq!(
            t_of(&response),
            snapshot.full_in().as_secs_f64().ceil() as u64
        );
    }

    /// A waiting request whose response future is dropped gives its permit
    /// back, and the one after it is told the same numbers as on a twin
    /// that never saw it.
    #[tokio::test(flavor = "current_thread")]
    async fn a_dropped_waiting_request_leaves_the_headers_as_a_twin() {
        let build = |clock: &ManualClock| {
            Arc::new(
                KeyedRateLimiter::<()>::builder()
                    .limit(Limit::per_second(10.0).burst(2))
                    .clock(clock.clone())
                    .build()
                    .unwrap(),
            )
        };
        let (clock, twin_clock) = (ManualClock::default(), ManualClock::default());
        let mut service = RateLimitLayer::new(build(&clock), Global)
            .max_wait(Duration::from_secs(1))
            .layer(Ok200::default());
        let mut twin = RateLimitLayer::new(build(&twin_clock), Global)
            .max_wait(Duration::from_secs(1))
            .layer(Ok200::default());
        for _ in 0..2 {
            send(&mut service).await;
            send(&mut twin).await;
        }
        poll_fn(|cx| service.poll_ready(cx)).await.unwrap();
        {
            let mut dropped = Box::pin(service.call(Request::new(())));
            assert!(poll_once(dropped.as_mut()).is_pending());
        }
        clock.advance(250 * MS);
        twin_clock.advance(250 * MS);
        let a = send(&mut service).await;
        let b = send(&mut twin).await;
        assert_eq!(a.status(), b.status());
        assert_eq!(header(&a, "ratelimit"), header(&b, "ratelimit"));
    }
}

// --------------------------------------------------------------- outbound

#[cfg(feature = "http")]
mod outbound_layer {
    use super::*;
    use paceline::clock::Clock;
    use paceline::outbound::{Feedback, OutboundLayer};
    use tokio::sync::Notify;

    type Req = Request<()>;
    type Res = Response<()>;

    fn answer(status: u16, headers: &[(&str, &str)]) -> Res {
        let mut builder = Response::builder().status(status);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * b.abs().max(1.0)
    }

    fn two_limits(clock: &FakeClock) -> Arc<RateLimiter<Local, FakeClock>> {
        Arc::new(
            RateLimiter::builder()
                .limit(Limit::per_second(10.0).burst(1).named("requests"))
                .limit(Limit::per_second(1_000.0).burst(1).named("tokens"))
                .clock(clock.clone())
                .build()
                .unwrap(),
        )
    }

    fn tokens_used(response: &Res) -> Option<Cost> {
        let used = response.headers().get("x-usage-tokens")?.to_str().ok()?;
        Some(Cost::each([1, used.parse().ok()?]))
    }

    /// The layer settles each call at the cost its response reads, and
    /// learns from the response. A refused request (429, `Retry-After: 1`)
    /// that the upstream says used no tokens: its estimate of 5 000 tokens (5 s of them)
    /// should be settled to 0, as a caller who settles what the answer
    /// says and then learns from it finds (the twin below). The layer
    /// learns first: the refusal's pause empties the log, so the settle
    /// that follows gives nothing back, and the 5 000 tokens stay owed past
    /// the pause.
    ///
    /// Promised (`OutboundLayer`): "its response is fed back and its real
    /// cost, read from the response, settled"; `Call::settle` is exact while
    /// the log holds the call, and it is the layer's own `learn` that
    /// empties the log just before its own `settle`.
    #[tokio::test(flavor = "current_thread")]
    async fn a_refused_call_is_settled_at_what_its_answer_says() {
        let (clock, twin_clock) = (FakeClock::new(), FakeClock::new());
        let (limiter, twin) = (two_limits(&clock), two_limits(&twin_clock));
        let refusal = || answer(429, &[("retry-after", "1"), ("x-usage-tokens", "0")]);
        let client = OutboundLayer::new(Arc::clone(&limiter))
            .estimate(|_: &Req| Cost::each([1, 5_000]))
            .actual(tokens_used)
            .layer(tower::service_fn(move |_: Req| async move {
                Ok::<_, Infallible>(refusal())
            }));
        let response = client.oneshot(Request::new(())).await.unwrap();
        assert_eq!(response.status(), 429);
        // The twin: the call as if it had reserved what it cost, then the
        // same refusal learned ("the limiter then holds what it would had
        // the call reserved `actual`").
        let call = twin.call(Cost::each([1, 0])).await.unwrap();
        call.learn(&Feedback::from_response(&refusal()));
        drop(call);
        assert_eq!(clock.now(), twin_clock.now());
        // Found: the layer's limiter owes 5 s of tokens, the twin 1 s (the
        // pause).
        // The next call that needs tokens waits as long on both.
        let next = limiter.call(Cost::each([1, 1])).await.unwrap().waited();
        let twin_next = twin.call(Cost::each([1, 1])).await.unwrap().waited();
        assert_eq!(
            next, twin_next,
            "the refused call's 5 000 tokens stayed owed"
        );
    }

    /// An upstream whose answers come when the test says: each request
    /// carries a `Notify` its answer waits for, then it is a 429 with
    /// `Retry-After: 1`.
    fn slow_refusals() -> impl Service<Req, Response = Res, Error = Infallible, Future: Send> + Clone
    {
        tower::service_fn(|request: Req| async move {
            let go = request.extensions().get::<Arc<Notify>>().cloned().unwrap();
            go.notified().await;
            Ok::<_, Infallible>(answer(429, &[("retry-after", "1")]))
        })
    }

    fn request(go: &Arc<Notify>) -> Req {
        let mut request = Request::new(());
        request.extensions_mut().insert(Arc::clone(go));
        request
    }

    /// Two calls sent before any answer came back are refused, by the same
    /// episode of the upstream's: the second answer is slow, and comes back
    /// after the first's pause has ended. A refusal lowers the rate "once per
    /// pause"; the rule's reason is that refusals coming back "were sent
    /// before anyone knew" (core::learn). This one was sent before anyone
    /// knew too, yet it lowers the rate a second time (70 to 49): the
    /// episode is told by when an answer arrives, not by when its call went.
    #[tokio::test(flavor = "current_thread")]
    async fn a_slow_refusal_sent_before_the_first_lowers_the_rate_again() {
        let clock = FakeClock::new();
        let limiter = Arc::new(
            RateLimiter::builder()
                .permits_per_second(100.0)
                .max_burst(Duration::ZERO)
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
        let client = OutboundLayer::new(Arc::clone(&limiter)).layer(slow_refusals());
        let (go_a, go_b) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let mut a = Box::pin(client.clone().oneshot(request(&go_a)));
        let mut b = Box::pin(client.clone().oneshot(request(&go_b)));
        // Both sent: the first at once, the second 10 ms later.
        assert!(poll_once(a.as_mut()).is_pending());
        assert!(poll_once(b.as_mut()).is_pending());
        assert_eq!(clock.now(), 10 * MS);
        go_a.notify_one();
        let Poll::Ready(Ok(first)) = poll_once(a.as_mut()) else {
            panic!("first answer");
        };
        assert_eq!(first.status(), 429);
        assert!(close(limiter.rate(), 70.0), "{}", limiter.rate());
        // The second answer comes back 2 s later, the pause long over.
        clock.advance(Duration::from_secs(2));
        go_b.notify_one();
        let Poll::Ready(Ok(second)) = poll_once(b.as_mut()) else {
            panic!("second answer");
        };
        assert_eq!(second.status(), 429);
        assert!(
            close(limiter.rate(), 70.0),
            "lowered again: {}",
            limiter.rate()
        );
    }

    /// A client that is ready only while the test says (its first
    /// instance, made ready by the caller, aside), whose every answer has
    /// `status` (a 429 with `Retry-After: 1`), and that notes when each
    /// request was sent.
    #[derive(Clone)]
    struct Gated {
        ready: Arc<std::sync::atomic::AtomicBool>,
        clock: ManualClock,
        sent: Arc<std::sync::Mutex<Vec<Duration>>>,
        status: u16,
    }

    impl Gated {
        fn new(clock: &ManualClock, status: u16) -> Gated {
            Gated {
                ready: Arc::new(std::sync::atomic::AtomicBool::new(true)),
                clock: clock.clone(),
                sent: Arc::default(),
                status,
            }
        }

        fn ready(&self, ready: bool) {
            self.ready.store(ready, Ordering::Release);
        }
    }

    impl Service<Req> for Gated {
        type Response = Res;
        type Error = Infallible;
        type Future = std::future::Ready<Result<Res, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            match self.ready.load(Ordering::Acquire) {
                true => Poll::Ready(Ok(())),
                false => Poll::Pending,
            }
        }

        fn call(&mut self, _: Req) -> Self::Future {
            self.sent.lock().unwrap().push(self.clock.now());
            let headers: &[(&str, &str)] = match self.status {
                429 => &[("retry-after", "1")],
                _ => &[],
            };
            std::future::ready(Ok(answer(self.status, headers)))
        }
    }

    /// A limiter at `rate` with no burst, on `clock`.
    fn no_burst(rate: f64, clock: &ManualClock) -> Arc<RateLimiter<Local, ManualClock>> {
        Arc::new(
            RateLimiter::builder()
                .permits_per_second(rate)
                .max_burst(Duration::ZERO)
                .clock(clock.clone())
                .build()
                .unwrap(),
        )
    }

    /// A request through `client` (over `limiter`, at 100/s) whose turn is
    /// at 10 ms, while its client is not ready (so it lets go of its
    /// readiness, and waits for it), and another call's refusal at 20 ms:
    /// a pause until 1 020 ms, the rate down to 70. The request, pending.
    async fn turn_then_refusal<S>(
        limiter: &RateLimiter<Local, ManualClock>,
        client: &mut S,
        gate: &Gated,
    ) -> std::pin::Pin<Box<S::Future>>
    where
        S: Service<Req, Response = Res>,
        S::Error: std::fmt::Debug,
    {
        let clock = gate.clock.clone();
        limiter.reserve(1).unwrap();
        assert!(poll_fn(|cx| client.poll_ready(cx)).await.is_ok());
        let mut late = Box::pin(client.call(Request::new(())));
        gate.ready(false);
        assert!(poll_once(late.as_mut()).is_pending());
        clock.set_ms(10);
        assert!(
            poll_once(late.as_mut()).is_pending(),
            "the client is not ready"
        );
        clock.set_ms(20);
        let call = limiter.call(1).await.unwrap();
        call.learn(&Feedback::new(429).with_retry_after(Duration::from_secs(1)));
        drop(call);
        assert!(close(limiter.rate(), 70.0), "{}", limiter.rate());
        late
    }

    /// A request whose turn comes before a refusal's pause, but whose
    /// client is ready again (and so sends it) only after that pause has
    /// ended, is a call that went after the pause: its own refusal is a new
    /// one, and lowers the rate again (70 to 49). The layer stamped the
    /// call as gone when its turn came, before the client was ready, so the
    /// refusal read as one "sent before anyone knew" and lowered nothing
    /// (the rate stayed 70).
    #[tokio::test(flavor = "current_thread")]
    async fn a_request_sent_after_a_pause_counts_as_gone_then() {
        let clock = ManualClock::default();
        let limiter = no_burst(100.0, &clock);
        let gate = Gated::new(&clock, 429);
        let mut client = OutboundLayer::new(Arc::clone(&limiter)).layer(gate.clone());
        let mut late = turn_then_refusal(&limiter, &mut client, &gate).await;
        // The client is ready again at 2 s, the pause long over: the request
        // goes then, and is refused.
        clock.set_ms(2_000);
        gate.ready(true);
        let Poll::Ready(Ok(refused)) = poll_once(late.as_mut()) else {
            panic!("the request was not sent");
        };
        assert_eq!(refused.status(), 429);
        assert!(
            close(limiter.rate(), 49.0),
            "a refusal of a request sent after the pause lowered nothing: {}",
            limiter.rate()
        );
    }

    /// A request whose turn comes before a refusal's pause, and whose
    /// client is ready again (and would send it) while that pause still
    /// holds, is not sent into the pause, as a caller that wakes inside it
    /// does not go: it waits its turn again, behind the pause. The layer
    /// sent it as soon as the client was ready: at 500 ms, inside the
    /// upstream's `Retry-After` of 1 s given at 20 ms.
    #[tokio::test(flavor = "current_thread")]
    async fn a_request_whose_client_is_ready_inside_a_pause_waits_behind_it() {
        let clock = ManualClock::default();
        let limiter = no_burst(100.0, &clock);
        let gate = Gated::new(&clock, 200);
        let (ready, sent) = (Arc::clone(&gate.ready), Arc::clone(&gate.sent));
        let mut client = OutboundLayer::new(Arc::clone(&limiter)).layer(gate.clone());
        let mut late = turn_then_refusal(&limiter, &mut client, &gate).await;
        // The client is ready again at 500 ms, inside the pause.
        clock.set_ms(500);
        ready.store(true, Ordering::Release);
        assert!(
            poll_once(late.as_mut()).is_pending(),
            "sent into the pause, at {:?}",
            sent.lock().unwrap()
        );
        assert!(sent.lock().unwrap().is_empty());
        // Its turn comes again as the pause ends, and then it is sent.
        let answered = loop {
            if let Poll::Ready(answered) = poll_once(late.as_mut()) {
                break answered.unwrap();
            }
            assert!(clock.now() < Duration::from_secs(3), "never sent");
            clock.advance(Duration::from_millis(1));
        };
        assert_eq!(answered.status(), 200);
        assert_eq!(*sent.lock().unwrap(), [Duration::from_millis(1_020)]);
    }

    /// What a request that waits its turn again behind a pause costs: the
    /// pause emptied the limiter's log, so its first charge is not given
    /// back (as a caller's that wakes inside a pause is not), and it is
    /// charged again behind the pause, erring towards limiting. At 10/s, a
    /// request of 20 permits whose turn came at 100 ms (its charge to
    /// 2 100 ms), paused by a refusal at 150 ms (until 1 150 ms) and ready
    /// again at 500 ms, goes at 2 100 ms, not at 1 150 ms, and the next
    /// request waits for both charges. (The layer's docs said it cost
    /// nothing.)
    #[tokio::test(flavor = "current_thread")]
    async fn a_request_that_waits_again_behind_a_pause_keeps_its_first_charge() {
        let clock = ManualClock::default();
        let limiter = no_burst(10.0, &clock);
        let gate = Gated::new(&clock, 200);
        let (ready, sent) = (Arc::clone(&gate.ready), Arc::clone(&gate.sent));
        let mut client = OutboundLayer::new(Arc::clone(&limiter))
            .estimate(|_: &Req| Cost::from(20))
            .layer(gate);
        let first = limiter.call(1).await.unwrap();
        assert!(poll_fn(|cx| client.poll_ready(cx)).await.is_ok());
        let mut late = client.call(Request::new(()));
        ready.store(false, Ordering::Release);
        assert!(poll_once(late.as_mut()).is_pending());
        clock.set_ms(100);
        assert!(poll_once(late.as_mut()).is_pending());
        clock.set_ms(150);
        first.learn(&Feedback::new(429).with_retry_after(Duration::from_secs(1)));
        drop(first);
        clock.set_ms(500);
        ready.store(true, Ordering::Release);
        assert!(poll_once(late.as_mut()).is_pending());
        let answered = loop {
            if let Poll::Ready(answered) = poll_once(late.as_mut()) {
                break answered.unwrap();
            }
            assert!(clock.now() < Duration::from_secs(10), "never sent");
            clock.advance(Duration::from_millis(1));
        };
        assert_eq!(answered.status(), 200);
        assert_eq!(*sent.lock().unwrap(), [Duration::from_millis(2_100)]);
        // The next request waits for the second charge, at the rate the
        // refusal lowered (20 permits at 7/s: about 2.86 s).
        let next = limiter.reserve(1).unwrap();
        let due = Duration::from_millis(2_100) + Duration::from_secs_f64(20.0 / 7.0);
        assert!(
            next.abs_diff(due - clock.now()) <= MS,
            "the next waits {next:?}, its due {due:?}"
        );
    }

    /// With `Limit::concurrent(1)`, a request whose response future is
    /// polled once and then parked while it waits for its turn in the
    /// schedule: it took the slot first (a call takes its slot, then its
    /// place), and holds it as a kept `Call` would, until it is dropped
    /// (`Limit::concurrent`). Dropped, it frees the slot at once, and the
    /// next request goes.
    #[tokio::test(flavor = "current_thread")]
    async fn a_request_parked_after_taking_its_slot_holds_it_until_dropped() {
        let clock = ManualClock::default();
        let limiter = Arc::new(
            RateLimiter::builder()
                .limit(Limit::per_second(10.0).burst(1))
                .limit(Limit::concurrent(1))
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
        let client =
            OutboundLayer::new(Arc::clone(&limiter)).layer(tower::service_fn(|_: Req| async {
                Ok::<_, Infallible>(answer(200, &[]))
            }));
        // The first goes at once and is answered.
        client.clone().oneshot(Request::new(())).await.unwrap();
        // The second waits 100 ms for its turn: polled once, then parked.
        let mut parked = Box::pin(client.clone().oneshot(Request::new(())));
        assert!(poll_once(parked.as_mut()).is_pending());
        assert_eq!(limiter.stats().in_flight, 1);
        // The third, polled as time runs on, waits for the slot.
        let mut third = Box::pin(client.clone().oneshot(Request::new(())));
        for _ in 0..10 {
            clock.advance(100 * MS);
            assert!(poll_once(third.as_mut()).is_pending());
        }
        drop(parked);
        assert_eq!(limiter.stats().in_flight, 0);
        let mut answered = false;
        for _ in 0..10 {
            if poll_once(third.as_mut()).is_ready() {
                answered = true;
                break;
            }
            clock.advance(100 * MS);
        }
        assert!(answered, "the slot was freed, yet the third still waits");
    }

    /// The promise that holds: a request parked or forgotten while it
    /// waits for a slot takes none; the slot given back is kept a moment
    /// for the parked one (it came first), then goes to the next request
    /// polled.
    #[tokio::test(flavor = "current_thread")]
    async fn requests_parked_or_forgotten_waiting_for_a_slot_take_none() {
        let clock = ManualClock::default();
        let limiter = Arc::new(
            RateLimiter::builder()
                .limit(Limit::per_second(1_000.0))
                .limit(Limit::concurrent(1))
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
        let go = Arc::new(Notify::new());
        let g = Arc::clone(&go);
        let client =
            OutboundLayer::new(Arc::clone(&limiter)).layer(tower::service_fn(move |_: Req| {
                let g = Arc::clone(&g);
                async move {
                    g.notified().await;
                    Ok::<_, Infallible>(answer(200, &[]))
                }
            }));
        let mut holder = Box::pin(client.clone().oneshot(Request::new(())));
        assert!(poll_once(holder.as_mut()).is_pending());
        let mut parked = Box::pin(client.clone().oneshot(Request::new(())));
        assert!(poll_once(parked.as_mut()).is_pending());
        let mut forgotten = Box::pin(client.clone().oneshot(Request::new(())));
        assert!(poll_once(forgotten.as_mut()).is_pending());
        std::mem::forget(forgotten);
        let mut next = Box::pin(client.clone().oneshot(Request::new(())));
        assert!(poll_once(next.as_mut()).is_pending());
        go.notify_one();
        assert!(poll_once(holder.as_mut()).is_ready());
        clock.advance(10 * MS);
        let started = std::time::Instant::now();
        while limiter.stats().in_flight == 0 && started.elapsed() < Duration::from_secs(10) {
            assert!(poll_once(next.as_mut()).is_pending());
            std::thread::sleep(5 * MS);
        }
        assert!(poll_once(next.as_mut()).is_pending()); // sent, in flight
        assert_eq!(limiter.stats().in_flight, 1);
        go.notify_one();
        assert!(poll_once(next.as_mut()).is_ready());
        assert_eq!(limiter.stats().in_flight, 0);
        drop(parked);
    }
}

// ----------------------------------------------------------------- stream

mod streams {
    use super::*;
    use futures::StreamExt;
    use paceline::stream::ThrottleExt;

    /// A keyed stream parked mid-item (kept, never polled again) holds only
    /// its item's place in its key; dropped once the moment has passed it
    /// gives nothing back, dropped before, it does (the key then reads as a
    /// twin's that never saw the item).
    #[tokio::test(flavor = "current_thread")]
    async fn a_keyed_stream_parked_mid_item_holds_only_its_place() {
        let build = |clock: &ManualClock| {
            Arc::new(
                KeyedRateLimiter::<u32>::builder()
                    .permits_per_second(10.0)
                    .max_burst(Duration::ZERO)
                    .clock(clock.clone())
                    .build()
                    .unwrap(),
            )
        };
        let (clock, twin_clock) = (ManualClock::default(), ManualClock::default());
        let (keyed, twin) = (build(&clock), build(&twin_clock));
        keyed.reserve(&1, 1).unwrap();
        twin.reserve(&1, 1).unwrap();
        let mut parked = futures::stream::iter([(1u32, 3u32), (1, 1)])
            .throttle_keyed(Arc::clone(&keyed), |&(k, n): &(u32, u32)| (k, n));
        assert!(parked.poll_next_unpin(&mut noop()).is_pending());
        // Another key is not held up; the same key waits behind the item.
        assert_eq!(keyed.snapshot(&2).unwrap().wait(), Duration::ZERO);
        assert_eq!(keyed.snapshot(&1).unwrap().wait(), 400 * MS);
        clock.advance(50 * MS);
        twin_clock.advance(50 * MS);
        drop(parked);
        assert_eq!(keyed.snapshot(&1).unwrap(), twin.snapshot(&1).unwrap());
    }
}
