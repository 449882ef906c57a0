//! Ingest sources besides `POST /v1/events`: a file ([`file`], `rankgate ingest`), a Redis Streams
//! consumer group ([`redis_streams`], `--stream`) and a Kafka consumer group ([`kafka`], `--kafka`). Both hand events to the same
//! validation, idempotency and writer thread as HTTP, and acknowledge a message only once it is
//! durable.

pub mod file;
pub mod kafka;
pub mod redis_streams;
