"""consumer.kafka."""
