//! The signature of a delivery: `X-Rankgate-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret,
//! "<t>.<body>")>`, made at each attempt (so `t` is the attempt's time, for receivers to refuse old
//! replays), beside the delivery id a receiver drops repeats by.

use rankgate_store::queue::token::hmac_sha256;

/// The signature header.
pub const SIGNATURE_HEADER: &str = "x-rankgate-signature";
/// The delivery id header (`<webhook>:<sequence>`, also the body's `id`).
pub const DELIVERY_HEADER: &str = "x-rankgate-delivery";

/// `t=<seconds>,v1=<hex>` for `body` signed with `secret` at `unix_seconds`.
pub fn signature_header(secret: &[u8], unix_seconds: i64, body: &[u8]) -> String {
    let mut message = format!("{unix_seconds}.").into_bytes();
    message.extend_from_slice(body);
    let mac = hmac_sha256(secret, &message);
    format!("t={unix_seconds},v1={}", hex::encode(mac))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_hmac_sha256_over_the_timestamp_and_body() {
        // Python: hmac.new(b"whsec-0123456789abcdef", b"1700000000.{}", hashlib.sha256).hexdigest()
        assert_eq!(
            signature_header(b"whsec-0123456789abcdef", 1_700_000_000, b"{}"),
            "t=1700000000,v1=2d586df5f91a6ea5c4bc37bd80e94fb1103f9da69ee9cbd3f6a22a939e1fe1f8"
        );
    }
}
