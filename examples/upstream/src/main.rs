//! Runs the upstream of this package's library; see [`USAGE`] for the
//! options. Prints, each second something happened, what it admitted,
//! charged and refused in it.

use std::process::ExitCode;
use std::time::Duration;

use paceline_upstream::{Config, USAGE, Upstream};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let config = match Config::parse(args) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("{error}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let upstream = match Upstream::start(config) {
        Ok(upstream) => upstream,
        Err(error) => {
            eprintln!("cannot start: {error}");
            return ExitCode::FAILURE;
        }
    };
    let limits = upstream.config().limits;
    let show = |limit: Option<String>| limit.unwrap_or_else(|| "none".to_owned());
    println!(
        "listening on {}: {} requests/s, {} tokens/s, {} in flight, window {} s \
         (POST /v1/complete, GET /stats)",
        upstream.url(),
        show(limits.requests_per_second.map(|r| r.to_string())),
        show(limits.tokens_per_second.map(|r| r.to_string())),
        show(limits.max_in_flight.map(|m| m.to_string())),
        limits.window_secs,
    );
    let mut last = upstream.totals();
    let mut second = 0_u64;
    loop {
        std::thread::sleep(Duration::from_secs(1));
        second += 1;
        let now = upstream.totals();
        if now != last {
            println!(
                "{second:>5} s: admitted {}, tokens {}, refused {} (totals: {} admitted, \
                 {} tokens, {} refused, at most {} in flight)",
                now.admitted - last.admitted,
                now.tokens - last.tokens,
                now.refused - last.refused,
                now.admitted,
                now.tokens,
                now.refused,
                now.max_in_flight,
            );
        }
        last = now;
    }
}
