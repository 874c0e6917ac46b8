//! Paces a stream of simulated requests at 5 permits per second: ordinary
//! requests cost one permit, bulk requests two. Prints when each request is
//! released and the rate achieved.
//!
//! ```text
//! cargo run --example stream_pacing
//! ```

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use paceline::RateLimiter;
use paceline::stream::ThrottleExt;

/// A request to a rate-limited API.
#[derive(Debug)]
struct Request {
    id: u32,
    bulk: bool,
}

impl Request {
    /// What the API charges for it.
    fn permits(&self) -> u32 {
        if self.bulk { 2 } else { 1 }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), paceline::Error> {
    const RATE: f64 = 5.0;

    let limiter = Arc::new(RateLimiter::bursty(RATE)?);
    let requests = futures::stream::iter(1..=12).map(|id| Request {
        id,
        bulk: id % 4 == 0,
    });
    let mut paced = requests.throttle_by(limiter, Request::permits);

    let start = Instant::now();
    let (mut charged, mut last_charge) = (0, 0);
    while let Some(request) = paced.next().await {
        let request = request?; // only a remote limiter can fail here
        println!(
            "request {:>2}{} released at {:>6.3} s",
            request.id,
            if request.bulk { " (bulk)" } else { "       " },
            start.elapsed().as_secs_f64()
        );
        charged += request.permits();
        last_charge = request.permits();
    }

    // Every permit but the last request's was paid for before it went.
    let paid = charged - last_charge;
    let achieved = f64::from(paid) / start.elapsed().as_secs_f64();
    println!("{charged} permits charged; configured {RATE:.1}/s, achieved {achieved:.2}/s");
    Ok(())
}
