"""consumer: the lifecycle (assignment mutex, lifetimes, tokens, frontiers) and the Kafka worker."""

from consumer.decisions import IllegalTransition, LifetimeState
from consumer.lifecycle import Lifecycle

__all__ = ["IllegalTransition", "Lifecycle", "LifetimeState"]
