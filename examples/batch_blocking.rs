//! Smooths a batch job: 4 worker threads process 60 items, sharing one
//! limiter of 30 items per second, with no async runtime at all.
//!
//! ```text
//! cargo run --example batch_blocking
//! ```

use std::sync::Arc;
use std::sync::mpsc;
use std::thread;
use std::time::Instant;

use paceline::RateLimiter;

fn main() -> Result<(), paceline::Error> {
    const WORKERS: usize = 4;
    const ITEMS: usize = 60;
    const RATE: f64 = 30.0;

    let limiter = Arc::new(RateLimiter::bursty(RATE)?);
    let (items, queue) = mpsc::channel::<usize>();
    let queue = Arc::new(std::sync::Mutex::new(queue));
    let start = Instant::now();

    let workers: Vec<_> = (0..WORKERS)
        .map(|worker| {
            let limiter = Arc::clone(&limiter);
            let queue = Arc::clone(&queue);
            thread::spawn(move || -> Result<usize, paceline::Error> {
                let mut done = 0;
                loop {
                    let item = match queue.lock().map(|q| q.recv()) {
                        Ok(Ok(item)) => item,
                        _ => return Ok(done),
                    };
                    limiter.acquire_blocking(1)?; // this thread waits its turn
                    if item % 10 == 0 {
                        println!(
                            "worker {worker} processes item {item:>2} at {:.2} s",
                            start.elapsed().as_secs_f64()
                        );
                    }
                    done += 1;
                }
            })
        })
        .collect();

    for item in 0..ITEMS {
        items.send(item).expect("workers are running");
    }
    drop(items); // no more work: workers stop when the queue is empty

    let mut total = 0;
    for worker in workers {
        total += worker.join().expect("worker panicked")?;
    }
    let elapsed = start.elapsed().as_secs_f64();
    println!(
        "{total} items by {WORKERS} workers in {elapsed:.2} s: {:.1} items/s (limit {RATE}/s)",
        (total - 1) as f64 / elapsed
    );
    Ok(())
}
