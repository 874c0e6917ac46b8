//! Paces 20 simulated outbound calls at 5 per second with the local limiter,
//! printing when each call went out and the rate achieved.
//!
//! ```text
//! cargo run --example pace_outbound
//! ```

use std::time::{Duration, Instant};

use paceline::RateLimiter;

/// Stands in for a call to a rate-limited API.
async fn call_api(n: u32) -> u32 {
    tokio::time::sleep(Duration::from_millis(5)).await;
    n * 2
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), paceline::Error> {
    const CALLS: u32 = 20;
    const RATE: f64 = 5.0;

    let limiter = RateLimiter::bursty(RATE)?;
    let start = Instant::now();
    let (mut first_sent, mut last_sent) = (None, Duration::ZERO);

    for n in 1..=CALLS {
        let waited = limiter.acquire(1).await?;
        let sent = start.elapsed();
        first_sent.get_or_insert(sent);
        last_sent = sent;
        call_api(n).await;
        println!(
            "call {n:>2} sent at {:>7.3} s (waited {:>5.3} s)",
            sent.as_secs_f64(),
            waited.as_secs_f64()
        );
    }

    // Rate between the first and the last call: (calls - 1) intervals.
    let span = last_sent - first_sent.unwrap_or_default();
    let achieved = f64::from(CALLS - 1) / span.as_secs_f64();
    println!("{CALLS} calls, configured {RATE:.1}/s, achieved {achieved:.2}/s");
    Ok(())
}
