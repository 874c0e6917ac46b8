//! A tower service stack whose outbound calls are paced: a stand-in API
//! client wrapped in `RateLimitLayer` at 5 calls per second, cloned into
//! three tasks that all share the one limiter.
//!
//! ```text
//! cargo run --example tower_client --features tower
//! ```

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use paceline::RateLimiter;
use paceline::tower::RateLimitLayer;
use tower_layer::Layer;
use tower_service::Service;

/// Stands in for a client of a rate-limited API.
#[derive(Clone)]
struct ApiClient {
    start: Instant,
}

impl Service<String> for ApiClient {
    type Response = String;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<String, std::io::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: String) -> Self::Future {
        let sent = self.start.elapsed();
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            Ok(format!("{request} sent at {:.3} s", sent.as_secs_f64()))
        })
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let limiter = Arc::new(
        RateLimiter::builder()
            .permits_per_second(5.0)
            .max_burst(Duration::ZERO)
            .build()?,
    );
    let client = RateLimitLayer::new(limiter).layer(ApiClient {
        start: Instant::now(),
    });
    let workers: Vec<_> = (0..3)
        .map(|worker| {
            let mut client = client.clone();
            tokio::spawn(async move {
                for call in 0..4 {
                    poll_fn(|cx| client.poll_ready(cx)).await?;
                    let reply = client.call(format!("worker {worker} call {call}")).await?;
                    println!("{reply}");
                }
                Ok::<_, paceline::tower::BoxError>(())
            })
        })
        .collect();
    for worker in workers {
        worker.await??;
    }
    println!("12 calls from 3 clones, one shared rate of 5/s: about 2.2 s in all");
    Ok(())
}
