"""Atlas plugin: Gemma-4 and Gemma-3 text models (entry point ``gemma4`` in group ``atlas``)."""
