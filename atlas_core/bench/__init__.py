"""``atlas bench``: random-weight checkpoints of named shapes, timed in-process on any backend."""
