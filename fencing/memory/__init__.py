"""fencing.memory."""
