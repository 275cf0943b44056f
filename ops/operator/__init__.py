"""ops.operator."""
