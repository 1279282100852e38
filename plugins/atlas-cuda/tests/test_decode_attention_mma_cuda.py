"""The tensor-core decode kernel (attention_decode_mma.cu, policy ``decode_plan=mma``) against
the NumPy reference: GQA groups of 2-32 query heads (32: two 16-row chunks), head dims 64 / 128 /
256 and 512 (Gemma-4's full layers: the kernel's own 32-key tile), bf16 and f16, contexts crossing KV blocks, 64-key tiles and splits, several query tokens a
sequence (speculative verify rows), graph replay with changing lengths, the 512-wide kernel with
the partials merged by a kernel of their own (policy ``decode_merge=kernel``); and that ``auto`` picks it
for long caches and keeps the CUDA-core kernel for short ones and fp8 caches."""

import numpy as np
import pytest

from atlas_core.api import reference as ref
from atlas_core.api import bfloat16, float8_e4m3fn

from cuda_probe import HAS_GPU, device_rel_error

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="no CUDA device")]
rng = np.random.default_rng(11)
BS = 16


def paged(batch, h, kh, d, max_ctx, dtype=bfloat16, n_q=1):
    width = -(-max_ctx // BS)
    blocks = batch * width + 4
    kc = rng.standard_normal((blocks, BS, kh, d)).astype(dtype)
    vc = rng.standard_normal((blocks, BS, kh, d)).astype(dtype)
    tables = rng.permutation(blocks)[:batch * width].reshape(batch, width).astype(np.int32)
    q = rng.standard_normal((batch * n_q, h, d)).astype(dtype)
    cu = (np.arange(batch + 1) * n_q).astype(np.int32)
    return q, kc, vc, tables, cu


def run(be, arrays, d, kv_scale=1.0):
    dev = [be.from_host(a) for a in arrays]
    if d == 512:  # decodes through window_decode only (Gemma-4's full layers: window 0)
        from atlas_cuda.ops_attention import AttentionOps
        return be.ctx.bind(AttentionOps).window_decode(*dev, d ** -0.5, 0)
    return be.ops.paged_attention(*dev, d ** -0.5, kv_scale=kv_scale)


@pytest.mark.parametrize("h,kh,d", [(32, 8, 128), (32, 4, 128), (16, 2, 256), (16, 8, 64),
                                    (32, 2, 128), (64, 2, 64), (16, 1, 128), (8, 4, 256),
                                    (16, 2, 512), (32, 4, 512), (8, 4, 512), (64, 2, 512),
                                    (48, 8, 128), (40, 8, 128), (28, 4, 128), (12, 4, 128)])
@pytest.mark.parametrize("lens", [[1], [17], [64], [65], [4100], [300, 1, 63, 4097, 128, 15, 16, 2049]])
def test_mma_decode_matches_reference(cuda_backend, use_policy, h, kh, d, lens):
    use_policy(decode_plan="mma")
    be = cuda_backend
    sl = np.array(lens, np.int32)
    q, kc, vc, bt, cu = paged(len(lens), h, kh, d, max(lens))
    got = run(be, (q, kc, vc, bt, sl, cu), d)
    want = ref.paged_attention(q, kc, vc, bt, sl, cu, d ** -0.5)
    assert device_rel_error(be, got, want, check_shape=False) < 1e-2
    assert be.kernels.last_module == "attention_decode_mma"


@pytest.mark.parametrize("dtype", [np.float16, bfloat16])
def test_mma_decode_f16_and_bf16(cuda_backend, use_policy, dtype):
    use_policy(decode_plan="mma")
    be = cuda_backend
    sl = np.array([5000, 77, 1], np.int32)
    q, kc, vc, bt, cu = paged(3, 32, 8, 128, 5000, dtype)
    got = run(be, (q, kc, vc, bt, sl, cu), 128)
    assert device_rel_error(be, got, ref.paged_attention(q, kc, vc, bt, sl, cu, 128 ** -0.5),
                            check_shape=False) < 1e-2


@pytest.mark.parametrize("hb,splits", [(2, 1), (4, 3), (8, 33), (8, 1), (16, 7)])
def test_mma_decode_512_under_every_head_chunk_and_split(cuda_backend, use_policy, monkeypatch,
                                                        hb, splits):
    """Head dim 512 under forced plans (the plan picks 2-16 heads a block by the SMs it fills):
    partial tiles, empty trailing splits, the in-kernel combine, and a windowed query."""
    from atlas_cuda import ops_attention
    use_policy(decode_plan="mma")
    monkeypatch.setattr(ops_attention, "mma_decode_plan", lambda *a: (hb, splits))
    be = cuda_backend
    sl = np.array([3001, 40, 1, 700], np.int32)
    q, kc, vc, bt, cu = paged(4, 32, 2, 512, 3001)
    got = run(be, (q, kc, vc, bt, sl, cu), 512)
    assert be.kernels.last_module == "attention_decode_mma"
    assert device_rel_error(be, got, ref.paged_attention(q, kc, vc, bt, sl, cu, 512 ** -0.5),
                            check_shape=False) < 1e-2


@pytest.mark.parametrize("h,kh,d", [(16, 2, 512), (32, 4, 512), (8, 4, 512), (64, 2, 512),
                                    (16, 2, 128), (32, 4, 128), (48, 8, 128), (16, 2, 256),
                                    (16, 8, 64)])
@pytest.mark.parametrize("lens", [[1], [17], [4100], [3001, 40, 1, 700], [33] * 9])
def test_mma_decode_with_the_merge_kernel(cuda_backend, use_policy, h, kh, d, lens):
    """Policy ``decode_merge=kernel``: the split kernel without its in-block merge, the whole
    group a block (two 16-row chunks at 32), a wave of splits, then ``attn_dec_merge_*`` (a
    token with one active split is the split kernel's own output)."""
    use_policy(decode_plan="mma", decode_merge="kernel")
    be = cuda_backend
    sl = np.array(lens, np.int32)
    q, kc, vc, bt, cu = paged(len(lens), h, kh, d, max(lens))
    got = run(be, (q, kc, vc, bt, sl, cu), d)
    assert be.kernels.last_module == "attention_decode_mma"
    assert device_rel_error(be, got, ref.paged_attention(q, kc, vc, bt, sl, cu, d ** -0.5),
                            check_shape=False) < 1e-2


def test_mma_decode_512_merge_kernel_replays_with_changing_lengths(cuda_backend, use_policy):
    """In a graph (as decode runs it): the split count stays the captured one, the lengths
    change between replays, and both kernels recompute each token's active splits."""
    use_policy(decode_plan="mma", decode_merge="kernel")
    be = cuda_backend
    q, kc, vc, bt, cu = paged(2, 16, 2, 512, 5000)
    dev = [be.from_host(a) for a in (q, kc, vc, bt)]
    sl_dev, cu_dev = be.from_host(np.array([5000, 5000], np.int32)), be.from_host(cu)
    from atlas_cuda.ops_attention import AttentionOps
    ops = be.ctx.bind(AttentionOps)
    graph = be.capture(lambda: ops.window_decode(*dev, sl_dev, cu_dev, 512 ** -0.5, 0))
    for lens in ([5000, 5000], [33, 4097], [1, 2500]):
        sl = np.array(lens, np.int32)
        be.copy_from_host(sl_dev, sl)
        for _ in range(2):
            graph.replay()
        want = ref.paged_attention(q, kc, vc, bt, sl, cu, 512 ** -0.5)
        assert device_rel_error(be, graph.output, want, check_shape=False) < 1e-2, lens


@pytest.mark.parametrize("n_q", [2, 3, 4])
def test_mma_decode_several_queries_a_sequence(cuda_backend, use_policy, n_q):
    """Verify rows: query i of a sequence sees keys up to seq_len - n_q + i."""
    use_policy(decode_plan="mma")
    be = cuda_backend
    sl = np.array([4200, n_q, 300], np.int32)
    q, kc, vc, bt, cu = paged(3, 32, 4, 128, 4200, n_q=n_q)
    got = run(be, (q, kc, vc, bt, sl, cu), 128)
    assert device_rel_error(be, got, ref.paged_attention(q, kc, vc, bt, sl, cu, 128 ** -0.5),
                            check_shape=False) < 1e-2


def test_mma_decode_graph_replay_with_changing_lengths(cuda_backend, use_policy):
    use_policy(decode_plan="mma")
    be = cuda_backend
    batch, h, kh, d = 4, 32, 8, 128
    q, kc, vc, bt, cu = paged(batch, h, kh, d, 8192)
    dev = [be.from_host(a) for a in (q, kc, vc, bt)]
    sl = be.from_host(np.ones(batch, np.int32))
    dcu = be.from_host(cu)
    graph = be.capture(lambda: be.ops.paged_attention(*dev, sl, dcu, d ** -0.5))
    for top in (1, 17, 130, 8192, 999, 2, 6000):
        lens = np.maximum(top - np.arange(batch) * 7, 1).astype(np.int32)
        be.copy_from_host(sl, lens)
        for _ in range(2):
            graph.replay()
        want = ref.paged_attention(q, kc, vc, bt, lens, cu, d ** -0.5)
        assert device_rel_error(be, graph.output, want, check_shape=False) < 1e-2, lens


def test_auto_takes_mma_for_long_caches_only(cuda_backend, use_policy):
    use_policy(decode_plan="auto")
    be = cuda_backend
    sl = np.array([100, 7], np.int32)
    for max_ctx, module in ((512, "attention_decode"), (528, "attention_decode_mma")):
        q, kc, vc, bt, cu = paged(2, 32, 8, 128, max_ctx)
        got = run(be, (q, kc, vc, bt, sl, cu), 128)
        assert be.kernels.last_module == module
        assert device_rel_error(be, got, ref.paged_attention(q, kc, vc, bt, sl, cu, 128 ** -0.5),
                                check_shape=False) < 1e-2
    q, kc, vc, bt, cu = paged(2, 32, 8, 128, 8192, float8_e4m3fn)
    q = q.astype(np.float32).astype(bfloat16)  # bf16 queries over an fp8 cache
    run(be, (q, kc, vc, bt, sl, cu), 128, kv_scale=0.5)
    assert be.kernels.last_module == "attention_decode"  # fp8 caches stay on CUDA cores
    # one query token too (the batch-1 limit is rope_cache_attention's, whose fused-rope
    # kernel the tensor-core one stands against there: AttentionOps._use_mma_decode)
    for max_ctx, module in ((512, "attention_decode"), (528, "attention_decode_mma")):
        q, kc, vc, bt, cu = paged(1, 32, 8, 128, max_ctx)
        run(be, (q, kc, vc, bt, sl[:1], cu), 128)
        assert be.kernels.last_module == module


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_rope_cache_attention_on_long_caches(cuda_backend, use_policy, batch):
    """Long caches: rope + cache write, then the mma kernel (it has no rope prologue); equal to
    the reference composition, new K/V written."""
    from test_decode_attention_cuda import rope_case, run_rope

    use_policy(decode_plan="auto")
    be = cuda_backend
    args, kw = rope_case(batch, 32, 8, 128, 6000)
    want_k, want_v = args[3].copy(), args[4].copy()
    want = ref.rope_cache_attention(*args[:3], want_k, want_v, *args[5:], 128 ** -0.5, 1.0, **kw)
    got, dk, dv = run_rope(be, args, kw)
    # one token: the fused rope + CUDA-core kernel below 16,384 tokens of cache
    assert be.kernels.last_module == ("attention_rope_decode" if batch == 1
                                      else "attention_decode_mma")
    assert device_rel_error(be, got, want, check_shape=False) < 2e-2
    assert device_rel_error(be, dk, want_k, check_shape=False) < 2e-2
    assert device_rel_error(be, dv, want_v, check_shape=False) < 2e-2
