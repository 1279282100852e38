"""``qskinny_dense_*`` (policy ``gemm=skinny``: bf16 / f16 linears of 2-32 rows on the quantized
skinny kernel's dense variant) against the reference, on shapes that cover each n-tile count,
a partial last weight tile, K splits and a bias; and the same step with and without it inside a
whole model (greedy tokens equal). Host-side choice of the kernel: test_dense_skinny_host.py."""

import numpy as np
import pytest

from atlas_core.api import bfloat16
from atlas_core.api import reference as ref
from cuda_probe import device_rel_error as rel

pytestmark = pytest.mark.gpu
rng = np.random.default_rng(11)
#: (rows, N, K): n-tiles 1 / 2 / 4, N not a multiple of 16, K from one 128-wide step a warp to
#: qwen3-8b's down projection.
SHAPES = [(2, 64, 128), (8, 1000, 4096), (9, 4096, 4096), (16, 6144, 4096), (17, 72, 12288),
          (32, 4096, 12288), (5, 24576, 4096)]


def rand(*shape, dtype=bfloat16, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


@pytest.mark.parametrize("form", ["registers", "ring d3", "ring d4"])
@pytest.mark.parametrize("dtype", [bfloat16, np.float16])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_dense_skinny_matches_the_reference(cuda_backend, use_policy, monkeypatch, form, dtype,
                                            m, n, k):
    from atlas_cuda import ops_quant
    use_policy(gemm="skinny")
    if form != "registers":
        for nt in (1, 2, 4):
            monkeypatch.setitem(ops_quant.SKINNY2_CONFIG, ("dense", nt), (1, int(form[-1])))
    be = cuda_backend
    x, w, b = rand(m, k, dtype=dtype), rand(n, k, dtype=dtype, scale=k ** -0.5), rand(n, dtype=dtype)
    for bias in (None, b):
        y = be.ops.linear(be.from_host(x), be.from_host(w),
                          None if bias is None else be.from_host(bias))
        assert rel(be, y, ref.linear(x, w, bias)) < 1e-2


def test_a_model_decodes_the_same_tokens_with_it(cuda_backend, monkeypatch, tmp_path):
    """Greedy tokens of a tiny bf16 Qwen3 at batch 4 (its decode linears take 4 rows) are those
    of the default policy up to a near tie: the kernels differ only in summation order, so the
    top logprobs agree to bf16 noise, and where the two pick different tokens the default's top
    two were within that noise (from there on the contexts differ, so the sequence ends its
    comparison; session 22 on an H200 saw one such split in four sequences)."""
    from atlas_core.api import Registry
    from atlas_core.testing.checkpoints import write_tiny_checkpoint
    from atlas_core.testing.gpu import greedy_completions

    # every projection's K a multiple of 128, so each one takes the kernel
    path = write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path, registry=Registry(), seed=2,
                                 dtype="bfloat16", hidden_size=128, intermediate_size=256,
                                 head_dim=32)
    prompts = [rng.integers(0, 300, n).tolist() for n in (7, 12, 3, 20)]
    want = greedy_completions(path, "cuda", prompts)
    monkeypatch.setenv("ATLAS_CUDA_GEMM", "skinny")
    got = greedy_completions(path, "cuda", prompts)
    compared = 0
    for g, w in zip(got, want):
        for tg, tw, lg, lw in zip(g.token_ids, w.token_ids, g.logprobs, w.logprobs):
            if tg != tw:
                top = dict(lw.top)
                assert tg in top and top[tw] - top[tg] < 0.1, (tg, tw, lw.top)
                break
            np.testing.assert_allclose([v for _, v in lg.top], [v for _, v in lw.top], atol=0.1)
            compared += 1
    assert compared >= 2 * len(prompts)
