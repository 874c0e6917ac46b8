//! 1 000 simulated users, each limited to 5 requests per second, all asking
//! as fast as they can for 3 seconds; prints the spread of the per-user
//! achieved rates. Limits in this process with a `KeyedRateLimiter`, or
//! through Redis with a `KeyedRateLimiter<String, Redis>` when `REDIS_URL` is set.
//!
//! ```text
//! cargo run --release --example per_user
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --release --example per_user --features redis
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use paceline::{KeyedLimiter, KeyedRateLimiter};

const USERS: u32 = 1_000;
const RATE: f64 = 5.0;
const RUN: Duration = Duration::from_secs(3);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let limiter: Arc<dyn KeyedLimiter<String>> = match std::env::var("REDIS_URL") {
        #[cfg(feature = "redis")]
        Ok(url) => {
            let backend =
                paceline::redis::RedisBackend::builder(paceline::redis::Client::open(url)?)
                    .build()
                    .await?;
            println!("limiting through Redis (one connection for every user)");
            Arc::new(
                KeyedRateLimiter::<String>::builder()
                    .permits_per_second(RATE)
                    .max_burst(Duration::ZERO) // strict spacing: 200 ms apart per user
                    .redis(&backend, "per-user-example")
                    .build()?,
            )
        }
        #[cfg(not(feature = "redis"))]
        Ok(_) => return Err("REDIS_URL needs the example built with --features redis".into()),
        Err(_) => {
            println!("limiting in this process (set REDIS_URL to go through Redis)");
            Arc::new(
                KeyedRateLimiter::<String>::builder()
                    .permits_per_second(RATE)
                    .max_burst(Duration::ZERO)
                    .max_keys(10_000)
                    .build()?,
            )
        }
    };

    let start = Instant::now();
    let users: Vec<_> = (0..USERS)
        .map(|user| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move {
                let name = format!("user-{user}");
                let mut granted = Vec::new();
                while start.elapsed() < RUN {
                    // Each request waits for its user's turn, and no one else's.
                    limiter.acquire(&name, 1).await?;
                    granted.push(start.elapsed());
                }
                Ok::<_, paceline::Error>(granted)
            })
        })
        .collect();

    let mut rates = Vec::with_capacity(USERS as usize);
    for user in users {
        let granted = user.await.expect("user task")?;
        if let (Some(first), Some(last)) = (granted.first(), granted.last())
            && granted.len() > 1
        {
            rates.push((granted.len() - 1) as f64 / (*last - *first).as_secs_f64());
        }
    }
    rates.sort_by(f64::total_cmp);
    let at = |q: f64| rates[((rates.len() - 1) as f64 * q) as usize];
    println!(
        "{USERS} users at {RATE}/s each for {:.1} s: achieved per user min {:.3}, median {:.3}, max {:.3} /s",
        RUN.as_secs_f64(),
        at(0.0),
        at(0.5),
        at(1.0)
    );
    Ok(())
}
