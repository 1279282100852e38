"""Test kit shipped with the core, for core and plugin tests alike.

- :mod:`~atlas_core.testing.contracts`: contract classes a backend subclasses to get the whole
  suite (``GpuBackendContract``, ``CommBackendContract``, ``StorageBackendContract``), and the
  contract tests generated from registered op specs.
- :mod:`~atlas_core.testing.checkpoints`: tiny random HF checkpoints of every registered
  architecture, and ones transformers itself saves for HF parity (with its reference logits);
  :mod:`~atlas_core.testing.forward`: a model stepped without the engine, and logit comparisons.
- :mod:`~atlas_core.testing.fake_model`: the engine's fakes (a CausalLM-shaped model whose
  logits depend on the whole context, an engine over it, a run-to-completion loop) and helpers
  that drive a real engine (requests run to completion, same completions, everything freed,
  graph-replayed decode steps on the mock backend).
- :mod:`~atlas_core.testing.serving`: tool-call round trips through the HTTP server and the
  OpenAI SDK, with a real checkpoint or a scripted fake model.
- :mod:`~atlas_core.testing.gpu`: CUDA probes that skip without a device, cuda-vs-numpy greedy
  parity, and NVRTC compile checks of a plugin's kernels.
- :mod:`~atlas_core.testing.sched_sim`: the real scheduler under ``scripts/sched_bench.py``'s
  mixed load on a simulated clock, with a GPU-shaped step cost (scheduling policies, #31).
- :mod:`~atlas_core.testing.fixtures`: where the real-model tokenizer fixtures live.
"""
