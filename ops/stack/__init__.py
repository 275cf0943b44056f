"""ops.stack.control."""
