//! The entry guards' parsers (issue 28): the client address a request counts against, from hostile
//! `Forwarded` / `X-Forwarded-For` headers behind a trusted proxy, and the check of a hostile
//! `X-Queue-Challenge` solution.
//!
//! Input: lines; the first byte's low bit picks `Forwarded` or `X-Forwarded-For` for the header lines,
//! the last line is a `<challenge>:<nonce>` to check. Properties: never a panic; the client address is the
//! peer or an address written in the headers (never invented); an untrusted peer is always its own
//! client; a check of anything but an issued challenge's solution is refused, and a solution the key
//! issued and the input's nonce solves is accepted at most once per call.
#![no_main]

use std::net::IpAddr;

use axum::http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use rankgate::http::fast_path::DirectHeaders;
use rankgate::http::peer::{client_address, TrustedProxies};
use rankgate::waiting_room::entry_guard::ChallengeKey;
use rankgate_core::queue::QueueName;
use rankgate_store::queue::token::TokenSecret;

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let mut lines: Vec<&str> = text.split('\n').collect();
    let solution = lines.pop().unwrap_or("");
    let name = if first & 1 == 0 {
        "forwarded"
    } else {
        "x-forwarded-for"
    };
    let mut headers = HeaderMap::new();
    for line in &lines {
        if let Ok(value) = HeaderValue::from_str(line) {
            headers.append(name, value);
        }
    }
    let proxies = TrustedProxies::parse("trusted_proxies", &["10.0.0.0/8", "2001:db8::/32"]).unwrap();
    let trusted: IpAddr = "10.0.0.1".parse().unwrap();
    let client = client_address(Some(trusted), &DirectHeaders::Map(&headers), &proxies).unwrap();
    // Every address written anywhere in the header lines, parsed independently of the code under test.
    let written: Vec<IpAddr> = lines
        .iter()
        .flat_map(|line| line.split(|c: char| ", ;=\"[]\t".contains(c)))
        .filter_map(|token| {
            token
                .parse::<IpAddr>()
                .ok()
                .or_else(|| token.parse::<std::net::SocketAddr>().ok().map(|s| s.ip()))
        })
        .map(|address| match address {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(address, IpAddr::V4),
            v4 => v4,
        })
        .collect();
    assert!(
        client == trusted || written.contains(&client),
        "{client} invented from {lines:?}"
    );
    let outside: IpAddr = "192.0.2.1".parse().unwrap();
    assert_eq!(
        client_address(Some(outside), &DirectHeaders::Map(&headers), &proxies),
        Some(outside)
    );

    let key = ChallengeKey::derived_from(&TokenSecret::from_bytes([3; 32]));
    let queue = QueueName::parse("drop").unwrap();
    if let Some((challenge, nonce)) = solution.rsplit_once(':') {
        // Not issued by this key (the fuzzer cannot forge an HMAC): always refused.
        assert!(key
            .check(challenge, nonce, &queue, "192.0.2.1", 0, 1_800_000_000_000)
            .is_err());
    }
    let issued = key.issue(&queue, "192.0.2.1", 0, 1_800_000_000_000);
    let nonce: String = solution.chars().filter(char::is_ascii_digit).take(20).collect();
    let checked = key.check(
        &issued.challenge,
        &nonce,
        &queue,
        "192.0.2.1",
        0,
        1_800_000_000_000,
    );
    assert_eq!(
        checked.is_ok(),
        !nonce.is_empty(),
        "difficulty 0: any well-formed nonce solves"
    );
});
