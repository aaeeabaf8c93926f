"""Worker side of serving: the engine loop, event delivery, embedded mode, reaping."""
