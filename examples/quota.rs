//! Two limits at once: 10 requests per second and 1 000 an hour, all or
//! nothing, printing which limit made each request wait. For a short run
//! the hourly quota is shrunk to a burst of 12, so that it binds after a
//! dozen requests (3.6 s apart: 1 000 an hour). Limits in this process, or
//! through Redis (one key, one call for both limits) when `REDIS_URL` is
//! set.
//!
//! ```text
//! cargo run --example quota
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example quota --features redis
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use paceline::{Limit, Limiter, RateLimiter};

const LIMITS: [&str; 2] = ["10 per second", "1 000 an hour"];

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let per_second = Limit::per_second(10.0).burst(5);
    let per_hour = Limit::per(1000.0, Duration::from_secs(3600)).burst(12);
    let limiter: Arc<dyn Limiter> = match std::env::var("REDIS_URL") {
        #[cfg(feature = "redis")]
        Ok(url) => {
            println!("limiting through Redis");
            let client = paceline::redis::Client::open(url)?;
            let redis = paceline::redis::RedisBackend::builder(client)
                .build()
                .await?;
            Arc::new(
                RateLimiter::builder()
                    .limit(per_second)
                    .limit(per_hour)
                    .redis(&redis, "quota-example")
                    .build()?,
            )
        }
        #[cfg(not(feature = "redis"))]
        Ok(_) => return Err("REDIS_URL needs the example built with --features redis".into()),
        Err(_) => {
            println!("limiting in this process (set REDIS_URL to go through Redis)");
            Arc::new(
                RateLimiter::builder()
                    .limit(per_second)
                    .limit(per_hour)
                    .build()?,
            )
        }
    };
    let start = Instant::now();
    for request in 1..=15 {
        let reservation = limiter.reservation(1).await?;
        let waits_for = match reservation.limit() {
            Some(limit) => format!("waits {:?} for {}", reservation.delay(), LIMITS[limit]),
            None => "goes at once".to_owned(),
        };
        reservation.wait().await;
        println!(
            "{:>7.3} s  request {request:>2} {waits_for}",
            start.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
