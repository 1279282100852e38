"""Choices of weight 0 cost nothing in ``moe_experts`` on the cuda backend (issue #26: expert
parallelism gives other ranks' experts weight 0 and id 0, so every rank ran all top-k choices).

Every path against the NumPy reference, for 1 / 3 / 8 / 32 / 130 tokens: moe_decode.cu's
per-pair GEMVs (one token: the wide down kernel; more: the 256-column loop) and moe.cu's grouped
GEMM, bf16 and f16; the quantized decode kernels (quant_moe_mma.cu, and quant_moe.cu under the
``legacy`` policy) and the quantized prefill (dequantized, then the bf16 kernels) for FP8 block,
FP8 channel and NVFP4. The routing is expert parallel: top-8 of 32 experts, the two ranks' 16
each, with the other rank's choices at id 0 (as ``moe_remap_ids`` writes them) or at random
local ids; the two ranks' outputs also sum to the whole model's. Then expert 0's weights are
NaN while no live choice names it: the result stays finite and right, which only holds if no
zero-weight choice reads expert 0 (NaN * 0 is NaN).
"""

from functools import lru_cache

import numpy as np
import pytest

from atlas_core.api import bfloat16, quantize
from atlas_core.api import reference as ref
from cuda_probe import rel_error

pytestmark = pytest.mark.gpu
#: Experts of the whole model, the rank count and each rank's share, top-k.
GLOBAL, RANKS, TOP_K = 32, 2, 8
LOCAL = GLOBAL // RANKS
BATCHES = (1, 3, 8, 32, 130)
#: bf16 / f16 expert paths, as test_moe_cuda.py.
TOL = 1.5e-2
#: Quantized paths, as test_quant_moe_mma_cuda.py (h is rounded to the activation dtype).
QTOL = 2e-2
FORMATS = ["fp8_block", "fp8_channel", "nvfp4"]


def _routing(t, rank, seed, dead_ids="zero", never=None):
    """Rank ``rank``'s view of a top-8 routing over GLOBAL experts: ``(weights, ids, full
    weights, full ids)``; a choice outside the rank's experts gets weight 0 and id 0 (``dead_ids``
    "zero", as moe_remap_ids) or a random local id ("random"). ``never``: a local expert no live
    choice names. Redrawn until the rank has live and zero-weight choices both."""
    rng = np.random.default_rng(seed)
    while True:
        logits = rng.standard_normal((t, GLOBAL)).astype(np.float32)
        if never is not None:
            logits[:, rank * LOCAL + never] = -1e4
        w, ids = ref.moe_route(logits, TOP_K, True)
        local = ids - rank * LOCAL
        inside = (local >= 0) & (local < LOCAL)
        if inside.any() and not inside.all():
            break
    dead = rng.integers(0, LOCAL, ids.shape) if dead_ids == "random" else 0
    return (np.where(inside, w, 0).astype(np.float32),
            np.where(inside, local, dead).astype(np.int32), w, ids)


def _expert(a, e):
    """Expert ``e`` of a stack (array or quantized) as a stack of one."""
    if isinstance(a, np.ndarray):
        return a[e:e + 1].astype(np.float32)
    pick = lambda s: None if s is None else np.asarray(s)[e:e + 1]  # noqa: E731
    return a.replace(data=a.data[e:e + 1], scale=pick(a.scale),
                     global_scale=pick(a.global_scale), shape=(1, *a.shape[1:]))


def _reference(x, gu, dn, w, ids, activation="silu"):
    """f32 ``moe_experts`` over the live (non-zero weight) choices only, expert by expert: a
    token's live choices name distinct experts (``ref.moe_experts`` adds a row that repeats in
    one expert's rows only once, and the zero-weight choices repeat id 0)."""
    out = np.zeros(x.shape, np.float32)
    xf = x.astype(np.float32)
    for e in np.unique(ids[w != 0]):
        rows, slots = np.nonzero((ids == e) & (w != 0))
        out[rows] += ref.moe_experts(xf[rows], _expert(gu, e), _expert(dn, e),
                                     w[rows, slots][:, None],
                                     np.zeros((len(rows), 1), np.int32), activation)
    return out


@lru_cache(maxsize=4)
def _dense(dtype, hidden, inter):
    """Whole-model expert stacks [GLOBAL, ...] in ``dtype`` (NaN-free, random)."""
    rng = np.random.default_rng(hidden + inter)
    gu = rng.standard_normal((GLOBAL, 2 * inter, hidden), np.float32) * hidden ** -0.5
    dn = rng.standard_normal((GLOBAL, hidden, inter), np.float32) * inter ** -0.5
    return gu.astype(dtype), dn.astype(dtype)


def _x(t, hidden, dtype, seed):
    return np.random.default_rng(seed).standard_normal((t, hidden)).astype(dtype)


def _run(be, x, gu, dn, w, ids, activation="silu"):
    be.reset_workspace()
    out = be.ops.moe_experts(be.from_host(x), gu, dn, be.from_host(w), be.from_host(ids),
                             activation)
    return be.to_host(out)


@pytest.mark.parametrize("mode", ["gemv", "grouped"])
@pytest.mark.parametrize("dtype", [bfloat16, np.float16])
@pytest.mark.parametrize("t", BATCHES)
@pytest.mark.parametrize("dead_ids", ["zero", "random"])
def test_zero_weight_choices(cuda_backend, use_policy, mode, dtype, t, dead_ids):
    """Each rank's output against the reference over its live choices; the two ranks' outputs
    sum to the whole model's."""
    use_policy(moe=mode)
    be = cuda_backend
    hidden, inter = 256, 128
    gu, dn = _dense(dtype, hidden, inter)
    x = _x(t, hidden, dtype, t)
    total = np.zeros((t, hidden), np.float32)
    for rank in range(RANKS):
        w, ids, w_all, ids_all = _routing(t, rank, 100 + t, dead_ids)
        part = slice(rank * LOCAL, (rank + 1) * LOCAL)
        got = _run(be, x, be.from_host(gu[part]), be.from_host(dn[part]), w, ids)
        assert rel_error(got, _reference(x, gu[part], dn[part], w, ids)) < TOL
        total += got.astype(np.float32)
    whole = ref.moe_experts(x.astype(np.float32), gu.astype(np.float32), dn.astype(np.float32),
                            w_all, ids_all)
    assert rel_error(total, whole) < TOL


@pytest.mark.parametrize("hidden,inter", [(512, 768), (512, 1288)])
def test_one_token_wider_experts(cuda_backend, use_policy, hidden, inter):
    """One token: moe_dec_down_w3 (all expert rows in flight) and, past 1,024 columns, the
    256-column loop, with gelu_tanh."""
    use_policy(moe="gemv")
    be = cuda_backend
    gu, dn = _dense(bfloat16, hidden, inter)
    x = _x(1, hidden, bfloat16, 7)
    for rank in range(RANKS):
        w, ids, _, _ = _routing(1, rank, 8)
        part = slice(rank * LOCAL, (rank + 1) * LOCAL)
        got = _run(be, x, be.from_host(gu[part]), be.from_host(dn[part]), w, ids, "gelu_tanh")
        assert rel_error(got, _reference(x, gu[part], dn[part], w, ids, "gelu_tanh")) < TOL


@pytest.mark.parametrize("mode", ["gemv", "grouped"])
@pytest.mark.parametrize("t", BATCHES)
def test_nan_expert_zero_is_never_read(cuda_backend, use_policy, mode, t):
    """Expert 0's gate_up and down rows all NaN, every choice naming it of weight 0 (rank 1's
    expert 0 never chosen, the other rank's choices at id 0): finite and right."""
    use_policy(moe=mode)
    be = cuda_backend
    hidden, inter = 256, 128
    gu, dn = (a[LOCAL:] for a in _dense(bfloat16, hidden, inter))
    x = _x(t, hidden, bfloat16, t + 1)
    w, ids, _, _ = _routing(t, 1, 200 + t, never=0)
    assert not w[ids == 0].any() and (ids == 0).any()
    gu_nan, dn_nan = gu.copy(), dn.copy()
    gu_nan[0], dn_nan[0] = np.nan, np.nan
    got = _run(be, x, be.from_host(gu_nan), be.from_host(dn_nan), w, ids)
    assert rel_error(got, _reference(x, gu, dn, w, ids)) < TOL  # rel_error asserts finite


@lru_cache(maxsize=1)
def _quantized(fmt, hidden, inter):
    """Rank 1's quantized expert stacks (host) [LOCAL, ...]."""
    gu, dn = _dense(np.float32, hidden, inter)
    return (quantize(gu[LOCAL:], fmt, dtype=bfloat16),
            quantize(dn[LOCAL:], fmt, dtype=bfloat16))


def _upload(be, q):
    """The device copy of a host quantized weight, as the loader makes it."""
    dev = {k: None if a is None else be.from_host(np.ascontiguousarray(a))
           for k, a in (("data", q.data), ("scale", np.asarray(q.scale)),
                        ("global_scale", q.global_scale))}
    return q.replace(**dev)


def _poison_expert_zero(q):
    """``q`` with expert 0's scales (FP8) or global scale (NVFP4) NaN: its every weight
    dequantizes to NaN."""
    if q.format == "nvfp4":
        gs = np.array(q.global_scale, np.float32)
        gs[0] = np.nan
        return q.replace(global_scale=gs)
    scale = np.array(q.scale, np.float32)
    scale[0] = np.nan
    return q.replace(scale=scale)


# Up to 8 tokens: quant_moe_mma.cu (auto) and quant_moe.cu (legacy); more: the prefill path.
QCASES = [(fmt, t, kernel) for fmt in FORMATS for t in BATCHES
          for kernel in (("auto", "legacy") if t <= 8 else ("auto",))]


@pytest.mark.parametrize("fmt,t,kernel", QCASES)
@pytest.mark.parametrize("poison", [False, True])
def test_quantized_zero_weight_choices(cuda_backend, use_policy, fmt, t, kernel, poison):
    """Rank 1's quantized experts with the other rank's choices at id 0; with ``poison``,
    expert 0 NaN and never chosen live."""
    use_policy(quant_kernel=kernel)
    be = cuda_backend
    hidden, inter = 256, 256  # whole 128-wide K steps: the tensor-core kernels take them
    gu, dn = _quantized(fmt, hidden, inter)
    x = _x(t, hidden, bfloat16, t + 2)
    w, ids, _, _ = _routing(t, 1, 300 + t, never=0 if poison else None)
    dev = [_upload(be, _poison_expert_zero(q) if poison else q) for q in (gu, dn)]
    got = _run(be, x, *dev, w, ids)
    assert rel_error(got, _reference(x, gu, dn, w, ids)) < QTOL
