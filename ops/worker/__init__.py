"""ops.worker."""
