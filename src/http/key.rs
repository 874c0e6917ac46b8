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
/// without it share one key, the empty string. A header sent on several
/// lines is keyed by its first: if your application reads another line
/// (to authenticate, say), key by what it read, with a
/// [`KeyExtractor`] of your own, or refuse such requests before this
/// layer.
///
/// The key is the value's bytes, one for one: UTF-8 as it is but for `\`,
/// written `\\`; each byte that is not part of valid UTF-8 as `\xNN`. So
/// distinct values are distinct keys, whatever bytes they hold (as the
/// command line's keys are).
///
/// A value over 256 bytes is keyed by its first 256 bytes so written, then
/// `\#`, its length, `-` and a 64-bit digest of the whole value (FNV-1a,
/// the same in every process and every build, so that processes sharing a
/// limiter through Redis key it alike), in hex: a key is at most about a
/// kilobyte whatever a client sends, so that
/// [`max_keys`](crate::Builder::max_keys) bounds the keys' memory, not only
/// their count (a client sending a new 100 kB value with each request
/// would otherwise hold 100 kB or more a key). No short value's key reads
/// the same (read from the left, its only escapes are `\\` and `\xNN`).
/// Two long values share a key only if their first 256 bytes, their
/// lengths and their digests agree: a client can find values of its own
/// that do, which pools only its own requests, but cannot reach the key of
/// a value it does not know.
///
/// The key holds the value as sent: keyed by a secret (an `Authorization`
/// header, an API key), a limiter through Redis writes it into a Redis key
/// name, which `KEYS`, `MONITOR` and the server's logs show. Where that
/// matters, key by what the secret stands for (an account's id, read by a
/// [`KeyExtractor`] of your own after authentication) or by a digest of it.
///
/// ```
/// use paceline::http::{Header, KeyExtractor};
///
/// let key = Header(http::header::AUTHORIZATION);
/// let of = |value: &[u8]| {
///     let request = http::Request::builder().header("authorization", value).body(());
///     key.key(&request.unwrap()).unwrap()
/// };
/// assert_eq!(of(b"key\xff"), "key\\xff");
/// // Distinct bytes, distinct keys: the text that reads as an escape too.
/// assert_ne!(of(b"key\xff"), of(b"key\xfe"));
/// assert_ne!(of(b"key\xff"), of(br"key\xff"));
/// assert_eq!(of(br"key\xff"), r"key\\xff");
/// assert_eq!(of("café".as_bytes()), "café");
/// ```
#[derive(Debug, Clone)]
pub struct Header(pub HeaderName);

impl<B> KeyExtractor<B> for Header {
    type Key = String;

    fn key(&self, request: &Request<B>) -> Option<String> {
        use std::fmt::Write;
        let value = request.headers().get(&self.0);
        let bytes = value.map_or(&[][..], |v| v.as_bytes());
        let kept = &bytes[..bytes.len().min(KEPT_BYTES)];
        let mut key = String::with_capacity(kept.len() + 24);
        for chunk in kept.utf8_chunks() {
            key.push_str(&chunk.valid().replace('\\', "\\\\"));
            for byte in chunk.invalid() {
                let _ = write!(key, "\\x{byte:02x}");
            }
        }
        if bytes.len() > KEPT_BYTES {
            let _ = write!(key, "\\#{}-{:016x}", bytes.len(), digest(bytes));
        }
        Some(key)
    }
}

/// The most bytes of a header value that a [`Header`] key holds as they
/// are; a longer value's key ends in a digest of the whole.
const KEPT_BYTES: usize = 256;

/// FNV-1a, 64 bits, of `bytes`: a [`Header`] key's digest of a long value.
fn digest(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
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
    ipv6_prefix: u8,
}

impl<T> PeerIp<T> {
    /// Reads the peer's address from the extension of type `T`. An IPv4
    /// client is keyed by its address (also one mapped into IPv6,
    /// `::ffff:192.0.2.1`, or translated into it by a NAT64 or SIIT gateway
    /// at the well-known prefix, `64:ff9b::192.0.2.1`, or by its whole
    /// translated address under the local-use prefix `64:ff9b:1::/48`, or
    /// tunnelling IPv6
    /// through 6to4, `2002:c000:201::/48`, or Teredo, `2001:0::/32` with
    /// the client's address in its last 32 bits); an IPv6 client by
    /// the first 64 bits of its address (see
    /// [`ipv6_prefix`](Self::ipv6_prefix)).
    pub fn from_extension(peer: fn(&T) -> IpAddr) -> Self {
        PeerIp {
            peer,
            ipv6_prefix: 64,
        }
    }

    /// How many leading bits of an IPv6 client's address are its key:
    /// default 64. One IPv6 site (a home, a server) is given a /64 or more,
    /// and picks any address in it, so keying each address lets one client
    /// take a new key, and a full burst, with every request. 128 keys each
    /// address; 56 or 48 key a whole site, for providers that hand those
    /// out. Above 128 counts as 128. The same applies through
    /// [`ClientIp`], to the client read past the proxies.
    ///
    /// ```
    /// use std::net::{IpAddr, SocketAddr};
    /// use paceline::http::{KeyExtractor, PeerIp};
    ///
    /// let key = PeerIp::from_extension(|peer: &SocketAddr| peer.ip());
    /// let from = |peer: &str| {
    ///     let mut request = http::Request::new(());
    ///     request.extensions_mut().insert(peer.parse::<SocketAddr>().unwrap());
    ///     key.key(&request)
    /// };
    /// // Two addresses of one /64: one key.
    /// assert_eq!(from("[2001:db8:1:2::a]:443"), from("[2001:db8:1:2:ffff::9]:80"));
    /// assert_eq!(from("[2001:db8:1:2::a]:443"), Some("2001:db8:1:2::".parse::<IpAddr>()?));
    /// assert_ne!(from("[2001:db8:1:2::a]:443"), from("[2001:db8:1:3::a]:443"));
    /// # Ok::<(), std::net::AddrParseError>(())
    /// ```
    #[must_use]
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits.min(128);
        self
    }

    /// The key of a client at `ip`: IPv4 (or mapped IPv4, IPv4 translated
    /// into `64:ff9b::/96`, or an IPv4 client's 6to4 or Teredo address)
    /// whole, IPv6 cut to its prefix.
    fn key_of(&self, ip: IpAddr) -> IpAddr {
        match canonical(ip) {
            IpAddr::V6(v6) => match ipv4_client(u128::from(v6)) {
                Some(v4) => IpAddr::V4(v4.into()),
                None => {
                    // (Under the local-use translation prefix, whole: see
                    // `LOCAL_TRANSLATION`.)
                    let local = u128::from(v6) >> 80 == LOCAL_TRANSLATION;
                    let kept = if local {
                        0
                    } else {
                        u32::from(128 - self.ipv6_prefix)
                    };
                    let mask = u128::MAX.checked_shl(kept).unwrap_or(0);
                    IpAddr::V6((u128::from(v6) & mask).into())
                }
            },
            v4 => v4,
        }
    }
}

/// RFC 8215's local-use prefix for translated IPv4 clients, `64:ff9b:1::/48`
/// (its first 48 bits): a network's own translator puts the IPv4 address
/// where its chosen address format says (the last 32 bits of a /96, or
/// split around bits 64 to 71 for a shorter prefix), so a client there is
/// keyed by its whole address; cut to 64 bits, every IPv4 client behind a
/// /96 translator would share one key.
const LOCAL_TRANSLATION: u128 = 0x64_ff9b_0001;

/// The IPv4 client behind an IPv6 address that holds it (as bits), if
/// one does: RFC 6052's well-known prefix `64:ff9b::/96` (an IPv4 client
/// reaching an IPv6 server through a translator), in the last 32 bits;
/// 6to4's `2002::/16` (RFC 3056: each IPv4 address's own /48, 65 536
/// /64s), in the 32 bits after the prefix; Teredo's `2001:0::/32` (RFC
/// 4380: the first 64 bits are the Teredo server's, shared by its
/// clients), inverted in the last 32 bits.
fn ipv4_client(bits: u128) -> Option<u32> {
    if bits >> 32 == 0x64_ff9b << 64 {
        Some(bits as u32)
    } else if bits >> 112 == 0x2002 {
        Some((bits >> 80) as u32)
    } else if bits >> 96 == 0x2001_0000 {
        Some(!(bits as u32))
    } else {
        None
    }
}

impl<T> Clone for PeerIp<T> {
    fn clone(&self) -> Self {
        PeerIp {
            peer: self.peer,
            ipv6_prefix: self.ipv6_prefix,
        }
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
            .map(|ip| self.key_of(ip))
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
        let client = self.proxies.client_ip(peer, request.headers());
        Some(self.peer.key_of(client))
    }
}
