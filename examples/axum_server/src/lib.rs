//! An HTTP server that limits each client: 10 requests per second with a
//! burst of 10 per client address, `429 Too Many Requests` with
//! `Retry-After` past that, and the rate-limit headers on every response.
//! The client is the peer, or, behind a proxy you trust, the address the
//! proxy reports (a client cannot pick its own by forging a header).
//!
//! ```text
//! cargo run -p paceline-axum-server -- --port 3000
//! curl -i http://127.0.0.1:3000/
//! ```
//!
//! Options: `--port N` (default 3000), `--rate R` (per second, per client),
//! `--burst B` (requests at once after an idle spell, at least 1),
//! `--max-wait MS` (wait that
//! long for a permit before refusing), `--client-ip HEADER` (the header
//! your proxy writes the client's address in: `x-forwarded-for`,
//! `forwarded`, or one that holds one address such as `x-real-ip` or
//! `cf-connecting-ip`; default `peer`, none), `--trust CIDR` (a proxy
//! whose `--client-ip` header is believed; repeat it; each of these two
//! needs the other), and, built with the
//! `redis` feature (`cargo run -p paceline-axum-server --features redis`),
//! `--redis URL` to share each client's rate among every server on that
//! Redis.
//!
//! The server is this library (`app`, `serve`), so that its tests run it
//! as it is; `src/main.rs` reads the command line and starts it.

use std::error::Error;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::routing::get;
use paceline::http::{ClientIp, ClientIpSource, Headers, PeerIp, RateLimitLayer, TrustedProxies};
use paceline::{KeyedLimiter, KeyedRateLimiter, Limit};

/// What the server is asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// The port to listen on, on 127.0.0.1.
    pub port: u16,
    /// Requests per second, per client.
    pub rate: f64,
    /// Requests a client stores while idle.
    pub burst: u64,
    /// How long a request may wait for its permit before it is refused.
    pub max_wait: Duration,
    /// The header the proxies write the client's address in.
    pub client_ip: ClientIpSource,
    /// The proxies whose `client_ip` header is believed.
    pub trust: Vec<String>,
    /// A Redis URL to share the limits through.
    pub redis: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            port: 3000,
            rate: 10.0,
            burst: 10,
            max_wait: Duration::ZERO,
            client_ip: ClientIpSource::Peer,
            trust: Vec::new(),
            redis: None,
        }
    }
}

impl Options {
    /// The options from the command line.
    pub fn parse(mut args: impl Iterator<Item = String>) -> Result<Options, Box<dyn Error>> {
        let mut options = Options::default();
        while let Some(flag) = args.next() {
            let mut value = || args.next().ok_or(format!("{flag} needs a value"));
            match flag.as_str() {
                "--port" => options.port = value()?.parse()?,
                "--rate" => options.rate = value()?.parse()?,
                "--burst" => options.burst = value()?.parse()?,
                "--max-wait" => options.max_wait = Duration::from_millis(value()?.parse()?),
                "--client-ip" => options.client_ip = value()?.parse()?,
                "--trust" => options.trust.push(value()?),
                "--redis" => options.redis = Some(value()?),
                other => return Err(format!("unknown option {other}").into()),
            }
        }
        if !options.trust.is_empty() && options.client_ip == ClientIpSource::Peer {
            return Err("--trust needs --client-ip HEADER: the header your proxy writes".into());
        }
        // With no proxy trusted the header is never read: every client
        // behind a proxy would share the proxy's key.
        if options.trust.is_empty() && options.client_ip != ClientIpSource::Peer {
            return Err("--client-ip HEADER needs --trust CIDR: the proxy that writes it".into());
        }
        Ok(options)
    }
}

/// The limiter: in this process, or shared through Redis.
pub async fn limiter(options: &Options) -> Result<Arc<dyn KeyedLimiter<IpAddr>>, Box<dyn Error>> {
    // `burst` requests at once, then `rate` a second.
    let limit = Limit::per_second(options.rate).burst(options.burst);
    match &options.redis {
        None => Ok(Arc::new(
            KeyedRateLimiter::<IpAddr>::builder()
                .limit(limit)
                .max_keys(1_000_000)
                .build()?,
        )),
        #[cfg(feature = "redis")]
        Some(url) => {
            let client = paceline::redis::Client::open(url.as_str())?;
            let redis = paceline::redis::RedisBackend::builder(client)
                .build()
                .await?;
            Ok(Arc::new(
                KeyedRateLimiter::<IpAddr>::builder()
                    .limit(limit)
                    .redis(&redis, "http-clients")
                    .build()?,
            ))
        }
        #[cfg(not(feature = "redis"))]
        Some(_) => Err("--redis needs the server built with --features redis".into()),
    }
}

/// The application: one route, limited per client.
pub async fn app(options: &Options) -> Result<Router, Box<dyn Error>> {
    let client = ClientIp {
        peer: PeerIp::from_extension(|info: &ConnectInfo<SocketAddr>| info.0.ip()),
        proxies: TrustedProxies::new(options.client_ip.clone(), &options.trust)?,
    };
    let layer = RateLimitLayer::new(limiter(options).await?, client)
        .max_wait(options.max_wait)
        .headers(Headers::IetfAndLegacy)
        .policy_name("per-client");
    Ok(Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(layer))
}

/// Serves `app` on `listener`, telling it each connection's peer.
pub async fn serve(listener: tokio::net::TcpListener, app: Router) -> std::io::Result<()> {
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}
