"""Which tensor-core prefill kernel ``sliding_window_attention`` launches (no GPU needed: a
recording context): ``swa_fa`` by default where it fits the device's shared memory,
``swa_mma`` with ``ATLAS_GEMMA_PREFILL_ATTENTION=mma``, same grid and arguments, each with its own shared
memory; a bad value names the choices."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

gemma4_ops = pytest.importorskip("atlas_gemma4.cuda.gemma4_ops")


def _arr(shape, dtype="bfloat16"):
    from atlas_core.api import as_dtype
    dt = np.dtype(dtype) if dtype == "int32" else as_dtype(dtype)
    return SimpleNamespace(shape=tuple(shape), ptr=0, dtype=dt)


def _ops(monkeypatch, env, smem_optin=232448):
    if env is None:
        monkeypatch.delenv(gemma4_ops.PREFILL_ATTENTION_ENV, raising=False)
    else:
        monkeypatch.setenv(gemma4_ops.PREFILL_ATTENTION_ENV, env)
    launches = []
    kernels = SimpleNamespace(kernel=lambda module, var, name, shmem=0: (module, name, shmem))
    ctx = SimpleNamespace(
        kernels=kernels, capability=(9, 0), num_sms=132, pdl=True,
        fits_smem=lambda dynamic, static=0: dynamic + static <= smem_optin,
        policy=SimpleNamespace(attention="auto"), out=lambda shape, dtype: _arr(shape, dtype.name),
        launch=lambda kernel, grid, block, *args, shmem=0, **kw: launches.append(
            (kernel, grid, args, shmem)))
    return gemma4_ops.Gemma4CudaOps(ctx), launches


@pytest.mark.parametrize("d,heads,kv,want_z", [(512, 16, 2, 2), (256, 32, 16, 1)])
def test_prefill_takes_swa_fa_unless_asked_for_swa_mma(monkeypatch, d, heads, kv, want_z):
    q, cache = _arr((64, heads, d)), _arr((40, 16, kv, d))
    tables, lens, cu = _arr((1, 40), "int32"), _arr((1,), "int32"), _arr((2,), "int32")
    got = {}
    for env in (None, "fa", "mma"):
        ops, launches = _ops(monkeypatch, env)
        ops.sliding_window_attention(q, cache, cache, tables, lens, cu, 0.1, 0)
        (module, name, shmem), grid, args, launched_shmem = launches[-1]
        assert module == "gemma4_attention_mma" and shmem == launched_shmem
        got[env] = (name, grid, args[7:], shmem)
    hb = next(n for n in (16, 8, 4, 2, 1) if (heads // kv) % n == 0)
    assert got["mma"][0] == f"swa_mma_bf16_d{d}_h{hb}" and got["fa"][0] == f"swa_fa_bf16_d{d}_h{hb}"
    assert got[None] == got["fa"]
    assert got["mma"][1] == got["fa"][1] and got["fa"][1][2] == want_z
    assert got["mma"][2] == got["fa"][2]           # the same scalar arguments
    assert got["mma"][3] == gemma4_ops.mma_shmem(d) and got["fa"][3] == gemma4_ops.fa_shmem(d)


def test_a_gb10_keeps_swa_mma_where_swa_fa_does_not_fit(monkeypatch):
    """99 KB a block (DGX Spark): swa_fa at 256 fits exactly (101,376 bytes), at 512 not."""
    tables, lens, cu = _arr((1, 40), "int32"), _arr((1,), "int32"), _arr((2,), "int32")
    for d, kv, want in ((512, 2, "swa_mma"), (256, 16, "swa_fa")):
        ops, launches = _ops(monkeypatch, None, smem_optin=101376)
        ops.sliding_window_attention(_arr((64, 32, d)), _arr((40, 16, kv, d)),
                                     _arr((40, 16, kv, d)), tables, lens, cu, 0.1, 0)
        assert launches[-1][0][1].startswith(f"{want}_bf16_d{d}_")


def test_fa_shared_memory_fits_one_block_an_sm_at_512_and_two_at_256():
    # SwaFa::SMEM: 64 query rows, two stages of 32 keys' K rows and V column halves
    assert gemma4_ops.fa_shmem(512) == 2 * (64 * 520 + 64 * 520 + 64 * 264) == 166912
    assert gemma4_ops.fa_shmem(512) <= 227 << 10 and 2 * gemma4_ops.fa_shmem(256) <= 227 << 10


def test_a_bad_choice_names_the_allowed_ones(monkeypatch):
    monkeypatch.setenv(gemma4_ops.PREFILL_ATTENTION_ENV, "fast")
    with pytest.raises(ValueError, match="ATLAS_GEMMA_PREFILL_ATTENTION='fast': use 'auto' or "
                                         "'fa' or 'mma'"):
        gemma4_ops.prefill_attention()
