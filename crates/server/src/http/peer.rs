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

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use ipnet::IpNet;

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
}
