"""Tiny hybrid checkpoints with a random MTP head, for the speculative-decoding tests of core and
the plugins (HF transformers writes none): the head's tensors, named and shaped as the loader
declares them, go to a second safetensors file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from atlas_core.api import Module, checkpoint_tensors, write_safetensors

#: The config field that declares the head, per architecture.
MTP_FIELD = {"Qwen3NextForCausalLM": "num_nextn_predict_layers"}


def add_mtp_head(path: Path, arch: str, loader, seed: int = 0) -> dict[str, np.ndarray]:
    """Write random ``mtp.*`` tensors next to the checkpoint at ``path`` and declare the head
    in its config.json; returns the tensors."""
    config_path = path / "config.json"
    config = json.loads(config_path.read_text())
    config[MTP_FIELD.get(arch, "mtp_num_hidden_layers")] = 1
    config_path.write_text(json.dumps(config, indent=2))
    root = Module()
    root.add("mtp", loader.build_mtp(loader.resolve_config(config), None))
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in checkpoint_tensors(root).items():
        if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
            tensors[name] = rng.normal(0, 0.1, shape).astype(np.float32)
        elif name.endswith(("A_log", "dt_bias")):
            tensors[name] = rng.normal(0, 0.5, shape).astype(np.float32)
        else:
            tensors[name] = rng.normal(0, 0.08, shape).astype(np.float32)
    write_safetensors(path / "mtp.safetensors", tensors)
    return tensors
