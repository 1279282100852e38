"""Built-in layer kinds: ``attention``, ``mlp``, ``moe``, and the pre-norm decoder block."""
