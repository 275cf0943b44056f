"""consumer.observability."""
