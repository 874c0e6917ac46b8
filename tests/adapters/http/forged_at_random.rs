//! Forwarding headers, networks and header keys drawn at random: whatever a
//! client writes before its first proxy's entry, the client read is the
//! address that proxy appended; a network contains what its prefix says;
//! distinct header values are distinct keys of bounded length.
//!
//! Seeded: a failure prints its seed and the input, which replay it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ::http::{HeaderMap, HeaderValue, Request};
use paceline::http::{ClientIpSource, Header, KeyExtractor, TrustedProxies};

use crate::support::rng::Rng;

/// Trusted networks, as configured, with their address and prefix.
const NETWORKS: [(&str, &str, u8); 6] = [
    ("10.0.0.0/8", "10.0.0.0", 8),
    ("192.0.2.128/25", "192.0.2.128", 25),
    ("fd00::/8", "fd00::", 8),
    ("2001:db8:aa::/48", "2001:db8:aa::", 48),
    ("127.0.0.1", "127.0.0.1", 32),
    ("::ffff:198.51.100.0/120", "198.51.100.0", 24),
];

fn bits(ip: IpAddr) -> (u128, u8) {
    match ip {
        IpAddr::V4(v4) => (u32::from(v4).into(), 32),
        IpAddr::V6(v6) => (u128::from(v6), 128),
    }
}

fn of_bits(bits: u128, width: u8) -> IpAddr {
    match width {
        32 => IpAddr::V4(Ipv4Addr::from(bits as u32)),
        _ => IpAddr::V6(Ipv6Addr::from(bits)),
    }
}

/// An IPv4 address mapped into IPv6 is that IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Whether `ip` is in the network `net`/`prefix`.
fn within(ip: IpAddr, net: IpAddr, prefix: u8) -> bool {
    let ((ip, width), (net, net_width)) = (bits(canonical(ip)), bits(net));
    let shift = u32::from(width - prefix.min(width));
    width == net_width && ip.checked_shr(shift) == net.checked_shr(shift)
}

/// A random address in `net`/`prefix`.
fn inside(rng: &mut Rng, net: IpAddr, prefix: u8) -> IpAddr {
    let (net, width) = bits(net);
    let host = u128::from(rng.next_u64()) << 64 | u128::from(rng.next_u64());
    let mask = u128::MAX.checked_shr(u32::from(prefix)).unwrap_or(0) >> (128 - u32::from(width));
    of_bits(net & !mask | host & mask, width)
}

fn any_ip(rng: &mut Rng) -> IpAddr {
    let bits = u128::from(rng.next_u64()) << 64 | u128::from(rng.next_u64());
    match rng.below(3) {
        0 => of_bits(bits, 128),
        _ => of_bits(bits, 32),
    }
}

/// `ip` as an entry of `X-Forwarded-For`, as proxies write it.
fn xff_entry(rng: &mut Rng, ip: IpAddr) -> String {
    let port = rng.below(65_536);
    match (ip, rng.below(4)) {
        (IpAddr::V4(v4), 0) => format!("{v4}:{port}"),
        (IpAddr::V4(v4), 1) => format!("{}", v4.to_ipv6_mapped()),
        (IpAddr::V6(v6), 0) => format!("[{v6}]:{port}"),
        (IpAddr::V6(v6), 1) => format!("[{v6}]"),
        (ip, _) => ip.to_string(),
    }
}

/// `ip` as a `Forwarded` element, as proxies write it (other pairs in any
/// order, quoted where they must be).
fn forwarded_entry(rng: &mut Rng, ip: IpAddr, by: IpAddr) -> String {
    let port = rng.below(65_536);
    let node = match (ip, rng.below(4)) {
        (IpAddr::V4(v4), 0) => v4.to_string(),
        (IpAddr::V4(v4), 1) => format!("\"{v4}:{port}\""),
        (IpAddr::V4(v4), 2) => format!("\"{v4}:_p{port}\""),
        (IpAddr::V6(v6), 0) => format!("\"[{v6}]:{port}\""),
        (IpAddr::V6(v6), 1) => format!("\"[{v6}]:_hidden-{port}\""),
        (IpAddr::V6(v6), _) => format!("\"[{v6}]\""),
        (ip, _) => format!("\"{ip}\""),
    };
    let by = match by {
        IpAddr::V6(v6) => format!("\"[{v6}]\""),
        v4 => v4.to_string(),
    };
    let name = *rng.pick(&["for", "For", "FOR"]);
    let mut pairs = vec![format!("{name}={node}")];
    for pair in [
        format!("by={by}"),
        "proto=https".to_owned(),
        "host=\"a.example, b;c=\\\"d\\\"\"".to_owned(),
    ] {
        if rng.chance(0.5) {
            pairs.insert(rng.below(pairs.len() as u64 + 1) as usize, pair);
        }
    }
    pairs.join(if rng.chance(0.8) { ";" } else { " ; " })
}

/// Bytes a client may write in a header line: pieces of addresses and of
/// the syntax around them, and any byte a header value may hold.
fn forged_line(rng: &mut Rng) -> Vec<u8> {
    const PIECES: [&str; 24] = [
        ",",
        ";",
        "\"",
        "\\",
        " ",
        "\t",
        "=",
        "for=",
        "For=",
        "[",
        "]",
        ":",
        "%eth0",
        "_hidden",
        "unknown",
        "10.0.0.1",
        "127.0.0.1",
        "fd00::1",
        "::ffff:10.1.2.3",
        "6.6.6.6",
        "2001:db8::6",
        "by=",
        "proto=http",
        "\"[fd00::9]:80\"",
    ];
    let mut line = Vec::new();
    for _ in 0..rng.below(24) {
        match rng.below(6) {
            0 => {
                // Any byte a header value may hold.
                let byte = rng.below(256) as u8;
                if byte == b'\t' || (b' '..=b'~').contains(&byte) || byte >= 0x80 {
                    line.push(byte);
                }
            }
            1 => line.extend_from_slice(any_ip(rng).to_string().as_bytes()),
            _ => line.extend_from_slice(rng.pick(&PIECES).as_bytes()),
        }
    }
    line
}

#[test]
fn a_forged_prefix_never_chooses_the_client() {
    for seed in 0..3000u64 {
        let seed = 0xF0_0000 + seed;
        let mut rng = Rng::new(seed);
        let one = &NETWORKS[rng.below(NETWORKS.len() as u64) as usize];
        let nets: Vec<_> = NETWORKS
            .iter()
            .filter(|_| rng.chance(0.5))
            .chain([one])
            .map(|(text, net, prefix)| (*text, net.parse::<IpAddr>().unwrap(), *prefix))
            .collect();
        let forwarded = rng.chance(0.5);
        let source = match forwarded {
            true => ClientIpSource::Forwarded,
            false => ClientIpSource::XForwardedFor,
        };
        let proxies = TrustedProxies::new(source, nets.iter().map(|(text, ..)| *text)).unwrap();
        let trusted = |ip: IpAddr| nets.iter().any(|&(_, net, prefix)| within(ip, net, prefix));
        let client = loop {
            let ip = any_ip(&mut rng);
            if !trusted(ip) {
                break ip;
            }
        };
        let hops: Vec<IpAddr> = (0..rng.range(1, 4))
            .map(|_| {
                let &(_, net, prefix) = rng.pick(&nets);
                inside(&mut rng, net, prefix)
            })
            .collect();
        // What the client sent, then each proxy's entry for the one before
        // it: appended to the last line, or on a line of its own.
        let mut lines: Vec<Vec<u8>> = (0..rng.below(3)).map(|_| forged_line(&mut rng)).collect();
        let mut before = client;
        for &hop in &hops {
            let entry = match forwarded {
                true => forwarded_entry(&mut rng, before, hop),
                false => xff_entry(&mut rng, before),
            };
            match lines.last_mut() {
                Some(line) if rng.chance(0.7) => {
                    line.extend_from_slice(rng.pick(&[", ", ",", " , ", ",\t"]).as_bytes());
                    line.extend_from_slice(entry.as_bytes());
                }
                _ => lines.push(entry.into_bytes()),
            }
            before = hop;
        }
        let name = if forwarded {
            "forwarded"
        } else {
            "x-forwarded-for"
        };
        let mut headers = HeaderMap::new();
        for line in &lines {
            headers.append(name, HeaderValue::from_bytes(line).unwrap());
        }
        let peer = match (before, rng.chance(0.3)) {
            (IpAddr::V4(v4), true) => IpAddr::V6(v4.to_ipv6_mapped()),
            (peer, _) => peer,
        };
        let got = proxies.client_ip(peer, &headers);
        assert_eq!(
            got,
            canonical(client),
            "seed {seed:#x}: trusting {:?}, from {peer}: {headers:?}",
            nets.iter().map(|(text, ..)| text).collect::<Vec<_>>()
        );
    }
}

/// A network parses as an address and a prefix do, and contains the
/// addresses its prefix says; anything else is refused, and no source
/// name or header value panics.
#[test]
fn networks_and_sources_parse_as_they_say() {
    let forwarded_to = "203.0.113.9".parse::<IpAddr>().unwrap();
    let mut headers = HeaderMap::new();
    headers.insert("x-forwarded-for", HeaderValue::from_static("203.0.113.9"));
    for seed in 0..3000u64 {
        let seed = 0x0E7_0000 + seed;
        let mut rng = Rng::new(seed);
        let addr = any_ip(&mut rng);
        let mapped = match addr {
            IpAddr::V4(v4) if rng.chance(0.3) => IpAddr::V6(v4.to_ipv6_mapped()),
            _ => addr,
        };
        let prefix = rng.below(140) as u8;
        let text = match rng.below(8) {
            0 => mapped.to_string(),
            1 => format!("{mapped}/{prefix}/"),
            2 => format!(" {mapped}/{prefix} "),
            3 => format!("[{mapped}]/{prefix}"),
            4 => format!("{mapped}/+{prefix}"),
            5 => String::from_utf8_lossy(&forged_line(&mut rng)).into_owned(),
            _ => format!("{mapped}/{prefix}"),
        };
        let parsed = TrustedProxies::new(ClientIpSource::XForwardedFor, [&text]);
        // What the text says, if it is a network: IPv4 mapped into IPv6
        // is its IPv4 network, with a prefix of 96 or more.
        let said = text.trim().split_once('/').map_or_else(
            || Some((text.trim().parse::<IpAddr>().ok()?, None)),
            |(addr, prefix)| {
                Some((
                    addr.parse::<IpAddr>().ok()?,
                    Some(prefix.parse::<u8>().ok()?),
                ))
            },
        );
        let said = said.and_then(|(addr, prefix)| {
            let (_, width) = bits(addr);
            let prefix = prefix.unwrap_or(width);
            match canonical(addr) {
                _ if prefix > width => None,
                IpAddr::V4(v4) if addr.is_ipv6() => {
                    (prefix >= 96).then(|| (IpAddr::V4(v4), prefix - 96))
                }
                _ => Some((addr, prefix)),
            }
        });
        let proxies = match (parsed, said) {
            (Ok(proxies), Some(said)) => (proxies, said),
            (Err(paceline::Error::InvalidArgument(_)), None) => continue,
            (parsed, said) => panic!("seed {seed:#x}: {text:?}: {parsed:?}, said {said:?}"),
        };
        let (proxies, (net, prefix)) = proxies;
        for _ in 0..8 {
            let peer = match rng.below(3) {
                0 => inside(&mut rng, net, prefix),
                1 => any_ip(&mut rng),
                _ => inside(&mut rng, net, prefix.saturating_sub(1)),
            };
            let expected = if within(peer, net, prefix) {
                forwarded_to
            } else {
                canonical(peer)
            };
            let got = proxies.client_ip(peer, &headers);
            assert_eq!(got, expected, "seed {seed:#x}: {text:?} from {peer}");
        }
        // Any text is a source or refused; any value is read or not.
        let name = String::from_utf8_lossy(&forged_line(&mut rng)).into_owned();
        match name.parse::<ClientIpSource>() {
            Ok(_) | Err(paceline::Error::InvalidArgument(_)) => {}
            Err(other) => panic!("seed {seed:#x}: {name:?}: {other:?}"),
        }
    }
}

/// Distinct values up to 256 bytes are distinct keys; a key is at most
/// about a kilobyte, whatever the value.
#[test]
fn header_keys_of_random_bytes_are_distinct_and_bounded() {
    let key = Header(::http::header::AUTHORIZATION);
    let of = |value: &[u8]| {
        let request = Request::builder()
            .header("authorization", HeaderValue::from_bytes(value).unwrap())
            .body(())
            .unwrap();
        key.key(&request).unwrap()
    };
    let mut rng = Rng::new(0x4EAD);
    let mut seen = std::collections::HashMap::new();
    for _ in 0..5_000 {
        // Short values over few bytes (which collide often), long ones over
        // any.
        let len = match rng.below(4) {
            0 => rng.range(250, 4_000),
            _ => rng.below(6),
        };
        let value: Vec<u8> = (0..len)
            .map(|_| *rng.pick(b"\\x#-0aF\t \xc3\xa9\xff\x80"))
            .collect();
        let key = of(&value);
        assert!(key.len() <= 1_100, "{value:?}: {} bytes", key.len());
        if let Some(other) = seen.insert(key.clone(), value.clone())
            && other != value
            && value.len().max(other.len()) <= 256
        {
            panic!("{value:?} and {other:?} share the key {key:?}");
        }
    }
}
