"""Atlas plugin: MiniMax-M2 family (entry point ``minimax`` in group ``atlas``)."""
