"""On a CUDA GPU (marker ``gpu``, skipped without one; needs ``atlas-qwen3vl[cuda]``): the vision
ops match their references on their contract cases and at Qwen3-VL's own head_dim (72) with two
images and with one 1024-patch image (bf16 through the core tensor-core attention), and a tiny Qwen3-VL checkpoint gives the same vision features and greedy tokens with an
image on cuda as on numpy (float32). Run on the lent GPU: tests/gpu_session.sh."""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.api import resolve
from atlas_core.testing.contracts_cases import OpCase, check_case
from atlas_core.testing.contracts_ops import make_rng, randn
from atlas_core.testing.gpu import cuda_backend_or_skip
from atlas_qwen3vl.plugin import OPS
from atlas_qwen3vl.vision_layout import rotary_cos_sin

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda():
    return cuda_backend_or_skip()


def test_vision_ops_match_their_references_on_cuda(cuda):
    for spec in OPS:
        for case in resolve(spec.cases)():
            check_case(cuda, cuda.op_registry, spec.name, case)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_vision_attention_at_qwen3_vl_head_dim(cuda, dtype):
    grids = [(1, 16, 16), (1, 8, 8)]
    rng = make_rng("vision_attention-72", dtype)
    qkv = randn(rng, (320, 3 * 16 * 72), dtype)
    case = OpCase(f"{dtype}-d72", (qkv, rotary_cos_sin(grids, 72, 2, 10000.0),
                                   np.array([0, 256, 320], np.int32), 72 ** -0.5),
                  {"num_heads": 16, "head_dim": 72})
    check_case(cuda, cuda.op_registry, "vision_attention", case)


def test_vision_attention_of_a_1024_patch_image_on_tensor_cores(cuda, monkeypatch):
    """bf16 at head_dim 72: rotated q/k/v padded to 80 through the core bidirectional
    prefill attention (the flash kernel), against the reference."""
    calls = []
    core = cuda.ops.prefill_attention

    def spy(q, k, v, cu_seqlens, scale, *, causal=True):
        calls.append((q.shape, causal))
        return core(q, k, v, cu_seqlens, scale, causal=causal)

    monkeypatch.setattr(cuda.ops, "prefill_attention", spy)
    rng = make_rng("vision_attention-1024", "bfloat16")
    qkv = randn(rng, (1024, 3 * 16 * 72), "bfloat16")
    case = OpCase("bf16-1024", (qkv, rotary_cos_sin([(1, 32, 32)], 72, 2, 10000.0),
                                np.array([0, 1024], np.int32), 72 ** -0.5),
                  {"num_heads": 16, "head_dim": 72})
    check_case(cuda, cuda.op_registry, "vision_attention", case)
    assert calls == [((1024, 16, 80), False)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, registry):
    from qwen3vl_checkpoints import save_hf_checkpoint, small_processor_config

    path = save_hf_checkpoint("Qwen3VLForConditionalGeneration", tmp_path_factory.mktemp("vl"),
                              registry)
    small_processor_config(path)
    return path


def test_tiny_qwen3_vl_on_cuda_matches_numpy(cuda, checkpoint):
    from qwen3vl_checkpoints import greedy_with_image

    ref_embeds, ref = greedy_with_image(checkpoint, "numpy")
    embeds, got = greedy_with_image(checkpoint, "cuda")
    assert np.abs(np.asarray(embeds, np.float32) - ref_embeds).max() < 1e-3
    assert got == ref
