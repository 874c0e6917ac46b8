//! The client's address from the one source the proxies write, read from
//! the right past trusted proxies only.

use std::net::IpAddr;

use ::http::header::HeaderName;
use ::http::{HeaderMap, HeaderValue};
use paceline::Error;
use paceline::http::{ClientIpSource, TrustedProxies};

// The documented bounds (`TrustedProxies::client_ip`): entries of a list
// read, bytes of an entry.
const MAX_HOPS: usize = 64;
const MAX_ENTRY: usize = 512;

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

const NETS: [&str; 3] = ["10.0.0.0/8", "192.168.1.1", "fd00::/8"];

fn reading(source: ClientIpSource) -> TrustedProxies {
    TrustedProxies::new(source, NETS).unwrap()
}

fn single(name: &'static str) -> ClientIpSource {
    ClientIpSource::SingleHeader(HeaderName::from_static(name))
}

/// Asserts that each `(value, client)` of `header` from the trusted peer
/// 10.0.0.5 reads as `client`.
fn reads(proxies: &TrustedProxies, header: &'static str, cases: &[(&str, &str)]) {
    for (value, client) in cases {
        let got = proxies.client_ip(ip("10.0.0.5"), &headers(&[(header, value)]));
        assert_eq!(got, ip(client), "{value:?}");
    }
}

/// Every forwarding header at once, each naming a different client.
fn all_forged() -> HeaderMap {
    headers(&[
        ("x-forwarded-for", "1.1.1.1"),
        ("forwarded", "for=2.2.2.2"),
        ("x-real-ip", "3.3.3.3"),
        ("cf-connecting-ip", "4.4.4.4"),
    ])
}

/// Whether `proxies` trusts `peer`: a trusted peer's `X-Forwarded-For` is
/// read, an untrusted one is the client itself.
fn trusts(proxies: &TrustedProxies, peer: &str) -> bool {
    let forwarded = headers(&[("x-forwarded-for", "203.0.113.9")]);
    proxies.client_ip(ip(peer), &forwarded) == ip("203.0.113.9")
}

#[test]
fn networks_parse_and_contain() {
    let proxies = reading(ClientIpSource::XForwardedFor);
    for inside in [
        "10.0.0.1",
        "10.255.255.255",
        "192.168.1.1",
        "fd12::1",
        "::ffff:10.1.2.3",
    ] {
        assert!(trusts(&proxies, inside), "{inside}");
    }
    for outside in ["11.0.0.1", "192.168.1.2", "fe00::1", "::1", "9.255.255.255"] {
        assert!(!trusts(&proxies, outside), "{outside}");
    }
    let all = TrustedProxies::new(ClientIpSource::XForwardedFor, ["0.0.0.0/0", "::/0"]).unwrap();
    assert!(trusts(&all, "1.2.3.4") && trusts(&all, "2001:db8::1"));
    for bad in [
        "10.0.0.0/33",
        "::/129",
        "10.0.0",
        "proxy.local",
        "10.0.0.0/x",
        "",
    ] {
        let error = TrustedProxies::new(ClientIpSource::XForwardedFor, [bad]).unwrap_err();
        assert!(matches!(error, Error::InvalidArgument(_)), "{bad}");
    }
}

#[test]
fn sources_parse_from_a_header_name() {
    for (text, source) in [
        ("peer", ClientIpSource::Peer),
        (" PEER ", ClientIpSource::Peer),
        ("X-Forwarded-For", ClientIpSource::XForwardedFor),
        ("forwarded", ClientIpSource::Forwarded),
        ("X-Real-IP", single("x-real-ip")),
        ("Fly-Client-IP", single("fly-client-ip")),
    ] {
        assert_eq!(text.parse::<ClientIpSource>().unwrap(), source, "{text}");
    }
    for bad in ["", "x forwarded", "x-forwarded-for:", "é"] {
        let error = bad.parse::<ClientIpSource>().unwrap_err();
        assert!(matches!(error, Error::InvalidArgument(_)), "{bad}");
    }
    // The default trusts none and reads the peer.
    let none: [&str; 0] = [];
    assert_eq!(
        TrustedProxies::default(),
        TrustedProxies::new(ClientIpSource::Peer, none).unwrap()
    );
}

#[test]
fn an_untrusted_peer_is_the_client_whatever_it_forges() {
    let peer = ip("198.51.100.7");
    for source in [
        ClientIpSource::XForwardedFor,
        ClientIpSource::Forwarded,
        single("x-real-ip"),
        single("cf-connecting-ip"),
    ] {
        assert_eq!(reading(source).client_ip(peer, &all_forged()), peer);
    }
    let none = TrustedProxies::default();
    assert_eq!(
        none.client_ip(ip("10.0.0.1"), &all_forged()),
        ip("10.0.0.1")
    );
}

#[test]
fn each_source_reads_its_own_header_and_no_other() {
    let peer = ip("10.0.0.5");
    for (source, client) in [
        // The peer, even from a trusted proxy.
        (ClientIpSource::Peer, "10.0.0.5"),
        (ClientIpSource::XForwardedFor, "1.1.1.1"),
        (ClientIpSource::Forwarded, "2.2.2.2"),
        (single("x-real-ip"), "3.3.3.3"),
        (single("cf-connecting-ip"), "4.4.4.4"),
        // A header that is not there: the peer.
        (single("fly-client-ip"), "10.0.0.5"),
    ] {
        let got = reading(source.clone()).client_ip(peer, &all_forged());
        assert_eq!(got, ip(client), "{source:?}");
    }
    // The spoof through a proxy that appends to X-Forwarded-For and
    // passes `Forwarded` on: a new `Forwarded` each time is not read.
    let proxies = reading(ClientIpSource::XForwardedFor);
    for i in 0..10 {
        let spoofed = headers(&[
            ("forwarded", &format!("for=9.9.9.{i}")),
            ("x-forwarded-for", "203.0.113.7"),
        ]);
        assert_eq!(proxies.client_ip(peer, &spoofed), ip("203.0.113.7"));
    }
    // No header: the peer.
    assert_eq!(proxies.client_ip(peer, &HeaderMap::new()), peer);
}

#[test]
fn a_list_is_read_from_the_right_past_trusted_proxies_only() {
    let proxies = reading(ClientIpSource::XForwardedFor);
    let peer = ip("10.0.0.5");
    reads(
        &proxies,
        "x-forwarded-for",
        &[
            // One proxy appended the client it saw.
            ("203.0.113.7", "203.0.113.7"),
            // The client forged entries to the left: ignored.
            ("6.6.6.6, 203.0.113.7", "203.0.113.7"),
            // It forged one of our proxies to the left: still ignored.
            ("10.9.9.9, 203.0.113.7", "203.0.113.7"),
            // Two proxies of ours: the client is before them.
            ("203.0.113.7, 10.0.0.9", "203.0.113.7"),
            ("6.6.6.6, 203.0.113.7, 192.168.1.1, 10.0.0.9", "203.0.113.7"),
            // Ports, tabs and spaces, and no spaces.
            ("203.0.113.7:5555", "203.0.113.7"),
            ("6.6.6.6,203.0.113.7", "203.0.113.7"),
            ("  [2001:db8::7]:443 \t", "2001:db8::7"),
            // Every entry one of ours: the leftmost.
            ("10.1.1.1, 10.0.0.9", "10.1.1.1"),
        ],
    );
    // Several lines: read in order, as one list, the last line last.
    let split = headers(&[
        ("x-forwarded-for", "6.6.6.6"),
        ("x-forwarded-for", "203.0.113.8, 10.0.0.9"),
    ]);
    assert_eq!(proxies.client_ip(peer, &split), ip("203.0.113.8"));
    let across = headers(&[
        ("x-forwarded-for", "6.6.6.6, 203.0.113.8"),
        ("x-forwarded-for", "10.0.0.9"),
    ]);
    assert_eq!(proxies.client_ip(peer, &across), ip("203.0.113.8"));
}

#[test]
fn an_entry_that_is_not_an_address_falls_back_to_the_hop_that_wrote_it() {
    let proxies = reading(ClientIpSource::XForwardedFor);
    let peer = ip("10.0.0.5");
    reads(
        &proxies,
        "x-forwarded-for",
        &[
            // Garbage where the client should be: the proxy that wrote it.
            ("6.6.6.6, garbage", "10.0.0.5"),
            ("203.0.113.7, unknown, 10.0.0.9", "10.0.0.9"),
            ("203.0.113.7, , 10.0.0.9", "10.0.0.9"),
            ("203.0.113.7,", "10.0.0.5"),
            ("", "10.0.0.5"),
            ("fe80::1%eth0", "10.0.0.5"),
            ("1.2.3.4.5", "10.0.0.5"),
            ("203.0.113.7:99999", "10.0.0.5"),
            // Garbage the client wrote to the left of its address: not read.
            ("garbage, \"\";, 203.0.113.7", "203.0.113.7"),
        ],
    );
    // Bytes that are not text: to the left of the client, not read;
    // where the client should be, the proxy that wrote them.
    let bytes = |value: &[u8]| {
        let mut headers = HeaderMap::new();
        headers.insert("x-forwarded-for", HeaderValue::from_bytes(value).unwrap());
        headers
    };
    let left = bytes(b"\xff\xfe, 203.0.113.7");
    assert_eq!(proxies.client_ip(peer, &left), ip("203.0.113.7"));
    let right = bytes(b"203.0.113.7, 10.0.0.9, 1\xff.2.3.4");
    assert_eq!(proxies.client_ip(peer, &right), peer);
    let line = bytes(b"\x80");
    assert_eq!(proxies.client_ip(peer, &line), peer);
}

#[test]
fn forwarded_elements_are_read_by_their_for() {
    let proxies = reading(ClientIpSource::Forwarded);
    reads(
        &proxies,
        "forwarded",
        &[
            (
                "for=6.6.6.6, for=\"[2001:db8:cafe::17]:4711\";proto=https;by=10.0.0.5",
                "2001:db8:cafe::17",
            ),
            ("For=203.0.113.7;Proto=http", "203.0.113.7"),
            (
                "proto=https; for = \"203.0.113.7:80\" ;by=_proxy",
                "203.0.113.7",
            ),
            ("for=203.0.113.7, for=192.168.1.1", "203.0.113.7"),
            // Obfuscated or unknown: the proxy that wrote it.
            ("for=_hidden, For=10.0.0.9", "10.0.0.9"),
            ("for=6.6.6.6, for=unknown", "10.0.0.5"),
            // No `for=`, two of them, an unclosed quote: the same.
            ("for=6.6.6.6, proto=https", "10.0.0.5"),
            ("for=6.6.6.6, for=7.7.7.7;for=8.8.8.8", "10.0.0.5"),
            ("for=6.6.6.6, for=\"203.0.113.7", "10.0.0.5"),
            // A client's unclosed quote to the left changes nothing.
            ("for=\"6.6.6.6, for=203.0.113.7", "203.0.113.7"),
        ],
    );
}

/// RFC 7239 lets a proxy hide the client's port (`node-port = port /
/// obfport`, `obfport = "_" 1*(ALPHA / DIGIT / "." / "_" / "-")`) and
/// keep its address: the address is the client. Before, each of these read
/// as the proxy, so that every client shared its key.
#[test]
fn an_obfuscated_port_keeps_the_address() {
    let proxies = reading(ClientIpSource::Forwarded);
    reads(
        &proxies,
        "forwarded",
        &[
            ("for=6.6.6.6, for=\"203.0.113.7:_hidden\"", "203.0.113.7"),
            (
                "for=\"[2001:db8:cafe::17]:_a.b-c_9\";proto=https",
                "2001:db8:cafe::17",
            ),
            (
                "for=\"203.0.113.7:_x\", for=\"10.0.0.9:_proxy\"",
                "203.0.113.7",
            ),
            // Not an obfuscated port, or not an address before it: the
            // proxy that wrote it, as before.
            ("for=6.6.6.6, for=\"203.0.113.7:_\"", "10.0.0.5"),
            ("for=6.6.6.6, for=\"203.0.113.7:_a:b\"", "10.0.0.5"),
            ("for=6.6.6.6, for=\"203.0.113.7:_a b\"", "10.0.0.5"),
            ("for=6.6.6.6, for=\"203.0.113.7:80:_x\"", "10.0.0.5"),
            ("for=6.6.6.6, for=\"_hidden:_x\"", "10.0.0.5"),
            ("for=6.6.6.6, for=\"0x7f.1:_x\"", "10.0.0.5"),
        ],
    );
}

/// RFC 7239: a value is a token or a quoted string, and a quoted string
/// may hold `,`, `;` and `=`, which then part neither elements nor pairs.
/// A proxy that writes, after its `for=`, a quoted value the client sent
/// (its `Host`, its path) does not let the client name an address: each
/// of these read 6.6.6.6, or the proxy, before.
#[test]
fn a_quoted_value_in_the_proxys_element_cannot_choose_the_client() {
    let proxies = reading(ClientIpSource::Forwarded);
    reads(
        &proxies,
        "forwarded",
        &[
            // The client's path, quoted by the proxy, last.
            (
                "for=203.0.113.7;proto=https;path=\"/x,for=6.6.6.6;y=\"",
                "203.0.113.7",
            ),
            // Its Host, quoted, before other pairs.
            (
                "for=203.0.113.7;host=\"a,for=6.6.6.6;x=\";proto=https",
                "203.0.113.7",
            ),
            // A quoted comma or semicolon alone.
            (
                "for=203.0.113.7;host=\"evil.example,for=6.6.6.6\"",
                "203.0.113.7",
            ),
            ("for=203.0.113.7;host=\"a;for=6.6.6.6\"", "203.0.113.7"),
            // After a client's own element, as the proxy appends it.
            (
                "for=9.9.9.9, for=203.0.113.7;path=\"/,for=6.6.6.6;q=\"",
                "203.0.113.7",
            ),
            // An escaped quote inside the quoted string closes nothing.
            (
                "for=203.0.113.7;path=\"/a\\\",for=6.6.6.6;x=\\\"\"",
                "203.0.113.7",
            ),
            // An escaped backslash before the closing quote: closed.
            (
                "for=6.6.6.6, for=203.0.113.7;path=\"/a\\\\\"",
                "203.0.113.7",
            ),
            // A trusted hop's element to the left, quoted commas and all.
            (
                "for=203.0.113.7;host=\"x,y\", for=10.0.0.9;host=\"a,for=6.6.6.6\"",
                "203.0.113.7",
            ),
            // A proxy's order with its `for=` last (`proto;host;by;for`).
            (
                "proto=https;host=\"a,b\";by=10.0.0.5;for=203.0.113.7",
                "203.0.113.7",
            ),
        ],
    );
}

#[test]
fn a_single_address_header_is_believed_from_a_trusted_peer_only() {
    let proxies = reading(single("cf-connecting-ip"));
    let peer = ip("10.0.0.5");
    reads(
        &proxies,
        "cf-connecting-ip",
        &[
            ("203.0.113.7", "203.0.113.7"),
            (" 2001:db8::7 ", "2001:db8::7"),
            ("[2001:db8::7]:443", "2001:db8::7"),
            ("::ffff:203.0.113.7", "203.0.113.7"),
            // A list, or garbage: the peer.
            ("6.6.6.6, 203.0.113.7", "10.0.0.5"),
            ("unknown", "10.0.0.5"),
            ("", "10.0.0.5"),
        ],
    );
    // From a peer that is not a proxy: the peer.
    let direct = ip("198.51.100.7");
    let forged = headers(&[("cf-connecting-ip", "203.0.113.7")]);
    assert_eq!(proxies.client_ip(direct, &forged), direct);
    // Two lines: the proxy did not replace the client's: the peer.
    let twice = headers(&[
        ("cf-connecting-ip", "6.6.6.6"),
        ("cf-connecting-ip", "203.0.113.7"),
    ]);
    assert_eq!(proxies.client_ip(peer, &twice), peer);
}

#[test]
fn ipv6_peers_entries_and_networks() {
    let proxies = reading(ClientIpSource::XForwardedFor);
    // A dual-stack socket's mapped IPv4 peer is the IPv4 proxy, and a
    // mapped entry is its IPv4 address.
    let mapped = ip("::ffff:10.0.0.5");
    let xff = headers(&[("x-forwarded-for", "::ffff:203.0.113.9")]);
    assert_eq!(proxies.client_ip(mapped, &xff), ip("203.0.113.9"));
    // An IPv6 proxy in fd00::/8, and an IPv6 client before it.
    let v6 = headers(&[("x-forwarded-for", "2001:db8::1, [fd00::9]:80")]);
    assert_eq!(proxies.client_ip(ip("fd00::5"), &v6), ip("2001:db8::1"));
    // An IPv6 peer outside the networks: itself.
    assert_eq!(proxies.client_ip(ip("2001:db8::5"), &v6), ip("2001:db8::5"));
    // A proxy written mapped into IPv6 is its IPv4 address or network,
    // as the peer is read; a mapped network wider than IPv4 is refused.
    for written in [
        "::ffff:10.0.0.5",
        "::ffff:10.0.0.0/120",
        "::ffff:10.0.0.0/104",
    ] {
        let mapped_proxy = TrustedProxies::new(ClientIpSource::XForwardedFor, [written]).unwrap();
        assert!(trusts(&mapped_proxy, "10.0.0.5"), "{written}");
        assert!(trusts(&mapped_proxy, "::ffff:10.0.0.5"), "{written}");
        assert!(!trusts(&mapped_proxy, "11.0.0.5"), "{written}");
    }
    let error =
        TrustedProxies::new(ClientIpSource::XForwardedFor, ["::ffff:0.0.0.0/95"]).unwrap_err();
    assert!(matches!(error, Error::InvalidArgument(_)));
}

#[test]
fn a_huge_header_is_read_a_bounded_way_from_the_right() {
    let proxies = reading(ClientIpSource::XForwardedFor);
    let peer = ip("10.0.0.5");
    let list = |entries: Vec<String>| headers(&[("x-forwarded-for", &entries.join(", "))]);
    // 100 000 forged entries: the client's, on the right, is found.
    let mut forged: Vec<String> = (0..100_000)
        .map(|i| format!("6.6.{}.{}", i / 256 % 256, i % 256))
        .collect();
    forged.push("203.0.113.7".to_owned());
    assert_eq!(proxies.client_ip(peer, &list(forged)), ip("203.0.113.7"));
    // 100 000 trusted entries: the read stops after 64 of them, at the
    // 64th from the right.
    let trusted: Vec<String> = (0..100_000)
        .map(|i| format!("10.{}.{}.{}", i / 65_536, i / 256 % 256, i % 256))
        .collect();
    let stop = ip(&trusted[trusted.len() - MAX_HOPS]);
    assert_eq!(proxies.client_ip(peer, &list(trusted)), stop);
    // As many lines: the same.
    let mut lines = HeaderMap::new();
    for i in 0..100_000u32 {
        let value = format!("10.{}.{}.{}", i / 65_536, i / 256 % 256, i % 256);
        lines.append("x-forwarded-for", value.parse().unwrap());
    }
    let last = 100_000 - MAX_HOPS as u32;
    let stop = format!("10.{}.{}.{}", last / 65_536, last / 256 % 256, last % 256);
    assert_eq!(proxies.client_ip(peer, &lines), ip(&stop));
    // One entry of a megabyte, and one a byte past the bound: not
    // addresses, so the proxy that wrote them; one at the bound is read.
    let padded = |len: usize| format!("6.6.6.6,{}203.0.113.7", " ".repeat(len - 11));
    for (len, client) in [
        (1 << 20, peer),
        (MAX_ENTRY + 1, peer),
        (MAX_ENTRY, ip("203.0.113.7")),
    ] {
        let got = proxies.client_ip(peer, &headers(&[("x-forwarded-for", &padded(len))]));
        assert_eq!(got, client, "{len}");
    }
}
