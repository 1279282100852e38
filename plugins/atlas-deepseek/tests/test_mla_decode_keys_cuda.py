"""On a CUDA GPU (marker ``gpu``, skipped without one): every tensor-core decode kernel of
absorbed MLA at Mistral-Small-4's 256 + 64 (``ATLAS_MLA_DECODE`` unset: ``keys2x2``,
``mla_decode_keys2.cu``'s warp pairs over the keys and the two warps of a pair over the output
columns as two 8-warp blocks of 32-key tiles an SM; ``keys2``: the same kernel as one 16-warp
block; ``keys1``:
``mla_decode_keys.cu``; ``v1``: ``mla_decode_mma.cu``) and the parallel ``mla_decode_combine``
behind them match the NumPy reference.

Cases: bf16 and f16; 16- and 64-token pages; heads 32 (one block), 8 / 24 (a partial or idle
m16 tile, so idle warps or pairs) and 40 (a second, partial head group); batches 1, 3 and 32;
contexts off the 16-key warp slices and 32 / 64-key tiles (1, 63, 65, 300, 4100), one split (a
table of <= 128 keys), many (4100 keys) and the 128- / 256-split caps with empty splits past the
end (20000 keys). The combine
alone also runs behind the SIMT split kernel at latents that are not whole 128-column chunks or
float4 columns (rank 130 and 300). The pair-split layouts reach the 16 warps an SM they were
built for (occupancy of their registers and planned shared memory)."""

from __future__ import annotations

import numpy as np
import pytest

from atlas_core.api import bfloat16
from atlas_core.testing.contracts_ops import assert_close, make_rng, randn
from atlas_core.testing.gpu import cuda_backend_or_skip
from atlas_deepseek.cuda.mla_decode_plan import decode_plan
from atlas_deepseek.mla_reference import mla_absorbed_attention

pytestmark = pytest.mark.gpu

#: context lengths per batch
LENS = ((1,), (63,), (65,), (300,), (4100,), (20000,), (1, 300, 4100), (65, 63, 1))
#: decode kernel variant: ATLAS_MLA_DECODE value and the kernel it selects at 256 + 64
VARIANTS = {"keys2x2": ("", "mla_decode_keys2x2_r256"),
            "keys2": ("keys2", "mla_decode_keys2_r256"),
            "keys1": ("keys1", "mla_decode_keys_r256"), "v1": ("v1", "mla_decode_mma_r256")}


@pytest.fixture(scope="module")
def cuda():
    return cuda_backend_or_skip()


def _tables(rng, lens, block_size: int) -> tuple[np.ndarray, int]:
    """Shuffled distinct pages per sequence, three more columns of out-of-range ids (more
    splits than the keys need, never read); returns the tables and the page count."""
    need = [-(-n // block_size) for n in lens]
    num_blocks = sum(need) + 5
    ids = rng.permutation(num_blocks)[:sum(need)]
    tables = np.full((len(lens), max(need) + 3), num_blocks + 7, np.int32)
    start = 0
    for b, n in enumerate(need):
        tables[b, :n] = ids[start:start + n]
        start += n
    return tables, num_blocks


def _check(cuda, case, heads, rank, rope, lens, dtype, block_size, kernel=None):
    rng = make_rng("mla_decode_keys", case, heads, rank, rope, lens, dtype, block_size)
    seq_lens = np.array(lens, np.int32)
    tables, num_blocks = _tables(rng, lens, block_size)
    cache = randn(rng, (num_blocks, block_size, 1, rank + rope), dtype)
    q_lat = randn(rng, (len(lens), heads, rank), dtype)
    q_pe = randn(rng, (len(lens), heads, rope), dtype)
    cu = np.arange(len(lens) + 1, dtype=np.int32)
    scale = (rank + rope) ** -0.5
    expected = mla_absorbed_attention(q_lat, q_pe, cache, tables, seq_lens, cu, scale)
    mla = cuda.ops.mla_absorbed_attention.__self__
    name = mla.decode_kernel(q_lat, q_pe)
    if kernel is not None and cuda.ctx.capability >= (9, 0):
        assert name.startswith(kernel), name
    dev = [cuda.from_host(a) for a in (q_lat, q_pe, cache, tables, seq_lens, cu)]
    out = cuda.to_host(cuda.ops.mla_absorbed_attention(*dev, scale))
    assert_close(out, expected, f"{name} {case}")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", ("bfloat16", "float16"), ids=("bf16", "f16"))
@pytest.mark.parametrize("block_size", (16, 64))
@pytest.mark.parametrize("lens", LENS, ids=lambda v: "-".join(map(str, v)))
def test_mistral_shape_matches_the_reference(cuda, monkeypatch, variant, dtype, block_size,
                                             lens):
    env, kernel = VARIANTS[variant]
    monkeypatch.setenv("ATLAS_MLA_DECODE", env)
    _check(cuda, variant, 32, 256, 64, lens, dtype, block_size, kernel)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("heads", (8, 24, 40))
@pytest.mark.parametrize("lens", ((17,), (4100,), (1, 300, 4100)),
                         ids=lambda v: "-".join(map(str, v)))
def test_head_counts_off_the_tile_match_the_reference(cuda, monkeypatch, variant, heads, lens):
    env, kernel = VARIANTS[variant]
    monkeypatch.setenv("ATLAS_MLA_DECODE", env)
    _check(cuda, variant, heads, 256, 64, lens, "bfloat16", 16, kernel)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", ("bfloat16", "float16"), ids=("bf16", "f16"))
def test_batch_32_matches_the_reference(cuda, monkeypatch, variant, dtype):
    env, kernel = VARIANTS[variant]
    monkeypatch.setenv("ATLAS_MLA_DECODE", env)
    lens = tuple(int(n) for n in make_rng("batch32").integers(1, 1500, 32))
    _check(cuda, variant, 32, 256, 64, lens, dtype, 16, kernel)


@pytest.mark.parametrize("dtype", ("bfloat16", "float16"), ids=("bf16", "f16"))
@pytest.mark.parametrize("shape", ((4, 130, 14), (3, 300, 20)),
                         ids=lambda s: f"h{s[0]}-r{s[1]}+{s[2]}")
@pytest.mark.parametrize("lens", ((5,), (4100,), (1, 300, 4100)),
                         ids=lambda v: "-".join(map(str, v)))
def test_combine_of_partial_column_chunks(cuda, dtype, shape, lens):
    heads, rank, rope = shape
    _check(cuda, "split", heads, rank, rope, lens, dtype, 16, "mla_decode_split")


@pytest.mark.parametrize("choice", ("keys2", "keys2x2"))
def test_pair_split_layouts_hold_16_warps_an_sm(cuda, choice):
    mla = cuda.ops.mla_absorbed_attention.__self__
    plan = decode_plan(256, 64, mla._smem_optin(), choice)
    if plan is None or cuda.ctx.capability < (9, 0):
        pytest.skip("the layout is sized for sm_90's shared memory")
    config = plan.config
    kernel = cuda.ctx.kernel(config.module, bfloat16, f"{config.kernel}_r256",
                             max_shmem=plan.shmem)
    blocks = kernel.occupancy.max_active_blocks_per_multiprocessor(32 * config.warps, plan.shmem)
    assert blocks == config.blocks_per_sm, (config.kernel, plan)
