"""ops.bench.worker."""
