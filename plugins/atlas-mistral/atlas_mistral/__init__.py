"""Atlas plugin: Mistral-4 family (entry point ``mistral`` in group ``atlas``)."""
