//! The signatures of a delivery, both made at each attempt (so their timestamp is the attempt's time, for
//! receivers to refuse old replays), beside the delivery id a receiver drops repeats by:
//!
//! - **Standard Webhooks** (standardwebhooks.com): `webhook-id: <delivery id>`, `webhook-timestamp: <unix
//!   seconds>`, `webhook-signature: v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<body>")>`, keyed by
//!   [`WebhookConfig::standard_key`](super::config::WebhookConfig::standard_key). It signs the id too, so
//!   a receiver that dedupes by id cannot be fed a replayed body under a fresh id. Any Standard Webhooks
//!   library verifies it.
//! - **rankgate's own**, kept for receivers written against it: `X-Rankgate-Signature: t=<unix
//!   seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>` and `X-Rankgate-Delivery: <delivery id>`.

use base64::Engine as _;

use rankgate_store::queue::token::hmac_sha256;

/// rankgate's signature header.
pub const SIGNATURE_HEADER: &str = "x-rankgate-signature";
/// The delivery id header (`<webhook>:<sequence>`, also the body's `id`).
pub const DELIVERY_HEADER: &str = "x-rankgate-delivery";
/// Standard Webhooks: the delivery id, the same on every attempt of one delivery.
pub const STANDARD_ID_HEADER: &str = "webhook-id";
/// Standard Webhooks: the attempt's time, unix seconds.
pub const STANDARD_TIMESTAMP_HEADER: &str = "webhook-timestamp";
/// Standard Webhooks: `v1,<base64>`.
pub const STANDARD_SIGNATURE_HEADER: &str = "webhook-signature";

/// `t=<seconds>,v1=<hex>` for `body` signed with `secret` at `unix_seconds`.
pub fn signature_header(secret: &[u8], unix_seconds: i64, body: &[u8]) -> String {
    let mut message = format!("{unix_seconds}.").into_bytes();
    message.extend_from_slice(body);
    let mac = hmac_sha256(secret, &message);
    format!("t={unix_seconds},v1={}", hex::encode(mac))
}

/// `v1,<base64>`: the Standard Webhooks signature of delivery `id`'s `body` at `unix_seconds`.
pub fn standard_signature_header(key: &[u8], id: &str, unix_seconds: i64, body: &[u8]) -> String {
    let mut message = format!("{id}.{unix_seconds}.").into_bytes();
    message.extend_from_slice(body);
    let mac = hmac_sha256(key, &message);
    format!("v1,{}", base64::engine::general_purpose::STANDARD.encode(mac))
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

    #[test]
    fn the_standard_signature_is_base64_hmac_sha256_over_id_timestamp_and_body() {
        // Python: base64.b64encode(hmac.new(b"0123456789abcdef01234567", b"toys-top:1.1700000000.{}",
        // hashlib.sha256).digest())
        let header =
            standard_signature_header(b"0123456789abcdef01234567", "toys-top:1", 1_700_000_000, b"{}");
        assert_eq!(header, "v1,IrWmvmfvfSrJhG3795zUM8GHdeMciNx9P3HkG3lIu+M=");
        // The reference implementation agrees (its timestamp check is what `verify` adds; `sign` is the
        // signature alone).
        let reference = standardwebhooks::Webhook::new("whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3").unwrap();
        assert_eq!(
            reference.sign("toys-top:1", 1_700_000_000, b"{}").unwrap(),
            header
        );
    }
}
