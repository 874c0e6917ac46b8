//! Which client a request comes from: the proxies whose forwarding headers
//! are believed, and the read of those headers.

use std::net::{IpAddr, SocketAddr};

use ::http::HeaderMap;

use crate::Error;

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
pub(super) fn canonical(ip: IpAddr) -> IpAddr {
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
}
