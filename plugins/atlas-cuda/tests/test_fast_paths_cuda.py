"""The fast paths against the NumPy references and against the kernels they replace: cuBLASLt
vs the mma.sync GEMM (M > 8), the tensor-core flash attention vs the CUDA-core kernel (causal
and bidirectional), fp8 KV."""

import numpy as np
import pytest

from atlas_core.api import reference as ref
from atlas_core.api import bfloat16, float8_e4m3fn
from cuda_probe import device_rel_error as rel

pytestmark = pytest.mark.gpu
rng = np.random.default_rng(1)


def rand(*shape, dtype=bfloat16, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


@pytest.mark.parametrize("path", ["cublaslt", "mma"])
@pytest.mark.parametrize("m,n,k,bias", [(9, 768, 1024, False), (32, 4096, 512, True),
                                        (300, 1536, 2048, False), (4096, 256, 128, False)])
def test_large_m_linear(cuda_backend, path, m, n, k, bias):
    be, ctx = cuda_backend, cuda_backend.ctx
    lt = ctx.cublaslt()
    if path == "cublaslt" and lt is None:
        pytest.skip("nvmath-python / cuBLASLt not available")
    x, w = rand(m, k), rand(n, k, scale=k ** -0.5)
    b = rand(n) if bias else None
    saved, ctx._lt = ctx._lt, (lt if path == "cublaslt" else False)
    try:
        y = be.ops.linear(be.from_host(x), be.from_host(w), be.from_host(b) if bias else None)
    finally:
        ctx._lt = saved
    assert rel(be, y, ref.linear(x, w, b)) < 1e-2


@pytest.mark.parametrize("m,n,k,bias", [(8, 4096, 4096, False), (16, 3072, 1024, True),
                                        (2, 12288, 4096, False)])
def test_tuned_cublaslt_linear(cuda_backend, use_policy, m, n, k, bias):
    """Policy gemm_tune: a graph's eager probe call times the candidates and the captured
    graph replays the winner, which computes the same product; a served eager call of another
    shape is not tuned."""
    be, ctx = cuda_backend, cuda_backend.ctx
    lt = ctx.cublaslt()
    if lt is None:
        pytest.skip("nvmath-python / cuBLASLt not available")
    use_policy(gemm_tune="1", gemv_rows="1")
    x, w = rand(m, k), rand(n, k, scale=k ** -0.5)
    b = rand(n) if bias else None
    dev = [be.from_host(a) for a in (x, w)] + [be.from_host(b) if bias else None]
    graph = be.capture(lambda: be.ops.linear(*dev))
    assert any(key[:3] == (m, n, k) for key in lt.tuned)
    graph.replay()
    assert rel(be, graph.output, ref.linear(x, w, b)) < 1e-2
    y = be.ops.linear(be.from_host(x[:m - 1]), *dev[1:])
    assert rel(be, y, ref.linear(x[:m - 1], w, b)) < 1e-2
    assert not any(key[:3] == (m - 1, n, k) for key in lt.tuned)


@pytest.mark.parametrize("mode", ["flash", "simt"])
@pytest.mark.parametrize("h,kh,d", [(8, 2, 128), (4, 4, 64), (32, 8, 128)])
def test_multi_token_attention(cuda_backend, use_policy, mode, h, kh, d):
    use_policy(attention=mode)
    be = cuda_backend
    lens = [1, 70, 130, 64, 5]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    t = int(cu[-1])
    q, k, v = rand(t, h, d), rand(t, kh, d), rand(t, kh, d)
    got = be.ops.prefill_attention(*(be.from_host(a) for a in (q, k, v, cu)), d ** -0.5)
    assert rel(be, got, ref.prefill_attention(q, k, v, cu, d ** -0.5)) < 2e-2
    seq_lens, nq = [100, 300, 7], [60, 130, 7]          # cached prefixes + a fresh prompt
    nb = sum(-(-s // 16) for s in seq_lens) + 4
    kc, vc = rand(nb, 16, kh, d), rand(nb, 16, kh, d)
    tables = np.full((3, 24), -1, np.int32)
    perm, at = rng.permutation(nb), 0
    for i, s in enumerate(seq_lens):
        tables[i, :-(-s // 16)] = perm[at:at - (-s // 16)]
        at -= -s // 16
    cuq = np.concatenate([[0], np.cumsum(nq)]).astype(np.int32)
    q = rand(int(cuq[-1]), h, d)
    sl = np.array(seq_lens, np.int32)
    got = be.ops.paged_attention(*(be.from_host(a) for a in (q, kc, vc, tables, sl, cuq)),
                                 d ** -0.5)
    assert rel(be, got, ref.paged_attention(q, kc, vc, tables, sl, cuq, d ** -0.5)) < 2e-2


@pytest.mark.parametrize("mode", ["flash", "simt"])
@pytest.mark.parametrize("dtype", [bfloat16, np.float16])
@pytest.mark.parametrize("h,kh,d", [(16, 16, 80), (8, 2, 128), (4, 4, 64)])
def test_bidirectional_prefill_attention(cuda_backend, use_policy, mode, dtype, h, kh, d):
    """``causal=False`` (vision towers): the flash kernel (always at head dim 80, which the
    CUDA-core kernel lacks) and the CUDA-core one, sequences within and across 64-row tiles."""
    use_policy(attention=mode)
    be = cuda_backend
    lens = [1, 70, 130, 64, 5, 1024]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    t = int(cu[-1])
    q, k, v = rand(t, h, d, dtype=dtype), rand(t, kh, d, dtype=dtype), rand(t, kh, d, dtype=dtype)
    got = be.ops.prefill_attention(*(be.from_host(a) for a in (q, k, v, cu)), d ** -0.5,
                                   causal=False)
    assert rel(be, got, ref.prefill_attention(q, k, v, cu, d ** -0.5, causal=False)) < 2e-2


def test_fp8_cache_roundtrip(cuda_backend):
    be = cuda_backend
    k = rand(40, 8, 128)
    kc = be.from_host(np.full((4, 16, 8, 128), np.nan, float8_e4m3fn))
    vc = be.from_host(np.full((4, 16, 8, 128), np.nan, float8_e4m3fn))
    slots = np.arange(40, dtype=np.int32)
    be.ops.reshape_and_cache(be.from_host(k), be.from_host(k), kc, vc, be.from_host(slots), 0.5)
    want = (k.astype(np.float32) / 0.5).astype(float8_e4m3fn).astype(np.float32)
    got = be.to_host(kc).reshape(64, 8, 128)[:40].astype(np.float32)
    assert np.array_equal(got, want)
