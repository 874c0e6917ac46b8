//! Which client a request comes from: the header your proxies write
//! ([`ClientIpSource`]), the proxies whose word is taken
//! ([`TrustedProxies`]), and the read of that header from the right.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use ::http::HeaderMap;
use ::http::header::{FORWARDED, HeaderName};

use crate::Error;

/// Where the client's address is read from: the connection's peer, or the
/// one header that your own proxies write; every other forwarding header
/// is ignored, whatever it says (see [the module's
/// docs](super#the-client-behind-proxies) for why, and
/// [`TrustedProxies::client_ip`] for how each is read).
///
/// It parses from a header's name, as a configuration file would give it
/// (any case): `peer`, `x-forwarded-for` and `forwarded` are those
/// variants, any other name a [`SingleHeader`](Self::SingleHeader).
///
/// ```
/// use http::HeaderName;
/// use paceline::http::ClientIpSource;
///
/// let xff: ClientIpSource = "X-Forwarded-For".parse()?;
/// assert_eq!(xff, ClientIpSource::XForwardedFor);
/// let cloudflare: ClientIpSource = "CF-Connecting-IP".parse()?;
/// let name = HeaderName::from_static("cf-connecting-ip");
/// assert_eq!(cloudflare, ClientIpSource::SingleHeader(name));
/// assert_eq!(ClientIpSource::default(), ClientIpSource::Peer);
/// # Ok::<(), paceline::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientIpSource {
    /// No header: the client is the connection's peer, even when the peer
    /// is a trusted proxy. The default.
    #[default]
    Peer,
    /// `X-Forwarded-For`: the addresses each proxy appends, read from the
    /// right past the trusted proxies.
    XForwardedFor,
    /// `Forwarded` (RFC 7239): the `for=` of each element, read from the
    /// right past the trusted proxies. Only where your proxy is set up to
    /// write it: most pass a client's `Forwarded` on untouched.
    Forwarded,
    /// A header that holds one address and that your proxy sets, replacing
    /// any value a client sent: `X-Real-IP`, `CF-Connecting-IP`,
    /// `True-Client-IP`, `Fly-Client-IP`, `Fastly-Client-IP`. Believed
    /// when the peer is a trusted proxy.
    SingleHeader(HeaderName),
}

impl FromStr for ClientIpSource {
    type Err = Error;

    fn from_str(text: &str) -> Result<ClientIpSource, Error> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("peer") {
            return Ok(ClientIpSource::Peer);
        }
        let name = HeaderName::from_bytes(text.as_bytes()).map_err(|_| {
            Error::InvalidArgument(format!(
                "a client address source is `peer` or a header's name (got {text:?})"
            ))
        })?;
        Ok(if name == X_FORWARDED_FOR {
            ClientIpSource::XForwardedFor
        } else if name == FORWARDED {
            ClientIpSource::Forwarded
        } else {
            ClientIpSource::SingleHeader(name)
        })
    }
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// At most this many entries of a list header are read, from the right (a
/// walk past this many trusted proxies stops at the last of them): more than
/// any deployment's own proxies in a row, so a longer list costs no more.
const MAX_HOPS: usize = 64;

/// An entry longer than this many bytes (a `Forwarded` element with its
/// `by=`, `proto=` and `host=` included) is not an address, and is not
/// read to its end.
const MAX_ENTRY: usize = 512;

/// The proxies whose forwarding header is believed (addresses and
/// networks: `10.0.0.0/8`, `fd00::/8`, `127.0.0.1`), and which header
/// that is ([`ClientIpSource`]). With none (`TrustedProxies::default()`
/// trusts none), or with the source [`ClientIpSource::Peer`], every
/// request's client is its peer.
///
/// Name your proxies only: an address inside these networks is taken at
/// its word like a proxy, so a client inside them can name any address
/// it likes as the one it forwards for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies {
    nets: Vec<Net>,
    source: ClientIpSource,
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
        // A peer or entry mapped from IPv4 is read as IPv4 (`canonical`),
        // so a mapped network is its IPv4 network, or it would never match.
        if let IpAddr::V6(v6) = addr
            && let Some(v4) = v6.to_ipv4_mapped()
        {
            if prefix < 96 {
                return Err(Error::InvalidArgument(format!(
                    "a trusted network written as IPv4 mapped into IPv6 needs a prefix of \
                     96 or more; write it as the IPv4 network (got {text:?})"
                )));
            }
            return Ok(Net {
                addr: IpAddr::V4(v4),
                prefix: prefix - 96,
            });
        }
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
pub(super) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

impl TrustedProxies {
    /// Trusts the proxies at these addresses or networks to write the
    /// client's address in `source`, the header they overwrite or append
    /// to.
    ///
    /// ```
    /// use paceline::http::{ClientIpSource, TrustedProxies};
    ///
    /// // nginx at 10.0.0.5 with
    /// // `proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;`
    /// let proxies = TrustedProxies::new(ClientIpSource::XForwardedFor, ["10.0.0.5"])?;
    /// // Cloudflare in front (its published ranges, abridged here).
    /// let cloudflare = TrustedProxies::new(
    ///     "CF-Connecting-IP".parse()?,
    ///     ["173.245.48.0/20", "2400:cb00::/32"],
    /// )?;
    /// # let _ = (proxies, cloudflare);
    /// # Ok::<(), paceline::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an entry that is neither an IP
    /// address nor a network in CIDR form.
    pub fn new<I, S>(source: ClientIpSource, proxies: I) -> Result<TrustedProxies, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let nets = proxies
            .into_iter()
            .map(|text| Net::parse(text.as_ref()))
            .collect::<Result<_, _>>()?;
        Ok(TrustedProxies { nets, source })
    }

    /// Whether `ip` is one of the trusted proxies.
    fn contains(&self, ip: IpAddr) -> bool {
        self.nets.iter().any(|net| net.contains(ip))
    }

    /// The client of a request that came from `peer` with `headers`.
    ///
    /// If the peer is not a trusted proxy, or the source is
    /// [`ClientIpSource::Peer`], the peer is the client, whatever the
    /// headers say. Otherwise only the source's header is read:
    ///
    /// * A list (`X-Forwarded-For`, `Forwarded`; several lines of it joined
    ///   in order; a `,` or `;` inside a `Forwarded` quoted string parts
    ///   nothing, as RFC 7239 says) is read from the right. The rightmost entry is the one
    ///   the peer wrote; each entry that is a trusted proxy passes the read
    ///   on to the entry to its left, and the first that is not is the
    ///   client. Whatever a client wrote to the left of the address its
    ///   first proxy appended is never read. An entry that is not an
    ///   address (`unknown`, an obfuscated `Forwarded` name, bytes that are
    ///   not text, anything that does not parse, or over 512 bytes) stops
    ///   the read, and the client is the trusted hop that wrote it: it
    ///   cannot be told from a client's forgery, so the key falls back to
    ///   the proxy rather than to anything it says. If every entry read is
    ///   a trusted proxy, the client is the leftmost; at most 64 entries
    ///   are read, however long the list. An address with a port is that
    ///   address, in `Forwarded` also with an obfuscated port
    ///   (`for="192.0.2.43:_hidden"`).
    /// * A header that holds one address is the client if it is exactly
    ///   one line holding one address (a port, or brackets around an IPv6
    ///   address, allowed); otherwise (absent, repeated, a list, garbage)
    ///   the client is the peer.
    ///
    /// An IPv4 address mapped into IPv6 (`::ffff:192.0.2.1`) is read as
    /// the IPv4 address, for the peer and in the headers alike. (An
    /// example: [the module's](super#the-client-behind-proxies).)
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let peer = canonical(peer);
        if !self.contains(peer) {
            return peer;
        }
        // A list: its name, and how an entry gives its address.
        let (list, read, quoted): (_, ReadEntry, _) = match &self.source {
            ClientIpSource::Peer => return peer,
            ClientIpSource::XForwardedFor => (&X_FORWARDED_FOR, list_address, false),
            ClientIpSource::Forwarded => (&FORWARDED, forwarded_for, true),
            ClientIpSource::SingleHeader(name) => {
                return one_address(headers, name).unwrap_or(peer);
            }
        };
        let mut client = peer;
        for entry in from_the_right(headers, list, quoted).take(MAX_HOPS) {
            let Some(ip) = entry.and_then(read) else {
                return client;
            };
            client = canonical(ip);
            if !self.contains(client) {
                return client;
            }
        }
        client
    }
}

/// How an entry of a list header gives its address.
type ReadEntry = fn(&[u8]) -> Option<IpAddr>;

/// The entries of a list header, rightmost first: its lines from the
/// last, each split at its commas from the right (with `quoted`, as
/// `Forwarded` writes them, not at a comma inside a quoted string). `None`
/// for an entry longer than [`MAX_ENTRY`], which is not read past that.
fn from_the_right<'a>(
    headers: &'a HeaderMap,
    name: &HeaderName,
    quoted: bool,
) -> impl Iterator<Item = Option<&'a [u8]>> + 'a {
    headers
        .get_all(name)
        .into_iter()
        .rev()
        .flat_map(move |line| {
            let mut rest = Some(line.as_bytes());
            std::iter::from_fn(move || {
                let bytes = rest?;
                let Some(comma) = last_comma(bytes, quoted) else {
                    rest = None;
                    return Some((bytes.len() <= MAX_ENTRY).then_some(bytes));
                };
                rest = Some(&bytes[..comma]);
                Some(Some(&bytes[comma + 1..]))
            })
        })
}

/// Where the last comma of `bytes` that parts entries is, looked for in
/// their last `MAX_ENTRY + 1` bytes only. With `quoted`, a comma inside a
/// quoted string parts nothing: read from the right, a `"` that no odd run
/// of `\` escapes opens or closes one. The entries read this way are the
/// proxies' own, well formed; whatever a client wrote to their left is
/// read only as far as the first entry that is no trusted proxy's.
fn last_comma(bytes: &[u8], quoted: bool) -> Option<usize> {
    let window = bytes.len().saturating_sub(MAX_ENTRY + 1);
    let mut inside = false;
    for at in (window..bytes.len()).rev() {
        match bytes[at] {
            b',' if !inside => return Some(at),
            b'"' if quoted => {
                let escapes = bytes[window..at].iter().rev().take_while(|b| **b == b'\\');
                if escapes.count() % 2 == 0 {
                    inside = !inside;
                }
            }
            _ => {}
        }
    }
    None
}

/// An `X-Forwarded-For` entry, or a single-address header's value: an
/// address between optional spaces.
fn list_address(entry: &[u8]) -> Option<IpAddr> {
    address(std::str::from_utf8(entry).ok()?.trim_matches([' ', '\t']))
}

/// The address in a `Forwarded` element's `for=` (RFC 7239: `pair;pair`,
/// the value a token or a quoted string, which may hold `;`, `,` and `=`):
/// `None` for an element with no `for=`, or with two, or a quoted string
/// left open, or whose node is not an address (`unknown`, an obfuscated
/// `_name`).
fn forwarded_for(element: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(element).ok()?;
    let mut node = None;
    // Pairs part at a `;` outside quoted strings (`\` escapes inside).
    let (mut start, mut inside, mut escaped) = (0, false, false);
    for (at, byte) in text.bytes().enumerate() {
        match byte {
            _ if escaped => escaped = false,
            b'\\' if inside => escaped = true,
            b'"' => inside = !inside,
            b';' if !inside => {
                for_node(&text[start..at], &mut node)?;
                start = at + 1;
            }
            _ => {}
        }
    }
    if inside {
        return None;
    }
    for_node(&text[start..], &mut node)?;
    let node = node?.trim_matches([' ', '\t']);
    let node = match node.strip_prefix('"') {
        Some(quoted) => quoted.strip_suffix('"')?,
        None => node,
    };
    address(node).or_else(|| obfuscated_port(node))
}

/// The address of a `Forwarded` node whose port is obfuscated (RFC 7239:
/// `_` and then letters, digits, `.`, `_` or `-`): `192.0.2.43:_hidden`,
/// `[2001:db8::1]:_p1`. The port is hidden, not the address, which is the
/// client.
fn obfuscated_port(node: &str) -> Option<IpAddr> {
    let (host, port) = node.rsplit_once(':')?;
    let port = port.strip_prefix('_')?;
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b"._-".contains(&b);
    if port.is_empty() || !port.bytes().all(allowed) {
        return None;
    }
    let host = host
        .strip_prefix('[')
        .map_or(Some(host), |v6| v6.strip_suffix(']'))?;
    host.parse().ok()
}

/// Takes the value of `pair` into `node` if it is a `for=`: `None` if
/// `node` already holds one (two `for=` in one element).
fn for_node<'a>(pair: &'a str, node: &mut Option<&'a str>) -> Option<()> {
    match pair.split_once('=') {
        Some((name, value)) if name.trim_matches([' ', '\t']).eq_ignore_ascii_case("for") => {
            node.replace(value).is_none().then_some(())
        }
        _ => Some(()),
    }
}

/// The value of a header that holds one address: exactly one line, one
/// address.
fn one_address(headers: &HeaderMap, name: &HeaderName) -> Option<IpAddr> {
    let mut lines = headers.get_all(name).into_iter();
    let line = lines.next()?;
    if lines.next().is_some() || line.len() > MAX_ENTRY {
        return None;
    }
    list_address(line.as_bytes()).map(canonical)
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
