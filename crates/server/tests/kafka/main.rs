//! Kafka tests (issue 11): a real Kafka-protocol broker (tansu) started per test on a spare port.

/// `spawn_app()`: the whole service, as every HTTP test binary of this crate starts it.
#[path = "../support/app.rs"]
mod app;
mod broker;
mod consumer;
mod relay;

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};

/// The harness itself: a started broker takes a topic and acknowledges records on each partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_test_broker_creates_topics_and_acknowledges_records() {
    let broker = broker::Broker::start();
    broker.create_topic("smoke", 3).await;
    let producer: FutureProducer = broker
        .client_config()
        .set("enable.idempotence", "true")
        .create()
        .expect("producer");
    let mut partitions = std::collections::BTreeSet::new();
    for i in 0..12 {
        let key = format!("p{i}");
        let delivery = producer
            .send(
                FutureRecord::to("smoke").key(&key).payload("{}"),
                Duration::from_secs(10),
            )
            .await
            .expect("the broker acknowledges the record");
        partitions.insert(delivery.partition);
    }
    assert!(
        partitions.len() > 1,
        "keys spread over partitions: {partitions:?}"
    );
    let consumer: BaseConsumer = broker.client_config().create().expect("consumer");
    let metadata = consumer
        .fetch_metadata(Some("smoke"), Duration::from_secs(10))
        .expect("metadata");
    assert_eq!(metadata.topics()[0].partitions().len(), 3);
}
