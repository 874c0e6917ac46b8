//! HTTP glue (feature `http`): a layer that limits requests per client
//! and answers `429 Too Many Requests` with `Retry-After`, with the IETF
//! `RateLimit-Policy` and `RateLimit` headers on every response and a hook
//! to shape refusals ([`RateLimitLayer`]); which client a request comes
//! from ([`ClientIp`], behind trusted proxies only); and how long to tell a
//! refused one to wait. It works on the `http` crate's types, so any tower
//! server takes it (axum's `Router::layer` and `route_layer` as they are);
//! the crate does not depend on a server. `examples/axum_server/` is a
//! whole server (`cargo run -p paceline-axum-server`).
//!
//! # The client behind proxies
//!
//! Behind a load balancer or a reverse proxy, the peer of every connection
//! is the proxy; the client's address travels in a header the proxies
//! write (`Forwarded`, `X-Forwarded-For`, `X-Real-IP`). Any client can
//! write those headers too. Taking the address from them naively (the
//! leftmost `X-Forwarded-For` entry, say) lets every client choose its own
//! key: a new one per request to escape its limit, or a victim's to use up
//! theirs. [`TrustedProxies::client_ip`] trusts a forwarding header only
//! when the peer is one of the proxies you name, and reads the chain from
//! the right, past your own proxies only: the first address that is not
//! one of them is the client, whatever a client wrote to the left of it.
//!
//! ```
//! use std::net::IpAddr;
//! use paceline::http::TrustedProxies;
//!
//! let proxies = TrustedProxies::new(["10.0.0.0/8", "127.0.0.1"])?;
//! let mut headers = http::HeaderMap::new();
//! // The client forged "1.2.3.4"; the proxy at 10.0.0.5 appended what it saw.
//! headers.insert("x-forwarded-for", "1.2.3.4, 203.0.113.7".parse()?);
//! let peer: IpAddr = "10.0.0.5".parse()?;
//! assert_eq!(proxies.client_ip(peer, &headers), "203.0.113.7".parse::<IpAddr>()?);
//! // The same header from a peer that is not a proxy is ignored.
//! let peer: IpAddr = "198.51.100.9".parse()?;
//! assert_eq!(proxies.client_ip(peer, &headers), peer);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod client_ip;
mod headers;
mod key;
mod layer;

pub use client_ip::TrustedProxies;
pub use headers::{Headers, retry_after_secs};
pub use key::{ClientIp, Global, Header, KeyExtractor, PeerIp};
pub use layer::{
    AddHeaders, EmptyBody, OnRefused, Pending, RateLimit, RateLimitLayer, Refused, ResponseFuture,
};
