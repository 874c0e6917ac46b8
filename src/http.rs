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

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::ops::Deref;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use ::http::header::RETRY_AFTER;
use ::http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use futures::FutureExt;
use futures::future::{self, Either, Join, Map, Ready};
use tower_layer::Layer;
use tower_service::Service;

use crate::{Error, KeyedLimiter, Snapshot};

/// The proxies whose forwarding headers are believed: addresses and
/// networks (`10.0.0.0/8`, `fd00::/8`, `127.0.0.1`). With none, every
/// request's client is its peer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies {
    nets: Vec<Net>,
}

/// A network: an address and how many of its leading bits count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Net {
    addr: IpAddr,
    prefix: u8,
}

impl Net {
    fn parse(text: &str) -> Result<Net, Error> {
        let bad = || {
            Error::InvalidArgument(format!(
                "a trusted proxy must be an address or a network such as 10.0.0.0/8 (got {text:?})"
            ))
        };
        let (addr, prefix) = match text.trim().split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (text.trim(), None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        let bits = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => bits,
            Some(prefix) => prefix
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= bits)
                .ok_or_else(bad)?,
        };
        Ok(Net { addr, prefix })
    }

    fn contains(&self, ip: IpAddr) -> bool {
        let masked = |bits: u128, width: u8| {
            let shift = u32::from(width - self.prefix);
            bits.checked_shr(shift).unwrap_or(0)
        };
        match (self.addr, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                masked(u32::from(net).into(), 32) == masked(u32::from(ip).into(), 32)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                masked(u128::from(net), 128) == masked(u128::from(ip), 128)
            }
            _ => false,
        }
    }
}

/// An IPv4 address mapped into IPv6 (`::ffff:a.b.c.d`, as a dual-stack
/// socket reports an IPv4 peer) is that IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

impl TrustedProxies {
    /// Trusts no proxy: the client is always the peer.
    pub fn none() -> TrustedProxies {
        TrustedProxies::default()
    }

    /// Trusts the proxies at these addresses or networks.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an entry that is neither an IP
    /// address nor a network in CIDR form.
    pub fn new<I, S>(proxies: I) -> Result<TrustedProxies, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let nets = proxies
            .into_iter()
            .map(|text| Net::parse(text.as_ref()))
            .collect::<Result<_, _>>()?;
        Ok(TrustedProxies { nets })
    }

    /// Whether `ip` is one of the trusted proxies.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.nets.iter().any(|net| net.contains(ip))
    }

    /// The client of a request that came from `peer` with `headers`.
    ///
    /// If the peer is not a trusted proxy, it is the client, whatever the
    /// headers say. Otherwise the forwarding chain (`Forwarded`, else
    /// `X-Forwarded-For`, else `X-Real-IP`; several fields of one name
    /// read in order) is read from the right: each trusted proxy passes the
    /// read on to the address it reported, and the first address that is
    /// not a trusted proxy is the client. An entry that is not an address
    /// (`unknown`, an obfuscated name, garbage) stops the read: the client
    /// is then the trusted proxy that reported it. If every address in the
    /// chain is a trusted proxy, the leftmost is the client.
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let mut client = canonical(peer);
        if !self.contains(client) {
            return client;
        }
        let chain = forwarded_chain(headers);
        for entry in chain.iter().rev() {
            let Some(ip) = entry.map(canonical) else {
                return client;
            };
            client = ip;
            if !self.contains(client) {
                return client;
            }
        }
        client
    }
}

/// The addresses a request's forwarding header lists, leftmost first:
/// `None` for an entry that is not an address.
fn forwarded_chain(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    let fields = |name: &str| -> Option<Vec<&str>> {
        let values: Vec<&str> = headers
            .get_all(name)
            .iter()
            .map(|value| value.to_str().unwrap_or(""))
            .collect();
        (!values.is_empty()).then_some(values)
    };
    if let Some(values) = fields("forwarded") {
        // RFC 7239: elements joined by commas, each `pair;pair`, the
        // client's address in `for=`.
        return values
            .iter()
            .flat_map(|value| value.split(','))
            .map(|element| {
                element
                    .split(';')
                    .find_map(|pair| {
                        let (name, value) = pair.trim().split_once('=')?;
                        name.trim()
                            .eq_ignore_ascii_case("for")
                            .then(|| address(value.trim().trim_matches('"')))
                    })
                    .flatten()
            })
            .collect();
    }
    if let Some(values) = fields("x-forwarded-for") {
        return values
            .iter()
            .flat_map(|value| value.split(','))
            .map(|entry| address(entry.trim()))
            .collect();
    }
    fields("x-real-ip").map_or_else(Vec::new, |values| {
        values.iter().map(|value| address(value.trim())).collect()
    })
}

/// An address as proxies write it: `192.0.2.1`, `192.0.2.1:8080`,
/// `2001:db8::1`, `[2001:db8::1]` or `[2001:db8::1]:8080`.
fn address(text: &str) -> Option<IpAddr> {
    text.parse::<IpAddr>()
        .ok()
        .or_else(|| text.parse::<SocketAddr>().ok().map(|socket| socket.ip()))
        .or_else(|| {
            let inner = text.strip_prefix('[')?.strip_suffix(']')?;
            inner.parse::<IpAddr>().ok()
        })
}

/// The `Retry-After` value for a wait, in whole seconds: rounded up, and
/// at least 1 (a client told 0 would retry at once, and be refused again).
pub fn retry_after_secs(wait: Duration) -> u64 {
    let whole = wait.as_secs();
    let secs = if wait.subsec_nanos() > 0 {
        whole.saturating_add(1)
    } else {
        whole
    };
    secs.max(1)
}

// ---------------------------------------------------------------------------
// The layer
// ---------------------------------------------------------------------------

/// How a request's key is found; see the implementations, or any
/// `Fn(&Request<B>) -> Option<K>` closure. `None`: no key can be found,
/// which is the server's misconfiguration (say, no peer address in the
/// request's extensions): the request is answered with
/// `500 Internal Server Error`, not let through unlimited.
pub trait KeyExtractor<B>: Clone + Send + Sync + 'static {
    /// The key: one rate per key.
    type Key: Send + Sync + 'static;

    /// The key of `request`.
    fn key(&self, request: &Request<B>) -> Option<Self::Key>;
}

impl<B, K, F> KeyExtractor<B> for F
where
    F: Fn(&Request<B>) -> Option<K> + Clone + Send + Sync + 'static,
    K: Send + Sync + 'static,
{
    type Key = K;

    fn key(&self, request: &Request<B>) -> Option<K> {
        self(request)
    }
}

/// One key for every request: a limit for the whole service.
#[derive(Debug, Clone, Copy, Default)]
pub struct Global;

impl<B> KeyExtractor<B> for Global {
    type Key = ();

    fn key(&self, _: &Request<B>) -> Option<()> {
        Some(())
    }
}

/// The value of a request header (an API key, a tenant): requests
/// without it share one key, the empty string.
#[derive(Debug, Clone)]
pub struct Header(pub HeaderName);

impl<B> KeyExtractor<B> for Header {
    type Key = String;

    fn key(&self, request: &Request<B>) -> Option<String> {
        let value = request.headers().get(&self.0);
        Some(String::from_utf8_lossy(value.map_or(&[][..], |v| v.as_bytes())).into_owned())
    }
}

/// The peer's address, as the server put it in the request's extensions:
/// `T` is the type it stores there (axum: `ConnectInfo<SocketAddr>`, with
/// `into_make_service_with_connect_info`), `peer` reads the address from
/// it. With [`ClientIp`], the client's address behind trusted proxies.
///
/// ```
/// use std::net::SocketAddr;
/// use paceline::http::PeerIp;
///
/// // A server that stores the peer's socket address as is:
/// let key = PeerIp::from_extension(|peer: &SocketAddr| peer.ip());
/// # let _ = key;
/// ```
pub struct PeerIp<T> {
    peer: fn(&T) -> IpAddr,
}

impl<T> PeerIp<T> {
    /// Reads the peer's address from the extension of type `T`.
    pub fn from_extension(peer: fn(&T) -> IpAddr) -> Self {
        PeerIp { peer }
    }

    fn peer<B>(&self, request: &Request<B>) -> Option<IpAddr>
    where
        T: Send + Sync + 'static,
    {
        request.extensions().get::<T>().map(self.peer)
    }
}

impl<T> Clone for PeerIp<T> {
    fn clone(&self) -> Self {
        PeerIp { peer: self.peer }
    }
}

impl<T> std::fmt::Debug for PeerIp<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerIp")
    }
}

impl<B, T: Send + Sync + 'static> KeyExtractor<B> for PeerIp<T> {
    type Key = IpAddr;

    fn key(&self, request: &Request<B>) -> Option<IpAddr> {
        self.peer(request).map(canonical)
    }
}

/// The client's address: the peer's, or, when the peer is one of the
/// trusted proxies, the one the forwarding headers give
/// ([`TrustedProxies::client_ip`]).
#[derive(Debug)]
pub struct ClientIp<T> {
    /// Where the peer's address is.
    pub peer: PeerIp<T>,
    /// Whose forwarding headers are believed.
    pub proxies: TrustedProxies,
}

impl<T> Clone for ClientIp<T> {
    fn clone(&self) -> Self {
        ClientIp {
            peer: self.peer.clone(),
            proxies: self.proxies.clone(),
        }
    }
}

impl<B, T: Send + Sync + 'static> KeyExtractor<B> for ClientIp<T> {
    type Key = IpAddr;

    fn key(&self, request: &Request<B>) -> Option<IpAddr> {
        let peer = self.peer.peer(request)?;
        Some(self.proxies.client_ip(peer, request.headers()))
    }
}

/// Which rate-limit headers a [`RateLimitLayer`] writes on every response
/// it lets through or refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Headers {
    /// None (a refusal still carries `Retry-After`).
    None,
    /// `RateLimit-Policy` and `RateLimit`, as the IETF draft
    /// (draft-ietf-httpapi-ratelimit-headers) names them. The default.
    Ietf,
    /// Those, and the older `X-RateLimit-Limit`, `X-RateLimit-Remaining`
    /// and `X-RateLimit-Reset` for clients that read those.
    IetfAndLegacy,
}

/// What a refused request is told: passed to the hook that shapes its
/// response ([`RateLimitLayer::on_refused`]).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Refused {
    /// How long until the request would go: `Retry-After`, before it is
    /// rounded up to whole seconds.
    pub retry_after: Duration,
    /// The key's state when it was refused.
    pub snapshot: Snapshot,
}

/// Shapes the response to a refused request: any
/// `Fn(&Refused) -> Response<R>` closure, or [`EmptyBody`] (the default).
/// The layer then adds `Retry-After` and the rate-limit headers, unless the
/// response already has them; the status is the hook's (return
/// `429 Too Many Requests` unless you have a reason not to).
pub trait OnRefused<R>: Clone + Send + Sync + 'static {
    /// The response to a refused request.
    fn response(&self, refused: &Refused) -> Response<R>;
}

impl<R, F> OnRefused<R> for F
where
    F: Fn(&Refused) -> Response<R> + Clone + Send + Sync + 'static,
{
    fn response(&self, refused: &Refused) -> Response<R> {
        self(refused)
    }
}

/// The default refusal: `429 Too Many Requests` with an empty body.
#[derive(Debug, Clone, Copy, Default)]
pub struct EmptyBody;

impl<R: Default> OnRefused<R> for EmptyBody {
    fn response(&self, _: &Refused) -> Response<R> {
        answer(StatusCode::TOO_MANY_REQUESTS)
    }
}

/// Limits HTTP requests per key, answering a refused one with
/// `429 Too Many Requests`, `Retry-After` in whole seconds (rounded up),
/// and the rate-limit headers on every response; see
/// [`RateLimitLayer::new`].
#[derive(Debug, Clone)]
pub struct RateLimitLayer<L, X, H = EmptyBody> {
    limiter: L,
    extractor: X,
    config: Config<H>,
}

/// What a layer and its services share besides the limiter and extractor.
#[derive(Debug, Clone)]
struct Config<H> {
    max_wait: Duration,
    headers: Headers,
    /// The policy's name, and its `RateLimit-Policy` value.
    policy: Arc<PolicyName>,
    on_refused: H,
}

impl<L, X> RateLimitLayer<L, X> {
    /// Limits requests per key with `limiter` (an `Arc` of any
    /// [`KeyedLimiter`], local or through Redis), the key found by
    /// `extractor` ([`ClientIp`], [`PeerIp`], [`Header`], [`Global`] with a
    /// limiter keyed by `()`, or a closure).
    ///
    /// A request whose key has no permit free is refused at once (see
    /// [`max_wait`](Self::max_wait)): it reserves nothing, the inner
    /// service is not called, and the answer is `429 Too Many Requests`
    /// (see [`on_refused`](Self::on_refused)) with `Retry-After`. Every
    /// response carries the rate-limit headers (see
    /// [`headers`](Self::headers)). A limiter that fails (Redis down with
    /// `Fallback::FailClosed`) answers `503 Service Unavailable`; a
    /// request whose key cannot be found, `500 Internal Server Error`.
    ///
    /// # The headers
    ///
    /// With the key's [`Snapshot`] after the request (a second call to the
    /// limiter: a second round trip for a Redis limiter; turn them off
    /// with [`Headers::None`] where that matters):
    ///
    /// * `RateLimit-Policy: "default";q=Q;w=W`: the rate as `Q` requests
    ///   per `W` seconds, `W` the shortest whole number of seconds (at
    ///   least 1) in which a drained key gets its whole burst back, and `Q`
    ///   the requests the rate allows in `W`, or the burst if that is more.
    /// * `RateLimit: "default";r=R;t=T`: `R` requests would go now, one
    ///   after another ([`Snapshot::remaining`]; 0 on a refusal); `T`
    ///   seconds (rounded up) until the key is full again
    ///   ([`Snapshot::full_in`]).
    /// * `Retry-After` on a refusal: the wait, rounded up, at least 1.
    ///
    /// ```
    /// use std::net::{IpAddr, SocketAddr};
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use paceline::KeyedRateLimiter;
    /// use paceline::http::{ClientIp, PeerIp, RateLimitLayer, TrustedProxies};
    ///
    /// let limiter = Arc::new(
    ///     KeyedRateLimiter::<IpAddr>::builder()
    ///         .permits_per_second(10.0)
    ///         .max_burst(Duration::from_secs(1))
    ///         .build()?,
    /// );
    /// // The client's address, behind the load balancers at 10.0.0.0/8 (axum:
    /// // `ConnectInfo<SocketAddr>`, with `into_make_service_with_connect_info`).
    /// let key = ClientIp {
    ///     peer: PeerIp::from_extension(|peer: &SocketAddr| peer.ip()),
    ///     proxies: TrustedProxies::new(["10.0.0.0/8"])?,
    /// };
    /// let layer = RateLimitLayer::new(limiter, key).policy_name("per-client");
    /// // axum: Router::new().route(..).layer(layer)
    /// # let _ = layer;
    /// # Ok::<(), paceline::Error>(())
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Dropping the response future (the client hung up) gives back the
    /// permit it waits for or holds, as dropping
    /// [`try_acquire`](KeyedLimiter::try_acquire) does; once the inner
    /// service is called, the permit is used.
    pub fn new(limiter: L, extractor: X) -> Self {
        RateLimitLayer {
            limiter,
            extractor,
            config: Config {
                max_wait: Duration::ZERO,
                headers: Headers::Ietf,
                policy: Arc::new(PolicyName::new("\"default\"".into())),
                on_refused: EmptyBody,
            },
        }
    }
}

impl<L, X, H> RateLimitLayer<L, X, H> {
    /// Lets a request wait up to `max_wait` for its key's permit before
    /// it is refused. Default zero: refuse at once.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.config.max_wait = max_wait;
        self
    }

    /// Which rate-limit headers every response carries. Default
    /// [`Headers::Ietf`].
    pub fn headers(mut self, headers: Headers) -> Self {
        self.config.headers = headers;
        self
    }

    /// The policy's name in the headers (default `default`). Characters
    /// a header cannot carry are replaced by `?`.
    pub fn policy_name(mut self, name: &str) -> Self {
        let mut quoted = String::with_capacity(name.len() + 2);
        quoted.push('"');
        for c in name.chars() {
            match c {
                '"' | '\\' => {
                    quoted.push('\\');
                    quoted.push(c);
                }
                ' '..='~' => quoted.push(c),
                _ => quoted.push('?'),
            }
        }
        quoted.push('"');
        self.config.policy = Arc::new(PolicyName::new(quoted.into()));
        self
    }

    /// Shapes the response to a refused request (a JSON body, a different
    /// status): a closure from [`Refused`] to a response. The layer adds
    /// `Retry-After` and the rate-limit headers unless it set them.
    ///
    /// ```
    /// use std::net::{IpAddr, SocketAddr};
    /// use std::sync::Arc;
    /// use http::{Response, StatusCode};
    /// use paceline::KeyedRateLimiter;
    /// use paceline::http::{PeerIp, RateLimitLayer, Refused};
    ///
    /// let limiter = Arc::new(KeyedRateLimiter::<IpAddr>::bursty(10.0)?);
    /// let peer = PeerIp::from_extension(|peer: &SocketAddr| peer.ip());
    /// let layer = RateLimitLayer::new(limiter, peer).on_refused(|refused: &Refused| {
    ///     let body = format!(r#"{{"error":"slow down","retry_ms":{}}}"#, refused.retry_after.as_millis());
    ///     Response::builder()
    ///         .status(StatusCode::TOO_MANY_REQUESTS)
    ///         .header("content-type", "application/json")
    ///         .body(body)
    ///         .unwrap()
    /// });
    /// # let _ = layer;
    /// # Ok::<(), paceline::Error>(())
    /// ```
    pub fn on_refused<G>(self, on_refused: G) -> RateLimitLayer<L, X, G> {
        let Config {
            max_wait,
            headers,
            policy,
            ..
        } = self.config;
        RateLimitLayer {
            limiter: self.limiter,
            extractor: self.extractor,
            config: Config {
                max_wait,
                headers,
                policy,
                on_refused,
            },
        }
    }
}

impl<S, L: Clone, X: Clone, H: Clone> Layer<S> for RateLimitLayer<L, X, H> {
    type Service = RateLimit<S, L, X, H>;

    fn layer(&self, inner: S) -> RateLimit<S, L, X, H> {
        RateLimit {
            inner,
            limiter: self.limiter.clone(),
            extractor: self.extractor.clone(),
            config: self.config.clone(),
        }
    }
}

/// An HTTP service limited per key by a [`RateLimitLayer`].
#[derive(Debug, Clone)]
pub struct RateLimit<S, L, X, H = EmptyBody> {
    inner: S,
    limiter: L,
    extractor: X,
    config: Config<H>,
}

/// A response with only a status.
fn answer<R: Default>(status: StatusCode) -> Response<R> {
    let mut response = Response::new(R::default());
    *response.status_mut() = status;
    response
}

/// The largest integer a structured-field header carries.
const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

/// Whole seconds, rounded up.
fn secs_up(duration: Duration) -> u64 {
    duration.as_secs() + u64::from(duration.subsec_nanos() > 0)
}

/// The policy's quota and window for `snapshot` (see
/// [`RateLimitLayer::new`]): `q` requests per `w` seconds.
fn quota(snapshot: &Snapshot) -> (u64, u64) {
    let burst = snapshot.burst().min(SF_INTEGER_MAX);
    let rate = snapshot.rate();
    // A drained key (its next request owing one interval) has its burst
    // back after `burst` intervals.
    let refill = burst as f64 / rate;
    let window = if refill.is_finite() && refill > 1.0 {
        (refill.ceil() as u64).min(SF_INTEGER_MAX)
    } else {
        1
    };
    let allowed = (rate * window as f64).floor();
    let allowed = if allowed < SF_INTEGER_MAX as f64 {
        allowed as u64
    } else {
        SF_INTEGER_MAX
    };
    (allowed.max(burst), window)
}

/// A header value built on the stack: `parts` one after another (one
/// allocation, the value's own; a value too long for the stack, from a
/// long policy name, goes through a `Vec`).
fn header_value(parts: &[Part<'_>]) -> Option<HeaderValue> {
    let mut buffer = [0u8; 96];
    let mut at = 0;
    let mut spilled: Option<Vec<u8>> = None;
    for part in parts {
        let mut digits = [0u8; 20];
        let bytes = part.bytes(&mut digits);
        match &mut spilled {
            Some(spilled) => spilled.extend_from_slice(bytes),
            None if at + bytes.len() <= buffer.len() => {
                buffer[at..at + bytes.len()].copy_from_slice(bytes);
                at += bytes.len();
            }
            None => {
                let mut long = buffer[..at].to_vec();
                long.extend_from_slice(bytes);
                spilled = Some(long);
            }
        }
    }
    HeaderValue::from_bytes(spilled.as_deref().unwrap_or(&buffer[..at])).ok()
}

/// A piece of a header value.
enum Part<'a> {
    Text(&'a str),
    Number(u64),
}

impl Part<'_> {
    /// Its bytes (a number's digits written into `digits`).
    fn bytes<'b>(&'b self, digits: &'b mut [u8; 20]) -> &'b [u8] {
        match self {
            Part::Text(text) => text.as_bytes(),
            Part::Number(n) => {
                let (mut n, mut i) = (*n, digits.len());
                loop {
                    i -= 1;
                    digits[i] = b'0' + (n % 10) as u8;
                    n /= 10;
                    if n == 0 {
                        break;
                    }
                }
                &digits[i..]
            }
        }
    }
}

/// A policy's name as a structured-field string (quotes included), and
/// its last `RateLimit-Policy` value, which changes only with the rate.
#[derive(Debug)]
struct PolicyName {
    quoted: Box<str>,
    value: std::sync::RwLock<Option<(u64, u64, HeaderValue)>>,
}

impl PolicyName {
    fn new(quoted: Box<str>) -> PolicyName {
        PolicyName {
            quoted,
            value: std::sync::RwLock::new(None),
        }
    }

    /// The `RateLimit-Policy` value for `q` requests per `w` seconds.
    fn value(&self, q: u64, w: u64) -> Option<HeaderValue> {
        let read = |value: &Option<(u64, u64, HeaderValue)>| match value {
            Some((cached_q, cached_w, value)) if (*cached_q, *cached_w) == (q, w) => {
                Some(value.clone())
            }
            _ => None,
        };
        if let Ok(cached) = self.value.read()
            && let Some(value) = read(&cached)
        {
            return Some(value);
        }
        use Part::{Number, Text};
        let quoted = &*self.quoted;
        let value = header_value(&[Text(quoted), Text(";q="), Number(q), Text(";w="), Number(w)])?;
        if let Ok(mut cached) = self.value.write() {
            *cached = Some((q, w, value.clone()));
        }
        Some(value)
    }
}

/// Writes the rate-limit headers for `snapshot` into `headers`, leaving
/// any already there. `refused`: the request was refused, so none remains
/// (a permit that came back between the refusal and the snapshot is not
/// reported).
fn write_headers(
    headers: &mut HeaderMap,
    kind: Headers,
    policy: &PolicyName,
    snapshot: &Snapshot,
    refused: bool,
) {
    if kind == Headers::None {
        return;
    }
    let (q, w) = quota(snapshot);
    let r = if refused {
        0
    } else {
        snapshot.remaining().min(SF_INTEGER_MAX)
    };
    let t = secs_up(snapshot.full_in()).min(SF_INTEGER_MAX);
    headers.reserve(if kind == Headers::IetfAndLegacy { 5 } else { 2 });
    // Each value is made only if the header is not there yet.
    let mut put = |name: HeaderName, value: &dyn Fn() -> Option<HeaderValue>| {
        if let ::http::header::Entry::Vacant(vacant) = headers.entry(name)
            && let Some(value) = value()
        {
            vacant.insert(value);
        }
    };
    use Part::{Number, Text};
    put(RATELIMIT_POLICY, &|| policy.value(q, w));
    let name = &*policy.quoted;
    put(RATELIMIT, &|| {
        header_value(&[Text(name), Text(";r="), Number(r), Text(";t="), Number(t)])
    });
    if kind == Headers::IetfAndLegacy {
        put(X_RATELIMIT_LIMIT, &|| Some(HeaderValue::from(q)));
        put(X_RATELIMIT_REMAINING, &|| Some(HeaderValue::from(r)));
        put(X_RATELIMIT_RESET, &|| Some(HeaderValue::from(t)));
    }
}

const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// The headers a granted request's response gets once the inner service
/// answers: which, the policy's name, and the key's snapshot after the
/// grant (`None`: none).
#[doc(hidden)]
pub struct Pending(Option<(Headers, Arc<PolicyName>, Snapshot)>);

/// What adds a granted request's headers to its response.
#[doc(hidden)]
pub type AddHeaders<R, E> = fn((Result<Response<R>, E>, Pending)) -> Result<Response<R>, E>;

/// Adds a granted request's headers to its response.
fn add_headers<R, E>(
    (result, Pending(pending)): (Result<Response<R>, E>, Pending),
) -> Result<Response<R>, E> {
    let mut response = result?;
    if let Some((kind, policy, snapshot)) = pending {
        write_headers(response.headers_mut(), kind, &policy, &snapshot, false);
    }
    Ok(response)
}

/// The response future of [`RateLimit`]: the inner service's, with the
/// headers added, when the limiter answered at once (a request with its
/// permit free, or refused at once, on a limiter in this process); boxed
/// otherwise (a wait, a Redis round trip).
pub type ResponseFuture<F, R, E> = Either<
    Map<Join<F, Ready<Pending>>, AddHeaders<R, E>>,
    Either<
        Ready<Result<Response<R>, E>>,
        Pin<Box<dyn Future<Output = Result<Response<R>, E>> + Send>>,
    >,
>;

/// The response to a refused request: the hook's, with `Retry-After` and
/// the headers added.
fn refusal<R, H: OnRefused<R>>(config: &Config<H>, snapshot: Snapshot) -> Response<R> {
    let refused = Refused {
        retry_after: snapshot.wait(),
        snapshot,
    };
    let mut response = config.on_refused.response(&refused);
    let headers = response.headers_mut();
    if !headers.contains_key(RETRY_AFTER) {
        let secs = retry_after_secs(refused.retry_after);
        headers.insert(RETRY_AFTER, HeaderValue::from(secs));
    }
    write_headers(headers, config.headers, &config.policy, &snapshot, true);
    response
}

impl<S, L, T, X, H, B, R> Service<Request<B>> for RateLimit<S, L, X, H>
where
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
    R: Default + Send + 'static,
    L: Deref<Target = T> + Clone + Send + Sync + 'static,
    T: KeyedLimiter<X::Key> + ?Sized,
    X: KeyExtractor<B>,
    H: OnRefused<R>,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, R, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let Some(key) = self.extractor.key(&request) else {
            let response = answer(StatusCode::INTERNAL_SERVER_ERROR);
            return Either::Right(Either::Left(future::ready(Ok(response))));
        };
        let config = &self.config;
        // A limiter in this process answers at once: no future to box.
        match self.limiter.take_if_free(&key, 1) {
            Some(Ok(true)) => {
                let pending = match config.headers {
                    Headers::None => None,
                    kind => self
                        .limiter
                        .snapshot_if_local(&key)
                        .map(|snapshot| (kind, Arc::clone(&config.policy), snapshot)),
                };
                let answered =
                    future::join(self.inner.call(request), future::ready(Pending(pending)));
                let add: AddHeaders<R, S::Error> = add_headers;
                return Either::Left(answered.map(add));
            }
            Some(Ok(false)) if config.max_wait.is_zero() => {
                if let Some(snapshot) = self.limiter.snapshot_if_local(&key) {
                    let response = refusal(config, snapshot);
                    return Either::Right(Either::Left(future::ready(Ok(response))));
                }
            }
            _ => {}
        }
        // The ready service goes with the request; this one is a fresh
        // clone that must be made ready again.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let (limiter, config) = (self.limiter.clone(), self.config.clone());
        Either::Right(Either::Right(Box::pin(async move {
            match limiter.try_acquire(&key, 1, config.max_wait).await {
                Ok(true) => {
                    let snapshot = match config.headers {
                        Headers::None => None,
                        _ => limiter.snapshot(&key).await.ok(),
                    };
                    let mut response = inner.call(request).await?;
                    if let Some(snapshot) = snapshot {
                        let headers = response.headers_mut();
                        write_headers(headers, config.headers, &config.policy, &snapshot, false);
                    }
                    Ok(response)
                }
                Ok(false) => match limiter.snapshot(&key).await {
                    Ok(snapshot) => Ok(refusal(&config, snapshot)),
                    Err(_) => Ok(answer(StatusCode::SERVICE_UNAVAILABLE)),
                },
                Err(_) => Ok(answer(StatusCode::SERVICE_UNAVAILABLE)),
            }
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(*name, value.parse().unwrap());
        }
        headers
    }

    fn proxies() -> TrustedProxies {
        TrustedProxies::new(["10.0.0.0/8", "192.168.1.1", "fd00::/8"]).unwrap()
    }

    #[test]
    fn networks_parse_and_contain() {
        let proxies = proxies();
        for inside in [
            "10.0.0.1",
            "10.255.255.255",
            "192.168.1.1",
            "fd12::1",
            "::ffff:10.1.2.3",
        ] {
            assert!(proxies.contains(ip(inside)), "{inside}");
        }
        for outside in ["11.0.0.1", "192.168.1.2", "fe00::1", "::1", "9.255.255.255"] {
            assert!(!proxies.contains(ip(outside)), "{outside}");
        }
        let all = TrustedProxies::new(["0.0.0.0/0", "::/0"]).unwrap();
        assert!(all.contains(ip("1.2.3.4")) && all.contains(ip("2001:db8::1")));
        for bad in [
            "10.0.0.0/33",
            "::/129",
            "10.0.0",
            "proxy.local",
            "10.0.0.0/x",
            "",
        ] {
            let error = TrustedProxies::new([bad]).unwrap_err();
            assert!(matches!(error, Error::InvalidArgument(_)), "{bad}");
        }
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_forges() {
        let forged = headers(&[
            ("x-forwarded-for", "1.1.1.1"),
            ("forwarded", "for=2.2.2.2"),
            ("x-real-ip", "3.3.3.3"),
        ]);
        let peer = ip("198.51.100.7");
        assert_eq!(proxies().client_ip(peer, &forged), peer);
        assert_eq!(
            TrustedProxies::none().client_ip(ip("10.0.0.1"), &forged),
            ip("10.0.0.1")
        );
    }

    #[test]
    fn the_chain_is_read_from_the_right_past_trusted_proxies_only() {
        let proxies = proxies();
        let peer = ip("10.0.0.5");
        for (value, client) in [
            // One proxy appended the client it saw.
            ("203.0.113.7", "203.0.113.7"),
            // The client forged entries to the left: ignored.
            ("6.6.6.6, 203.0.113.7", "203.0.113.7"),
            // Two proxies of ours: the client is before them.
            ("203.0.113.7, 10.0.0.9", "203.0.113.7"),
            ("6.6.6.6, 203.0.113.7, 192.168.1.1, 10.0.0.9", "203.0.113.7"),
            // Ports, and spaces.
            ("203.0.113.7:5555", "203.0.113.7"),
            ("  [2001:db8::7]:443 ", "2001:db8::7"),
            // Every entry one of ours: the leftmost.
            ("10.1.1.1, 10.0.0.9", "10.1.1.1"),
            // Garbage where the client should be: the proxy that wrote it.
            ("6.6.6.6, garbage", "10.0.0.5"),
            ("203.0.113.7, unknown, 10.0.0.9", "10.0.0.9"),
        ] {
            let got = proxies.client_ip(peer, &headers(&[("x-forwarded-for", value)]));
            assert_eq!(got, ip(client), "{value}");
        }
        // Several fields: read in order, as one list.
        let split = headers(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-for", "203.0.113.8"),
        ]);
        assert_eq!(proxies.client_ip(peer, &split), ip("203.0.113.8"));
        // No header: the peer.
        assert_eq!(proxies.client_ip(peer, &HeaderMap::new()), peer);
    }

    #[test]
    fn forwarded_wins_and_x_real_ip_is_the_last_resort() {
        let proxies = proxies();
        let peer = ip("10.0.0.5");
        let both = headers(&[
            ("x-forwarded-for", "1.1.1.1"),
            (
                "forwarded",
                "for=6.6.6.6, for=\"[2001:db8:cafe::17]:4711\";proto=https;by=10.0.0.5",
            ),
        ]);
        assert_eq!(proxies.client_ip(peer, &both), ip("2001:db8:cafe::17"));
        let obfuscated = headers(&[("forwarded", "for=_hidden, For=10.0.0.9")]);
        assert_eq!(proxies.client_ip(peer, &obfuscated), ip("10.0.0.9"));
        let real = headers(&[("x-real-ip", "203.0.113.9")]);
        assert_eq!(proxies.client_ip(peer, &real), ip("203.0.113.9"));
        // A dual-stack socket's mapped IPv4 peer is the IPv4 proxy.
        let mapped = ip("::ffff:10.0.0.5");
        assert_eq!(proxies.client_ip(mapped, &real), ip("203.0.113.9"));
    }

    #[test]
    fn retry_after_rounds_up_to_at_least_a_second() {
        for (wait, secs) in [
            (Duration::ZERO, 1),
            (Duration::from_millis(1), 1),
            (Duration::from_secs(1), 1),
            (Duration::from_millis(1001), 2),
            (Duration::from_secs(59), 59),
            (Duration::MAX, u64::MAX),
        ] {
            assert_eq!(retry_after_secs(wait), secs, "{wait:?}");
        }
    }
}
