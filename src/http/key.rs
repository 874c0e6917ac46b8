//! How a request's key is found.

use std::net::IpAddr;

use ::http::{HeaderName, Request};

use super::client_ip::{TrustedProxies, canonical};

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
        request
            .extensions()
            .get::<T>()
            .map(self.peer)
            .map(canonical)
    }
}

/// The client's address: the peer's, or, when the peer is one of the
/// trusted proxies, the one the header they write gives
/// ([`TrustedProxies::client_ip`]).
///
/// ```
/// use std::net::SocketAddr;
/// use paceline::http::{ClientIp, ClientIpSource, PeerIp, TrustedProxies};
///
/// // Behind load balancers at 10.0.0.0/8 that append to X-Forwarded-For.
/// let key = ClientIp {
///     peer: PeerIp::from_extension(|peer: &SocketAddr| peer.ip()),
///     proxies: TrustedProxies::new(ClientIpSource::XForwardedFor, ["10.0.0.0/8"])?,
/// };
/// # let _ = key;
/// # Ok::<(), paceline::Error>(())
/// ```
#[derive(Debug)]
pub struct ClientIp<T> {
    /// Where the peer's address is.
    pub peer: PeerIp<T>,
    /// Whose forwarding header is believed, and which header that is.
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
        let peer = request.extensions().get::<T>().map(self.peer.peer)?;
        Some(self.proxies.client_ip(peer, request.headers()))
    }
}
