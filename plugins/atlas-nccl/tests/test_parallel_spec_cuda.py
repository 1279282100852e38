"""On two GPUs (NCCL): speculative decoding under tensor and expert parallelism. On tiny
Qwen3.5 checkpoints (hybrid Gated DeltaNet + gated attention, float32) with a random MTP head,
greedy tokens with MTP (K=2) and n-gram (K=3) drafts at TP=2 / EP=2 equal the same split
engine's without speculation and one GPU's with it. Skipped without two GPUs, nccl4py or the
atlas-qwen35 plugin."""

import json

import numpy as np
import pytest

from atlas_core.api import (EngineArgs, LLMEngine, Module, Registry, SamplingParams,
                            checkpoint_tensors, write_safetensors)
from atlas_core.testing.checkpoints import random_tensor, write_tiny_checkpoint

from nccl_cuda_probe import HAS_GPU, HAS_NCCL, NUM_GPUS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="no CUDA device"),
              pytest.mark.skipif(NUM_GPUS < 2 or not HAS_NCCL, reason="needs 2 GPUs and nccl4py")]

MTP = {"method": "mtp", "num_speculative_tokens": 2, "draft_token_cost": 0.0}
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "draft_token_cost": 0.0}


def _with_head(arch, path):
    registry = Registry()
    if arch not in registry.names("weight_loaders"):
        pytest.skip(f"no loader for {arch}: pip install --no-deps -e plugins/atlas-qwen35")
    write_tiny_checkpoint(arch, path, registry=registry)
    config = json.loads((path / "config.json").read_text())
    config["mtp_num_hidden_layers"] = 1
    (path / "config.json").write_text(json.dumps(config, indent=2))
    loader = registry.create("weight_loaders", arch, registry=registry)
    root = Module()
    root.add("mtp", loader.build_mtp(loader.resolve_config(config), None))
    rng = np.random.default_rng(11)
    tensors = {n: random_tensor(n, s, rng) for n, s in checkpoint_tensors(root).items()}
    write_safetensors(path / "mtp.safetensors", tensors, {"format": "pt"})
    return path


def _generate(path, tp=1, ep=False, spec=None):
    engine = LLMEngine.from_args(EngineArgs(
        model=str(path), backend="cuda", max_num_seqs=4, num_kv_blocks=64, block_size=16,
        tensor_parallel_size=tp, enable_expert_parallel=ep, speculative_config=spec))
    rng = np.random.default_rng(3)
    motif = rng.integers(0, 380, 5).tolist()
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    for i, prompt in enumerate([motif * 3, rng.integers(0, 380, 9).tolist()]):
        engine.add_request(f"r{i}", prompt, params)
    out = {}
    try:
        while engine.has_unfinished_requests():
            for o in engine.step():
                if o.finished:
                    out[o.request_id] = o.outputs[0].token_ids
        stats = engine.stats().speculative
    finally:
        if tp > 1:
            engine.runner.shutdown()
    return out, stats and (stats.num_draft_tokens, stats.num_accepted_tokens)


@pytest.mark.parametrize("arch,ep", [("Qwen3_5ForCausalLM", False),
                                     ("Qwen3_5MoeForCausalLM", True)])
def test_speculation_split_over_two_gpus(tmp_path, arch, ep):
    path = _with_head(arch, tmp_path / arch)
    plain, _ = _generate(path, tp=2, ep=ep)
    for spec in (MTP, NGRAM):
        one, one_stats = _generate(path, spec=spec)
        split, stats = _generate(path, tp=2, ep=ep, spec=spec)
        assert split == plain, spec["method"]
        assert one == plain, spec["method"]
        assert stats[0] > 0, spec["method"]
        print(f"{arch} ep={ep} {spec['method']}: TP=2 drafted/accepted {stats}, "
              f"one GPU {one_stats}")
