//! `ThrottledWriter` into `tokio::io::sink()` at 1 GiB/s: the rate achieved
//! against the rate configured, on the real clock.
//!
//! ```text
//! cargo bench -p paceline-benches --bench io
//! ```
//!
//! Each case copies a fixed number of bytes (3 GiB, 3 s at the rate; 256 MiB
//! for the last case) through a
//! fresh writer and a fresh limiter, and reports bytes over elapsed time.
//! The limiter's schedule for N bytes ends at N / rate; the copy returns as
//! soon as the last chunk is granted, one chunk (at most 64 KiB, 61 µs)
//! before that, so the figure is exact to within one chunk over the run.
//!
//! Cases:
//! * `write_all 64 KiB`: writes of 64 KiB (one chunk each), default limiter
//!   (a burst of one second, empty at the start).
//! * `copy 8 KiB`: `tokio::io::copy` from `repeat(0)`, which writes 8 KiB
//!   at a time, default limiter.
//! * `write_all 64 KiB, burst 5 ms`: a small burst, enough to absorb the
//!   timer's late wake-ups.
//! * `write_all 64 KiB, no burst` (informative, not held to 0.99): with no
//!   burst at all, every late wake-up of the timer is lost (see the chunking
//!   notes in `paceline::io`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use paceline::RateLimiter;
use paceline::io::ThrottledWriter;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
const RATE: f64 = GIB;
/// Bytes per case: three seconds at the rate.
const BYTES: u64 = 3 * 1024 * 1024 * 1024;
/// Bytes for the case with no burst, which runs far slower than the rate.
const NO_BURST_BYTES: u64 = 256 * 1024 * 1024;

enum Feed {
    WriteAll(usize),
    Copy,
}

async fn run(
    name: &str,
    bytes: u64,
    feed: Feed,
    max_burst: Option<Duration>,
    held_to: Option<f64>,
) -> bool {
    let mut builder = RateLimiter::builder().permits_per_second(RATE);
    if let Some(burst) = max_burst {
        builder = builder.max_burst(burst);
    }
    let limiter = Arc::new(builder.build().expect("valid rate"));
    let mut writer = ThrottledWriter::new(tokio::io::sink(), limiter);
    let start = Instant::now();
    match feed {
        Feed::WriteAll(size) => {
            let buf = vec![0u8; size];
            let mut left = bytes;
            while left > 0 {
                let n = left.min(size as u64) as usize;
                writer.write_all(&buf[..n]).await.expect("sink");
                left -= n as u64;
            }
        }
        Feed::Copy => {
            let mut source = tokio::io::repeat(0).take(bytes);
            let copied = tokio::io::copy(&mut source, &mut writer)
                .await
                .expect("sink");
            assert_eq!(copied, bytes);
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let achieved = bytes as f64 / elapsed;
    let ratio = achieved / RATE;
    let verdict = match held_to {
        Some(floor) if ratio >= floor => "ok",
        Some(_) => "BELOW 0.99",
        None => "informative",
    };
    println!(
        "{name:<32} {:>6.3} s  {:>8.1} MiB/s  ratio {ratio:.4}  {verdict}",
        elapsed,
        achieved / (1024.0 * 1024.0),
    );
    held_to.is_none_or(|floor| ratio >= floor)
}

fn main() {
    // `cargo test --benches` runs bench targets with `--bench` absent: do
    // nothing there.
    if !std::env::args().any(|arg| arg == "--bench") {
        return;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    println!(
        "ThrottledWriter into tokio::io::sink() at {:.0} MiB/s",
        RATE / (1024.0 * 1024.0),
    );
    let mut ok = true;
    runtime.block_on(async {
        ok &= run(
            "write_all 64 KiB",
            BYTES,
            Feed::WriteAll(64 * 1024),
            None,
            Some(0.99),
        )
        .await;
        ok &= run("copy 8 KiB", BYTES, Feed::Copy, None, Some(0.99)).await;
        ok &= run(
            "write_all 64 KiB, burst 5 ms",
            BYTES,
            Feed::WriteAll(64 * 1024),
            Some(Duration::from_millis(5)),
            Some(0.99),
        )
        .await;
        ok &= run(
            "write_all 64 KiB, no burst",
            NO_BURST_BYTES,
            Feed::WriteAll(64 * 1024),
            Some(Duration::ZERO),
            None,
        )
        .await;
    });
    if !ok {
        println!("some case achieved less than 0.99 of the configured rate");
        std::process::exit(1);
    }
}
