"""Atlas plugin: Gemma-4 text models (entry point ``gemma4`` in group ``atlas``)."""
