"""fencing.postgres."""
