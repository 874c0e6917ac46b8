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
//! is the proxy; the client's address travels in a header the proxy
//! writes. Any client can send those headers too, and most proxies pass on
//! the ones they do not write themselves, untouched. Taking the address
//! from a header your proxy does not write (or from the wrong end of one it
//! appends to) lets every client choose its own key: a new one per request
//! to escape its limit, or a victim's to use up theirs.
//!
//! So the key is read from one header only, the one *your* proxy
//! overwrites or appends to ([`ClientIpSource`]), and only from a peer that
//! is one of the proxies you name ([`TrustedProxies`]); every other
//! forwarding header is ignored, and with no source named the client is the
//! connection's peer. A list (`X-Forwarded-For`, `Forwarded`) is read from
//! the right, past your own proxies only: the first address that is not one
//! of them is the client, whatever a client wrote to the left of it. A
//! header that holds one address (`X-Real-IP`, `CF-Connecting-IP`) is
//! believed whole, because your proxy replaced whatever the client sent.
//! [`TrustedProxies::client_ip`] says how entries that are not addresses
//! and long headers are read. An IPv6 client is keyed by the first 64 bits
//! of its address ([`PeerIp::ipv6_prefix`]): a site picks any address in
//! its /64, and would otherwise take a new key with every request.
//!
//! ```
//! use std::net::IpAddr;
//! use paceline::http::{ClientIpSource, TrustedProxies};
//!
//! // nginx at 10.0.0.5 appends the peer it saw to X-Forwarded-For.
//! let proxies = TrustedProxies::new(ClientIpSource::XForwardedFor, ["10.0.0.0/8", "127.0.0.1"])?;
//! let mut headers = http::HeaderMap::new();
//! // The client forged "1.2.3.4", and a `Forwarded` that nginx passed on;
//! // nginx appended what it saw.
//! headers.insert("x-forwarded-for", "1.2.3.4, 203.0.113.7".parse()?);
//! headers.insert("forwarded", "for=9.9.9.9".parse()?);
//! let peer: IpAddr = "10.0.0.5".parse()?;
//! assert_eq!(proxies.client_ip(peer, &headers), "203.0.113.7".parse::<IpAddr>()?);
//! // The same headers from a peer that is not a proxy are ignored.
//! let peer: IpAddr = "198.51.100.9".parse()?;
//! assert_eq!(proxies.client_ip(peer, &headers), peer);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Which header your proxy writes
//!
//! | In front of the server | Source | Notes |
//! |---|---|---|
//! | nginx, `proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for` | `X-Forwarded-For` | appends the peer it saw |
//! | nginx, `proxy_set_header X-Real-IP $remote_addr` | `X-Real-IP` | replaces the client's; only where so configured |
//! | HAProxy, `option forwardfor` | `X-Forwarded-For` | adds a line with the peer it saw |
//! | AWS Application Load Balancer | `X-Forwarded-For` | appends (the default `append` mode) |
//! | Google Cloud load balancers | `X-Forwarded-For` | appends the client and then its own address: trust that address too |
//! | Cloudflare | `CF-Connecting-IP` | also appends to `X-Forwarded-For` |
//! | Fastly | `Fastly-Client-IP` | kept as the client sent it unless your service sets it from `client.ip`; else `X-Forwarded-For` |
//! | Akamai | `True-Client-IP` | where the property sends it |
//! | Fly.io | `Fly-Client-IP` | also appends to `X-Forwarded-For` |
//! | Envoy | `X-Forwarded-For` | appends with `use_remote_address`; `x-envoy-external-address` holds one address |
//! | Caddy | `X-Forwarded-For` | appends the peer it saw |
//! | Traefik | `X-Forwarded-For` | appends the peer it saw |
//! | Any of these set up to write RFC 7239 `Forwarded` (nginx and HAProxy can be) | `Forwarded` | only then: by default it is passed on as the client sent it |
//!
//! The header names in the second column parse into a [`ClientIpSource`]
//! (`"X-Forwarded-For".parse()`).
//!
//! Name as trusted every proxy of yours that a request passes (the one that
//! connects to the server, and each one before it), and nothing else (see
//! [`TrustedProxies`]). With several layers (a CDN, then a load balancer),
//! prefer the list that every layer appends to, and trust every layer's
//! addresses (the CDN's published ranges too): a client that goes around the
//! CDN is then keyed by the address the load balancer saw. A single-address
//! header that the outer layer sets is safe only if nothing but that layer can
//! reach the inner one: the peer checked is the inner layer, which passes the
//! header on whoever sent it.

mod client_ip;
mod headers;
mod key;
mod layer;

pub use client_ip::{ClientIpSource, TrustedProxies};
pub use headers::Headers;
pub use key::{ClientIp, Global, Header, KeyExtractor, PeerIp};
pub use layer::{EmptyBody, OnRefused, RateLimit, RateLimitLayer, Refused, ResponseFuture};
