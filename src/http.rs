//! HTTP glue (feature `http`): a layer that limits requests per client
//! and answers `429 Too Many Requests` with `Retry-After`
//! ([`RateLimitLayer`]), which client a request comes from
//! ([`ClientIp`], behind trusted proxies only), and how long to tell a
//! refused one to wait. It works on the `http` crate's types, so any tower
//! server takes it (axum's `Router::layer` among them); the crate does not
//! depend on a server.
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
//! use throttler::http::TrustedProxies;
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
use std::task::{Context, Poll};
use std::time::Duration;

use ::http::header::RETRY_AFTER;
use ::http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use tower_layer::Layer;
use tower_service::Service;

use crate::{Error, KeyedLimiter};

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
/// use throttler::http::PeerIp;
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

/// Limits HTTP requests per key, answering a refused one with
/// `429 Too Many Requests` and a `Retry-After` of whole seconds (rounded
/// up); see [`RateLimitLayer::new`].
#[derive(Debug, Clone)]
pub struct RateLimitLayer<L, X> {
    limiter: L,
    extractor: X,
    max_wait: Duration,
}

impl<L, X> RateLimitLayer<L, X> {
    /// Limits requests per key with `limiter` (an `Arc` of any
    /// [`KeyedLimiter`], local or through Redis), the key found by
    /// `extractor` ([`ClientIp`], [`PeerIp`], [`Header`], [`Global`] with a
    /// limiter keyed by `()`, or a closure). A request whose key has no
    /// permit free is refused at once (see [`max_wait`](Self::max_wait)):
    /// it reserves nothing, and the inner service is not called. A
    /// limiter that fails (Redis down with `Fallback::FailClosed`) answers
    /// `503 Service Unavailable`.
    ///
    /// Cancel-safe: dropping the response future (the client hung up)
    /// gives back the permit it waits for or holds, as dropping
    /// [`try_acquire`](KeyedLimiter::try_acquire) does; once the inner
    /// service is called, the permit is used.
    pub fn new(limiter: L, extractor: X) -> Self {
        RateLimitLayer {
            limiter,
            extractor,
            max_wait: Duration::ZERO,
        }
    }

    /// Lets a request wait up to `max_wait` for its key's permit before
    /// it is refused. Default zero: refuse at once.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }
}

impl<S, L: Clone, X: Clone> Layer<S> for RateLimitLayer<L, X> {
    type Service = RateLimit<S, L, X>;

    fn layer(&self, inner: S) -> RateLimit<S, L, X> {
        RateLimit {
            inner,
            limiter: self.limiter.clone(),
            extractor: self.extractor.clone(),
            max_wait: self.max_wait,
        }
    }
}

/// An HTTP service limited per key by a [`RateLimitLayer`].
#[derive(Debug, Clone)]
pub struct RateLimit<S, L, X> {
    inner: S,
    limiter: L,
    extractor: X,
    max_wait: Duration,
}

/// A response with only a status (and `Retry-After`, for a refusal).
fn answer<R: Default>(status: StatusCode, retry_after: Option<Duration>) -> Response<R> {
    let mut response = Response::new(R::default());
    *response.status_mut() = status;
    if let Some(wait) = retry_after {
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(wait)));
    }
    response
}

impl<S, L, T, X, B, R> Service<Request<B>> for RateLimit<S, L, X>
where
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
    R: Default + Send + 'static,
    L: Deref<Target = T> + Clone + Send + Sync + 'static,
    T: KeyedLimiter<X::Key> + ?Sized,
    X: KeyExtractor<B>,
{
    type Response = Response<R>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<R>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let key = self.extractor.key(&request);
        // The ready service goes with the request; this one is a fresh
        // clone that must be made ready again.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let (limiter, max_wait) = (self.limiter.clone(), self.max_wait);
        Box::pin(async move {
            let Some(key) = key else {
                return Ok(answer(StatusCode::INTERNAL_SERVER_ERROR, None));
            };
            match limiter.try_acquire(&key, 1, max_wait).await {
                Ok(true) => inner.call(request).await,
                Ok(false) => {
                    let wait = limiter.available_in(&key).await.unwrap_or(Duration::ZERO);
                    Ok(answer(StatusCode::TOO_MANY_REQUESTS, Some(wait)))
                }
                Err(_) => Ok(answer(StatusCode::SERVICE_UNAVAILABLE, None)),
            }
        })
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
