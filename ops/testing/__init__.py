"""ops.testing."""
