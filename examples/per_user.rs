//! 1 000 simulated users, each limited to 5 requests per second by one
//! `KeyedRateLimiter`, all asking as fast as they can for 3 seconds; prints
//! the spread of the per-user achieved rates and how many entries the
//! limiter holds.
//!
//! ```text
//! cargo run --release --example per_user
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use throttler::KeyedRateLimiter;

#[tokio::main]
async fn main() -> Result<(), throttler::Error> {
    const USERS: u32 = 1_000;
    const RATE: f64 = 5.0;
    const RUN: Duration = Duration::from_secs(3);

    let limiter = Arc::new(
        KeyedRateLimiter::<String>::builder()
            .permits_per_second(RATE)
            .max_burst(Duration::ZERO) // strict spacing: 200 ms apart per user
            .max_keys(10_000)
            .build()?,
    );
    let start = Instant::now();
    let users: Vec<_> = (0..USERS)
        .map(|user| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move {
                let name = format!("user-{user}");
                let mut granted = Vec::new();
                while start.elapsed() < RUN {
                    // Each request waits for its user's turn (and no one
                    // else's).
                    limiter.acquire(name.as_str(), 1).await?;
                    granted.push(start.elapsed());
                }
                Ok::<_, throttler::Error>(granted)
            })
        })
        .collect();

    let mut rates = Vec::with_capacity(USERS as usize);
    for user in users {
        let granted = user.await.expect("user task")?;
        if let (Some(first), Some(last)) = (granted.first(), granted.last()) {
            if granted.len() > 1 {
                let span = (*last - *first).as_secs_f64();
                rates.push((granted.len() - 1) as f64 / span);
            }
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
    println!(
        "entries held: {} (keys dropped before they were full: {})",
        limiter.len(),
        limiter.stats().dropped_unfinished
    );
    Ok(())
}
