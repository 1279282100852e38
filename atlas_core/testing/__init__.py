"""Test kit shipped with the core, for core and plugin tests alike.

- :mod:`~atlas_core.testing.contracts`: contract classes a backend subclasses to get the whole
  suite (``GpuBackendContract``, ``CommBackendContract``, ``StorageBackendContract``), and the
  contract tests generated from registered op specs.
- :mod:`~atlas_core.testing.checkpoints`: tiny random HF checkpoints of every registered
  architecture; :mod:`~atlas_core.testing.forward`: a model stepped without the engine.
- :mod:`~atlas_core.testing.fake_model`: the engine's fakes (a CausalLM-shaped model whose
  logits depend on the whole context, an engine over it, a run-to-completion loop).
- :mod:`~atlas_core.testing.fixtures`: where the real-model tokenizer fixtures live.
"""
