//! The peer a request came from, and the proxies whose word about a request is believed.
//!
//! The edge records each connection's TCP peer: hyper's requests carry it as axum's
//! [`ConnectInfo`](axum::extract::ConnectInfo), the fast path hands it to its routes in
//! [`DirectRequest::peer`](super::fast_path::DirectRequest::peer). [`PeerAddress`] reads it in a handler
//! without failing when it is absent (a router driven by `oneshot` in a test has none: such a request
//! is simply from no trusted proxy).
//!
//! [`TrustedProxies`] is `[waiting_room] trusted_proxies` parsed once at start: CIDRs, a bare address
//! meaning exactly that address (/32, /128). A peer in one of them is the shop's own gateway, whose
//! word on who a request speaks for is believed (SPEC 2.2, "Member identity").
//!
//! [`client_address`] is the address a request counts against in per-address budgets (SPEC 2.2,
//! "Per-address budgets"): the peer's, or, when the peer is a trusted proxy, the `Forwarded` /
//! `X-Forwarded-For` hop just before the nearest untrusted one. Hops a client wrote itself (left of
//! the first untrusted hop, reading from the right) are never believed. [`AddressKey`] is what a budget
//! counts by: an IPv4 address, or an IPv6 address's /64 (one subscriber's usual allocation).

use std::convert::Infallible;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use ipnet::IpNet;

use super::fast_path::DirectHeaders;

/// The request's TCP peer address, when the edge recorded one.
#[derive(Debug, Clone, Copy)]
pub struct PeerAddress(pub Option<IpAddr>);

impl<S: Send + Sync> FromRequestParts<S> for PeerAddress {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<PeerAddress, Infallible> {
        Ok(PeerAddress::of_extensions(&parts.extensions))
    }
}

impl PeerAddress {
    /// The peer the edge recorded in `extensions` (see the module docs).
    #[must_use]
    pub fn of_extensions(extensions: &axum::http::Extensions) -> PeerAddress {
        PeerAddress(
            extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|ConnectInfo(peer)| peer.ip()),
        )
    }
}

/// `trusted_proxies`: the networks whose peers are believed. Empty trusts nobody.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    /// Parses each entry, a CIDR (`10.0.0.0/8`, `2001:db8::/32`) or a bare address (`192.0.2.7`,
    /// `::1`); an error names `key` and the entry's index.
    pub fn parse<S: AsRef<str>>(key: &str, entries: &[S]) -> anyhow::Result<TrustedProxies> {
        let networks = entries
            .iter()
            .enumerate()
            .map(|(index, entry)| {
                let entry = entry.as_ref().trim();
                entry
                    .parse::<IpNet>()
                    .or_else(|_| entry.parse::<IpAddr>().map(IpNet::from))
                    .map(|network| network.trunc())
                    .map_err(|_| {
                        anyhow::anyhow!(
                            "{key}[{index}]: {entry:?} is neither a CIDR (\"10.0.0.0/8\", \"2001:db8::/32\") nor \
                             an IP address"
                        )
                    })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(TrustedProxies(networks))
    }

    /// True when no proxy is trusted.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many networks are trusted.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether `peer` is in a trusted network. An IPv4-mapped IPv6 peer (how a dual-stack listener sees
    /// an IPv4 client) is matched as the IPv4 address it is, so `10.0.0.0/8` covers `::ffff:10.1.2.3`.
    #[must_use]
    pub fn contains(&self, peer: IpAddr) -> bool {
        let peer = match peer {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(peer, IpAddr::V4),
            v4 => v4,
        };
        self.0.iter().any(|network| network.contains(&peer))
    }
}

/// Most forwarding hops read from a request's headers (the nearest ones): a longer chain is a client
/// padding the header, and reading it would cost time for nothing.
pub const MAX_FORWARDED_HOPS: usize = 32;

/// Most header lines of one name read (the nearest ones); a request rarely has more than one.
const MAX_FORWARDED_LINES: usize = 16;

/// The address a request counts against (see the module docs); `None` when the edge recorded no peer.
/// Reads the hops nearest first and stops at the first untrusted one, without allocating.
#[must_use]
pub fn client_address(
    peer: Option<IpAddr>,
    headers: &DirectHeaders<'_>,
    proxies: &TrustedProxies,
) -> Option<IpAddr> {
    let peer = unmapped(peer?);
    if !proxies.contains(peer) {
        return Some(peer);
    }
    let mut nearest_trusted = peer;
    let (forwarded, lines) = forwarded_lines(headers);
    let nearest_first = lines.iter().rev().flat_map(|line| line.rsplit(','));
    let hops: &mut dyn Iterator<Item = Option<IpAddr>> = if forwarded {
        &mut nearest_first.filter_map(forwarded_for)
    } else {
        &mut nearest_first.map(|hop| parse_hop(trim_ows(hop)))
    };
    for hop in hops.take(MAX_FORWARDED_HOPS) {
        match hop.map(unmapped) {
            Some(address) if proxies.contains(address) => nearest_trusted = address,
            Some(address) => return Some(address),
            // A hop that is no address (`unknown`, an obfuscated name, garbage): nothing left of it can
            // be attributed, so the request counts against the trusted proxy that passed it on.
            None => return Some(nearest_trusted),
        }
    }
    Some(nearest_trusted)
}

/// The request's `Forwarded` lines (RFC 7239) when it has any, else its `X-Forwarded-For` lines: whether
/// they are `Forwarded`, and the last [`MAX_FORWARDED_LINES`] of them in order.
fn forwarded_lines<'a>(headers: &DirectHeaders<'a>) -> (bool, LastLines<'a>) {
    let mut lines = LastLines::default();
    for line in headers.get_all_str("forwarded") {
        lines.push(line);
    }
    if !lines.is_empty() {
        return (true, lines);
    }
    for line in headers.get_all_str("x-forwarded-for") {
        lines.push(line);
    }
    (false, lines)
}

/// The last [`MAX_FORWARDED_LINES`] lines pushed, oldest first, on the stack.
#[derive(Default)]
struct LastLines<'a> {
    lines: [&'a str; MAX_FORWARDED_LINES],
    pushed: usize,
}

impl<'a> LastLines<'a> {
    fn push(&mut self, line: &'a str) {
        self.lines[self.pushed % MAX_FORWARDED_LINES] = line;
        self.pushed += 1;
    }

    fn is_empty(&self) -> bool {
        self.pushed == 0
    }

    /// The kept lines, oldest first.
    fn iter(&self) -> impl DoubleEndedIterator<Item = &'a str> + '_ {
        let kept = self.pushed.min(MAX_FORWARDED_LINES);
        let first = self.pushed - kept;
        (first..self.pushed).map(|index| self.lines[index % MAX_FORWARDED_LINES])
    }
}

/// The `for=` hop of one `Forwarded` element (`None` for an element without one: not a hop), parsed.
fn forwarded_for(element: &str) -> Option<Option<IpAddr>> {
    element.split(';').find_map(|pair| {
        let (name, value) = trim_ows(pair).split_once('=')?;
        trim_ows(name)
            .eq_ignore_ascii_case("for")
            .then(|| parse_hop(trim_ows(value)))
    })
}

/// `raw` without HTTP's optional whitespace (spaces and tabs, RFC 9110) around it. Not `str::trim`,
/// which would also take Unicode spaces such as U+0085 off a hop a client wrote.
fn trim_ows(raw: &str) -> &str {
    raw.trim_matches([' ', '\t'])
}

/// One hop's address: `192.0.2.1`, `192.0.2.1:4711`, `2001:db8::1`, `[2001:db8::1]:4711`, optionally in
/// double quotes (RFC 7239 quotes IPv6 and ports).
fn parse_hop(raw: &str) -> Option<IpAddr> {
    let raw = raw
        .strip_prefix('"')
        .and_then(|r| r.strip_suffix('"'))
        .unwrap_or(raw);
    if let Ok(address) = raw.parse::<IpAddr>() {
        return Some(address);
    }
    if let Some(bracketed) = raw.strip_prefix('[') {
        let (inside, _port) = bracketed.split_once(']')?;
        return inside.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    raw.parse::<SocketAddr>().ok().map(|socket| socket.ip())
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn unmapped(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(address, IpAddr::V4),
        v4 => v4,
    }
}

/// What a per-address budget counts by: an IPv4 address, or the /64 of an IPv6 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AddressKey(IpNet);

impl AddressKey {
    /// The key of `address`.
    #[must_use]
    pub fn of(address: IpAddr) -> AddressKey {
        let network = match unmapped(address) {
            IpAddr::V4(v4) => IpNet::from(IpAddr::V4(v4)),
            IpAddr::V6(v6) => IpNet::V6(ipnet::Ipv6Net::new(v6, 64).expect("64 is a valid prefix").trunc()),
        };
        AddressKey(network)
    }
}

impl AddressKey {
    /// The key as a compact label for limiter keys and challenge tags: `4:` and the IPv4 address's 8 hex
    /// digits, or `6:` and the /64's 16 (no `fmt`: an entry of a new member builds one).
    #[must_use]
    pub fn label(&self) -> String {
        let (tag, bits, digits) = match self.0 {
            IpNet::V4(v4) => ("4:", u64::from(u32::from(v4.addr())), 8),
            IpNet::V6(v6) => ("6:", (u128::from(v6.addr()) >> 64) as u64, 16),
        };
        let mut label = String::with_capacity(2 + digits);
        label.push_str(tag);
        for shift in (0..digits).rev() {
            let nibble = ((bits >> (shift * 4)) & 0xf) as u8;
            label.push(char::from(if nibble < 10 {
                b'0' + nibble
            } else {
                b'a' + nibble - 10
            }));
        }
        label
    }
}

impl std::fmt::Display for AddressKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            IpNet::V4(v4) => write!(f, "{}", v4.addr()),
            IpNet::V6(v6) => write!(f, "{v6}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn ipv4_networks_contain_their_addresses_only() {
        let proxies = TrustedProxies::parse("trusted_proxies", &["10.0.0.0/8", "192.168.1.0/24"]).unwrap();
        for inside in ["10.0.0.0", "10.255.255.255", "192.168.1.77", "::ffff:10.1.2.3"] {
            assert!(proxies.contains(ip(inside)), "{inside}");
        }
        for outside in ["11.0.0.1", "192.168.2.1", "127.0.0.1", "::1", "::a00:1"] {
            assert!(!proxies.contains(ip(outside)), "{outside}");
        }
    }

    #[test]
    fn ipv6_networks_contain_their_addresses_only() {
        let proxies = TrustedProxies::parse("trusted_proxies", &["2001:db8::/32", "fd00::/8"]).unwrap();
        for inside in ["2001:db8::1", "2001:db8:ffff::9", "fd12:3456::1"] {
            assert!(proxies.contains(ip(inside)), "{inside}");
        }
        for outside in ["2001:db9::1", "fe80::1", "::1", "10.0.0.1"] {
            assert!(!proxies.contains(ip(outside)), "{outside}");
        }
    }

    #[test]
    fn a_bare_address_is_that_address_alone() {
        let proxies = TrustedProxies::parse("trusted_proxies", &[" 192.0.2.7 ", "2001:db8::7"]).unwrap();
        assert!(proxies.contains(ip("192.0.2.7")));
        assert!(proxies.contains(ip("::ffff:192.0.2.7")));
        assert!(!proxies.contains(ip("192.0.2.8")));
        assert!(proxies.contains(ip("2001:db8::7")));
        assert!(!proxies.contains(ip("2001:db8::8")));
    }

    #[test]
    fn host_bits_in_a_cidr_are_ignored_and_nothing_is_trusted_by_default() {
        let proxies = TrustedProxies::parse("trusted_proxies", &["10.1.2.3/8"]).unwrap();
        assert!(proxies.contains(ip("10.200.0.1")));
        assert!(!TrustedProxies::default().contains(ip("127.0.0.1")));
    }

    #[test]
    fn a_bad_entry_is_refused_naming_the_key_and_its_index() {
        for bad in ["10.0.0.0/33", "example.com", "", "10.0.0/8", "::1/129"] {
            let error = TrustedProxies::parse("waiting_room.trusted_proxies", &["10.0.0.0/8", bad])
                .unwrap_err()
                .to_string();
            assert!(
                error.starts_with("waiting_room.trusted_proxies[1]: "),
                "{bad}: {error}"
            );
        }
    }

    fn client(peer: &str, lines: &[(&'static str, &str)], proxies: &[&str]) -> Option<IpAddr> {
        let mut map = axum::http::HeaderMap::new();
        for (name, value) in lines {
            map.append(*name, value.parse().unwrap());
        }
        let proxies = TrustedProxies::parse("trusted_proxies", proxies).unwrap();
        client_address(Some(ip(peer)), &DirectHeaders::Map(&map), &proxies)
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_forwards() {
        let forged = [
            ("x-forwarded-for", "203.0.113.9"),
            ("forwarded", "for=203.0.113.9"),
        ];
        assert_eq!(client("198.51.100.1", &forged, &[]), Some(ip("198.51.100.1")));
        assert_eq!(
            client("198.51.100.1", &forged, &["10.0.0.0/8"]),
            Some(ip("198.51.100.1"))
        );
        assert_eq!(client("::ffff:198.51.100.1", &[], &[]), Some(ip("198.51.100.1")));
    }

    #[test]
    fn a_trusted_peer_names_the_hop_before_the_nearest_untrusted_one() {
        let proxies = ["10.0.0.0/8"];
        // The client wrote 1.1.1.1 itself; 203.0.113.9 is what our first proxy saw.
        let chain = [("x-forwarded-for", "1.1.1.1, 203.0.113.9, 10.0.0.2")];
        assert_eq!(client("10.0.0.1", &chain, &proxies), Some(ip("203.0.113.9")));
        let split = [
            ("x-forwarded-for", "1.1.1.1"),
            ("x-forwarded-for", "203.0.113.9 , 10.0.0.2"),
        ];
        assert_eq!(client("10.0.0.1", &split, &proxies), Some(ip("203.0.113.9")));
        // Every hop trusted: the farthest.
        let internal = [("x-forwarded-for", "10.9.9.9, 10.0.0.2")];
        assert_eq!(client("10.0.0.1", &internal, &proxies), Some(ip("10.9.9.9")));
        // No header: the proxy itself.
        assert_eq!(client("10.0.0.1", &[], &proxies), Some(ip("10.0.0.1")));
        // Garbage next to a trusted hop: the trusted hop that passed it on.
        let garbage = [("x-forwarded-for", "203.0.113.9, nonsense, 10.0.0.2")];
        assert_eq!(client("10.0.0.1", &garbage, &proxies), Some(ip("10.0.0.2")));
    }

    #[test]
    fn forwarded_wins_over_x_forwarded_for_and_its_forms_parse() {
        let proxies = ["10.0.0.0/8"];
        let both = [
            ("x-forwarded-for", "192.0.2.200"),
            (
                "forwarded",
                "for=192.0.2.60;proto=http;by=203.0.113.43, for=\"[2001:db8:cafe::17]:4711\"",
            ),
        ];
        assert_eq!(client("10.0.0.1", &both, &proxies), Some(ip("2001:db8:cafe::17")));
        let port = [("forwarded", "For=\"192.0.2.43:47011\"")];
        assert_eq!(client("10.0.0.1", &port, &proxies), Some(ip("192.0.2.43")));
        let unknown = [("forwarded", "for=unknown")];
        assert_eq!(client("10.0.0.1", &unknown, &proxies), Some(ip("10.0.0.1")));
    }

    #[test]
    fn a_padded_chain_is_read_only_near_its_end() {
        let padded = format!("{}203.0.113.9", "10.1.1.1, ".repeat(10_000));
        let line = [("x-forwarded-for", padded.as_str())];
        assert_eq!(
            client("10.0.0.1", &line, &["10.0.0.0/8"]),
            Some(ip("203.0.113.9"))
        );
        assert_eq!(
            client("10.0.0.1", &line, &["10.0.0.0/8", "203.0.113.0/24"]),
            Some(ip("10.1.1.1"))
        );
    }

    #[test]
    fn ipv6_counts_by_its_64_and_ipv4_by_its_address() {
        let key = |text: &str| AddressKey::of(ip(text)).to_string();
        assert_eq!(key("2001:db8:1:2:aaaa::1"), "2001:db8:1:2::/64");
        assert_eq!(key("2001:db8:1:2:ffff:ffff:ffff:ffff"), key("2001:db8:1:2::"));
        assert_ne!(key("2001:db8:1:3::1"), key("2001:db8:1:2::1"));
        assert_eq!(key("192.0.2.7"), "192.0.2.7");
        assert_eq!(key("::ffff:192.0.2.7"), "192.0.2.7");
        assert_ne!(key("192.0.2.7"), key("192.0.2.8"));
        let label = |text: &str| AddressKey::of(ip(text)).label();
        assert_eq!(label("192.0.2.7"), "4:c0000207");
        assert_eq!(label("::ffff:192.0.2.7"), "4:c0000207");
        assert_eq!(label("2001:db8:1:2:aaaa::1"), "6:20010db800010002");
        assert_eq!(label("2001:db8:1:2::"), label("2001:db8:1:2:ffff::9"));
    }

    #[test]
    fn a_hop_with_unicode_whitespace_is_no_address() {
        // Found by fuzzing (fuzz/fuzz_targets/entry_guard.rs): `str::trim` took the U+0085 off.
        let line = [("x-forwarded-for", "10.0.0.2\u{85}")];
        assert_eq!(client("10.0.0.1", &line, &["10.0.0.0/8"]), Some(ip("10.0.0.1")));
        let spaced = [("x-forwarded-for", " \t203.0.113.9\t ")];
        assert_eq!(
            client("10.0.0.1", &spaced, &["10.0.0.0/8"]),
            Some(ip("203.0.113.9"))
        );
    }

    #[test]
    fn many_header_lines_keep_the_nearest() {
        let lines: Vec<(&'static str, String)> = (0..40)
            .map(|i| ("x-forwarded-for", format!("203.0.113.{i}")))
            .collect();
        let borrowed: Vec<(&'static str, &str)> = lines.iter().map(|(n, v)| (*n, v.as_str())).collect();
        assert_eq!(
            client("10.0.0.1", &borrowed, &["10.0.0.0/8"]),
            Some(ip("203.0.113.39"))
        );
    }
}
