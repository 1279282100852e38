"""On a CUDA GPU (marker ``gpu``, skipped without one): the tensor-core decode kernels of
absorbed MLA (at 256 + 64 the one ``ATLAS_MLA_DECODE`` picks, by default ``mla_decode_keys2.cu``'s keys2x2 layout;
else ``mla_decode_mma.cu``) and their SIMT fallback (policy ``attention=simt``) match the NumPy
reference at the real latent shapes (DeepSeek-V3 512 + 64 with 128 heads and a partial head
group of 16; Mistral-Small-4 256 + 64 with 32 and 8 heads), bf16, batches 1 / 3 / 8, contexts
crossing 16-key blocks, 32 / 64-key tiles and context splits (1, 15, 17, 300, 4100), shuffled
pages and block tables wider than the context (empty splits, out-of-range ids past the end)."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from atlas_core.api import bfloat16
from atlas_core.testing.contracts_ops import (BLOCK_SIZE, assert_close, make_block_tables,
                                              make_rng, randn)
from atlas_core.testing.gpu import cuda_backend_or_skip
from atlas_deepseek.cuda.mla_decode_plan import KEYS2_DECODE_CONFIGS
from atlas_deepseek.mla_reference import mla_absorbed_attention

pytestmark = pytest.mark.gpu

#: (heads, kv_lora_rank, rope dim)
SHAPES = ((128, 512, 64), (16, 512, 64), (32, 256, 64), (8, 256, 64))
#: context lengths per batch: every length alone, then mixed batches of 3 and 8.
LENS = ((1,), (15,), (17,), (300,), (4100,), (1, 300, 4100), (17, 15, 1),
        (1, 15, 17, 300, 4100, 16, 33, 2049))


@pytest.fixture(scope="module")
def cuda():
    return cuda_backend_or_skip()


def _mla(cuda):
    return cuda.ops.mla_absorbed_attention.__self__


def _run(cuda, q_lat, q_pe, cache, tables, lens, scale):
    dev = [cuda.from_host(a) for a in (q_lat, q_pe, cache, tables, lens,
                                       np.arange(len(lens) + 1, dtype=np.int32))]
    out = cuda.ops.mla_absorbed_attention(*dev, scale)
    return cuda.to_host(out)


@pytest.mark.parametrize("lens", LENS, ids=lambda v: "-".join(map(str, v)))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"h{s[0]}-r{s[1]}+{s[2]}")
def test_decode_kernels_match_the_reference(cuda, shape, lens):
    heads, rank, rope = shape
    rng = make_rng("mla_decode_mma", shape, lens)
    seq_lens = np.array(lens, np.int32)
    num_blocks = sum(-(-n // BLOCK_SIZE) for n in lens) + 5
    tables = make_block_tables(rng, seq_lens, num_blocks)
    # Three more columns of out-of-range ids: more splits than keys need, never read.
    tables = np.pad(tables, ((0, 0), (0, 3)), constant_values=num_blocks + 7)
    cache = randn(rng, (num_blocks, BLOCK_SIZE, 1, rank + rope), bfloat16)
    q_lat = randn(rng, (len(lens), heads, rank), bfloat16)
    q_pe = randn(rng, (len(lens), heads, rope), bfloat16)
    scale = (rank + rope) ** -0.5
    expected = mla_absorbed_attention(q_lat, q_pe, cache, tables, seq_lens,
                                      np.arange(len(lens) + 1, dtype=np.int32), scale)
    mla, policy = _mla(cuda), cuda.ctx.policy
    kernel = mla.decode_kernel(q_lat, q_pe)
    if cuda.ctx.capability >= (9, 0):
        choice = os.environ.get("ATLAS_MLA_DECODE", "") or "keys2x2"
        want = {"keys1": "keys", "v1": "mma"}.get(choice, choice)
        if (rank, rope) not in KEYS2_DECODE_CONFIGS:
            want = "mma"
        assert kernel.startswith(f"mla_decode_{want}_r{rank}"), kernel
    out = _run(cuda, q_lat, q_pe, cache, tables, seq_lens, scale)
    assert_close(out, expected, kernel)
    cuda.ctx.set_policy(dataclasses.replace(policy, attention="simt"))
    try:
        assert mla.decode_kernel(q_lat, q_pe) == "mla_decode_split"
        out = _run(cuda, q_lat, q_pe, cache, tables, seq_lens, scale)
    finally:
        cuda.ctx.set_policy(policy)
    assert_close(out, expected, "mla_decode_split")
