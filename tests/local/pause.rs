//! A refusal learned while callers wait: a caller whose moment falls inside
//! the pause it starts does not go then, but behind the pause. On the real
//! clock (a fake one returns a sleep at once, before any lesson could come
//! during it), asserting only what load cannot fake: a caller returns no
//! sooner than the pause ends (a late wake-up only makes it later), and
//! bounds far from what going inside the pause gives.

use std::sync::Arc;
use std::time::{Duration, Instant};

use paceline::outbound::Feedback;
use paceline::{KeyedRateLimiter, Limit, RateLimiter};

/// The pause each test's refusal asks for.
const PAUSE: Duration = Duration::from_secs(2);

/// When a second caller's moment is: the refusal, learned 20 ms in, must
/// come before it. On a loaded machine the 20 ms sleep may last longer; a
/// run in which it lasted past `MOMENT` shows nothing and is made again.
const MOMENT: Duration = Duration::from_millis(500);

fn refused() -> Feedback {
    Feedback::new(429).with_retry_after(PAUSE)
}

/// 2/s, no burst: a second caller waits `MOMENT`.
fn limiter() -> Arc<RateLimiter> {
    Arc::new(
        RateLimiter::builder()
            .limit(Limit::per_second(2.0).burst(1))
            .build()
            .unwrap(),
    )
}

/// Callers already waiting when a refusal comes (by `acquire`, `call`,
/// `acquire_blocking`, a throttled stream's or writer's item, a tower
/// service's `poll_ready`) go behind its pause,
/// not at their moments inside it; a `try_acquire` (or a tower service
/// bounded by `max_wait`) whose timeout the pause outlasts returns `false`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_waiting_when_a_refusal_comes_go_behind_its_pause() {
    let hows = [
        "acquire",
        "call",
        "acquire_blocking",
        "try_acquire",
        "stream",
        "writer",
        #[cfg(feature = "tower")]
        "tower",
        #[cfg(feature = "tower")]
        "tower max_wait",
    ];
    for how in hows {
        for attempt in 1.. {
            let limiter = limiter();
            let start = Instant::now();
            let first = limiter.call(1).await.unwrap();
            // Waits its interval, `MOMENT`: a refusal comes meanwhile.
            let waiter = {
                let limiter = Arc::clone(&limiter);
                tokio::spawn(async move {
                    let went = match how {
                        "acquire" => limiter.acquire(1).await.map(|_| true),
                        "call" => limiter.call(1).await.map(|_| true),
                        "try_acquire" => limiter.try_acquire(1, 2 * MOMENT).await,
                        "stream" => Ok(stream_yields(limiter).await),
                        "writer" => Ok(writer_writes(limiter).await),
                        #[cfg(feature = "tower")]
                        "tower" | "tower max_wait" => Ok(tower_ready(limiter, how).await),
                        _ => tokio::task::spawn_blocking(move || limiter.acquire_blocking(1))
                            .await
                            .unwrap()
                            .map(|_| true),
                    };
                    (went.unwrap(), start.elapsed())
                })
            };
            // The refusal comes once the waiter has reserved (the next free
            // moment then one interval past its own), 20 ms in at the
            // soonest: a waiter that starts late on a loaded machine would
            // see the pause before it reserves.
            tokio::time::sleep(Duration::from_millis(20)).await;
            while limiter.snapshot().unwrap().wait() + start.elapsed() < 2 * MOMENT
                && start.elapsed() < MOMENT
            {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            // (Read before the lesson: the pause runs from the limiter's
            // own reading, which comes after this one.)
            let learned = start.elapsed();
            first.learn(&refused());
            drop(first);
            let (went, after) = waiter.await.unwrap();
            if learned >= MOMENT - Duration::from_millis(50) {
                assert!(attempt < 5, "{how}: the refusal came late 5 times");
                continue;
            }
            if how == "try_acquire" || how == "tower max_wait" {
                assert!(!went, "{how}: went after {after:?}, inside the pause");
                // (It waited for its moment first.)
                assert!(after >= MOMENT, "{how}: {after:?}");
            } else {
                assert!(went);
                // (A millisecond's slack: the limiter's clock is not the
                // one read here.)
                assert!(
                    after + Duration::from_millis(1) >= learned + PAUSE,
                    "{how}: went {after:?} after the start, inside the pause learned at {learned:?}"
                );
                assert!(after < learned + PAUSE * 4, "{how}: {after:?}");
            }
            break;
        }
    }
}

/// Whether a stream throttled by `limiter` yields its one item.
async fn stream_yields(limiter: Arc<RateLimiter>) -> bool {
    use futures::StreamExt;
    use paceline::stream::ThrottleExt;
    let mut items = futures::stream::iter([()]).throttle(limiter);
    matches!(items.next().await, Some(Ok(())))
}

/// Whether a writer throttled by `limiter` writes a byte.
async fn writer_writes(limiter: Arc<RateLimiter>) -> bool {
    use tokio::io::AsyncWriteExt;
    let mut writer = paceline::io::ThrottledWriter::new(tokio::io::sink(), limiter);
    writer.write_all(b"x").await.is_ok()
}

/// Whether a tower service over `limiter` (`how`: bounded by `max_wait`
/// or not) is made ready with a permit, rather than refused.
#[cfg(feature = "tower")]
async fn tower_ready(limiter: Arc<RateLimiter>, how: &str) -> bool {
    use tower::{Service, ServiceExt};
    let layer = paceline::tower::RateLimitLayer::new(limiter);
    let layer = match how {
        "tower max_wait" => layer.max_wait(2 * MOMENT),
        _ => layer,
    };
    let inner = tower::service_fn(|()| async { Ok::<_, std::convert::Infallible>(()) });
    let mut service = tower_layer::Layer::layer(&layer, inner);
    service.ready().await.unwrap();
    service.call(()).await.is_ok()
}

/// On a keyed limiter the pause is the key's: a caller of the key that
/// learned it goes behind it, one of another key at its moment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_pause_holds_its_waiting_callers_not_the_other_keys() {
    for attempt in 1.. {
        let limiter = Arc::new(
            KeyedRateLimiter::<String>::builder()
                .limit(Limit::per_second(2.0).burst(1))
                .build()
                .unwrap(),
        );
        let start = Instant::now();
        let first = limiter.call("refusing", 1).await.unwrap();
        limiter.acquire("other", 1).await.unwrap();
        let waiters = ["refusing", "other"].map(|key| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move {
                limiter.acquire(key, 1).await.unwrap();
                start.elapsed()
            })
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        // (Read before the lesson, as above.)
        let learned = start.elapsed();
        first.learn(&refused());
        drop(first);
        let [refusing, other] = waiters;
        let (refusing, other) = (refusing.await.unwrap(), other.await.unwrap());
        if learned >= MOMENT - Duration::from_millis(50) {
            assert!(attempt < 5, "the refusal came late 5 times");
            continue;
        }
        assert!(
            refusing + Duration::from_millis(1) >= learned + PAUSE,
            "the refusing key's caller went after {refusing:?}"
        );
        // The other key's, at its moment (`MOMENT`; the bound leaves a loaded
        // machine room, far from the pause).
        assert!(
            other < learned + PAUSE * 3 / 4,
            "the other key's caller went after {other:?}"
        );
        break;
    }
}
