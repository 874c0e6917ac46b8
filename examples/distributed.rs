//! Three limiter instances, as three processes would have, share one rate of
//! 20 permits per second through Redis; each runs a few tasks that acquire in
//! a loop for three seconds.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example distributed --features redis
//! cargo run --example distributed --features redis   # starts a private redis-server if one is installed
//! ```

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use paceline::RateLimiter;
use paceline::redis::{Client, Fallback, RedisBackend};

const RATE: f64 = 20.0;
const INSTANCES: usize = 3;
const TASKS_PER_INSTANCE: usize = 2;
const RUN: Duration = Duration::from_secs(3);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = match std::env::var("REDIS_URL") {
        Ok(url) => (url, None),
        Err(_) => {
            let server = PrivateServer::start()?;
            (server.url(), Some(server))
        }
    };
    println!("sharing {RATE}/s through {url} among {INSTANCES} instances");

    // Each instance with a connection of its own, as separate processes
    // would have.
    let mut instances = Vec::new();
    for _ in 0..INSTANCES {
        let redis = RedisBackend::builder(Client::open(url.as_str())?)
            .build()
            .await?;
        let limiter = RateLimiter::builder()
            .permits_per_second(RATE)
            .max_burst(Duration::ZERO)
            .redis(&redis, "example")
            .fallback(Fallback::Local)
            .local_fraction(1.0 / INSTANCES as f64)
            .build()?;
        instances.push(Arc::new(limiter));
    }

    let start = Instant::now();
    let mut tasks = Vec::new();
    for (instance, limiter) in instances.iter().enumerate() {
        for task in 0..TASKS_PER_INSTANCE {
            let limiter = Arc::clone(limiter);
            tasks.push(tokio::spawn(async move {
                let mut count = 0u32;
                while start.elapsed() < RUN {
                    limiter.acquire(1).await?;
                    count += 1;
                    println!(
                        "{:>6.3} s  instance {instance} task {task}",
                        start.elapsed().as_secs_f64()
                    );
                }
                Ok::<u32, paceline::Error>(count)
            }));
        }
    }
    let mut total = 0;
    for task in tasks {
        total += task.await??;
    }
    let elapsed = start.elapsed().as_secs_f64();
    println!(
        "{total} permits in {elapsed:.2} s: {:.1}/s together (limit {RATE}/s); degraded: {}",
        f64::from(total - 1) / elapsed,
        instances.iter().any(|l| l.stats().degraded)
    );
    Ok(())
}

/// A throwaway redis-server on a free loopback port, stopped on drop.
struct PrivateServer {
    child: Child,
    port: u16,
}

impl PrivateServer {
    fn start() -> Result<Self, Box<dyn std::error::Error>> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("set REDIS_URL, or install redis-server ({e})"))?;
        let server = PrivateServer { child, port };
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err("the private redis-server did not start".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
