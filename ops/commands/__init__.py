"""ops.commands."""
