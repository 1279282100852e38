"""The MoE expert paths on the GPU (per-pair GEMV and grouped tensor-core GEMM) against the
NumPy reference, plus the device random fill used by random-weight benches."""

import functools

import numpy as np
import pytest

from atlas_core.api import reference as ref
from atlas_core.api import bfloat16

pytestmark = pytest.mark.gpu


def _case(seed, t, e, k, hidden, inter, dtype, skew=False):
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((t, e)).astype(np.float32)
    if skew:  # every token's top expert is 0: one expert spans many row tiles
        logits[:, 0] += 10.0
    w, ids = ref.moe_route(logits, k, True)
    x = rng.standard_normal((t, hidden)).astype(dtype)
    gu = (rng.standard_normal((e, 2 * inter, hidden)) * hidden ** -0.5).astype(dtype)
    dn = (rng.standard_normal((e, hidden, inter)) * inter ** -0.5).astype(dtype)
    return x, gu, dn, w, ids


def _rel_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.all(np.isfinite(got))
    return np.linalg.norm(got - want) / np.linalg.norm(want)


@pytest.mark.parametrize("mode", ["grouped", "gemv"])
@pytest.mark.parametrize("dtype", [bfloat16, np.float16])
@pytest.mark.parametrize("t,e,k,hidden,inter,skew", [
    (1, 8, 2, 128, 48, False), (5, 8, 2, 256, 96, False), (40, 64, 8, 256, 96, False),
    (300, 16, 4, 512, 136, False), (300, 16, 2, 128, 64, True), (2100, 128, 8, 256, 64, False)])
def test_moe_experts_paths(cuda_backend, use_policy, mode, dtype, t, e, k, hidden, inter, skew):
    use_policy(moe=mode)
    be = cuda_backend
    x, gu, dn, w, ids = _case(t * e + k, t, e, k, hidden, inter, dtype, skew)
    for activation in ("silu", "gelu_tanh"):
        be.reset_workspace()
        out = be.ops.moe_experts(be.from_host(x), be.from_host(gu), be.from_host(dn),
                                 be.from_host(w), be.from_host(ids), activation)
        want = ref.moe_experts(x.astype(np.float32), gu.astype(np.float32),
                               dn.astype(np.float32), w, ids, activation)
        assert _rel_err(be.to_host(out), want) < 1.5e-2


def test_grouped_path_replays_in_a_graph(cuda_backend, use_policy):
    # Sizes are static per token count: a captured step must follow new routing on replay.
    use_policy(moe="grouped")
    be = cuda_backend
    t, e, k, hidden, inter = 32, 64, 8, 256, 64
    x, gu, dn, w, ids = _case(1, t, e, k, hidden, inter, bfloat16)
    dx, dgu, ddn, dw, dids = (be.from_host(a) for a in (x, gu, dn, w, ids))
    graph = be.capture(lambda: be.ops.moe_experts(dx, dgu, ddn, dw, dids))
    for seed in (2, 3):
        x2, _, _, w2, ids2 = _case(seed, t, e, k, hidden, inter, bfloat16)
        be.copy_from_host(dx, x2)
        be.copy_from_host(dw, w2)
        be.copy_from_host(dids, ids2)
        graph.replay()
        want = ref.moe_experts(x2, gu, dn, w2, ids2)
        assert _rel_err(be.to_host(graph.output), want.astype(np.float32)) < 1.5e-2


@pytest.mark.parametrize("dtype", [bfloat16, np.float16, np.float32])
def test_fill_random_on_device(cuda_backend, dtype):
    be = cuda_backend
    a, b = be.empty((1000, 333), dtype), be.empty((1000, 333), dtype)
    be.fill_random(a, 11, 0.25, 1.0)
    be.fill_random(b, 11, 0.25, 1.0)
    host = be.to_host(a).astype(np.float64)
    assert np.array_equal(host, be.to_host(b).astype(np.float64))
    assert abs(host.mean() - 1.0) < 0.01 and abs(host.std() - 0.25) < 0.01
    assert np.all(np.abs(host - 1.0) <= 0.25 * 3 ** 0.5 + 1e-2)
    be.fill_random(b, 12, 0.25, 1.0)
    assert not np.array_equal(host, be.to_host(b).astype(np.float64))


def test_backend_steps_from_another_thread(cuda_backend):
    # Regression: `atlas serve` steps the engine on its own thread, where no CUDA context was
    # current (CUDA_ERROR_INVALID_CONTEXT on the first request).
    import threading
    be, box = cuda_backend, {}
    a = np.arange(64, dtype=np.float32)

    def step():
        try:
            be.reset_workspace()
            box["out"] = be.to_host(be.ops.add(be.from_host(a), be.from_host(a)))
        except Exception as exc:  # noqa: BLE001 - reported below
            box["err"] = exc

    t = threading.Thread(target=step)
    t.start()
    t.join()
    assert "err" not in box, box.get("err")
    np.testing.assert_array_equal(box["out"], 2 * a)


@functools.lru_cache(maxsize=4)
def _block_case(seed, t, e, k, hidden, inter, shared, dtype):
    """Inputs of one moe_block case (cached: every path of a case gets the same arrays)."""
    from atlas_core.testing.contracts_core_cases import separated_router
    rng = np.random.default_rng(seed)
    x, router = separated_router(rng, "float32", t, hidden, e, k)
    arrays = {"x": x, "router_weight": router,
              "w_gate_up": rng.standard_normal((e, 2 * inter, hidden), np.float32) * hidden ** -0.5,
              "w_down": rng.standard_normal((e, hidden, inter), np.float32) * inter ** -0.5}
    if shared:
        arrays.update(shared_gate_up=rng.standard_normal((2 * shared, hidden)) * hidden ** -0.5,
                      shared_down=rng.standard_normal((hidden, shared)) * shared ** -0.5,
                      shared_gate=rng.standard_normal((1, hidden)) * hidden ** -0.5)
    return {name: a.astype(dtype) for name, a in arrays.items()}


def _moe_ops(be):
    """The backend's MoE op object (its call count and counter slots)."""
    from atlas_cuda.ops_moe import MoeOps
    return be.ctx.bind(MoeOps)



@pytest.mark.parametrize("down", ["auto", "wide", "plain", "rows"])
@pytest.mark.parametrize("dtype", [bfloat16, np.float16])
@pytest.mark.parametrize("e,k,hidden,inter", [
    (16, 8, 2816, 704),   # gemma-4-26b-a4b's widths: auto takes plain (1.33 waves wide)
    (16, 8, 2048, 768),   # qwen3-30b-a3b's: auto takes wide
    (16, 8, 3072, 1536),  # minimax-m2's: more than 4 chunks, never wide
    (8, 2, 136, 48),      # hidden not a multiple of a rows block's 16 rows, I under one chunk
    (8, 3, 128, 264)])    # I past one 256-column chunk by 8
def test_one_token_down_kernels(cuda_backend, use_policy, down, dtype, e, k, hidden, inter):
    """moe_decode.cu's one-token down kernels (policy moe_down) against the reference, eager
    and replayed in a graph."""
    use_policy(moe="gemv", moe_down=down)
    be = cuda_backend
    x, gu, dn, w, ids = _case(e + k + inter, 1, e, k, hidden, inter, dtype)
    want = ref.moe_experts(x.astype(np.float32), gu.astype(np.float32), dn.astype(np.float32),
                           w, ids, "gelu_tanh")
    dev = [be.from_host(a) for a in (x, gu, dn, w, ids)]
    be.reset_workspace()
    eager = be.to_host(be.ops.moe_experts(*dev, "gelu_tanh"))
    assert _rel_err(eager, want) < 1.5e-2
    from atlas_cuda.ops_moe_decode import MoeDecodeOps
    name = be.ctx.bind(MoeDecodeOps).down_kernel(1, k, inter, hidden,
                                                  "bf16" if dtype == bfloat16 else "f16")
    # auto takes rows wherever it applies (every case here: two-byte dtypes, I a multiple of 8)
    assert ("rows" in name) == (down in ("rows", "auto"))
    graph = be.capture(lambda: be.ops.moe_experts(*dev, "gelu_tanh"))
    graph.replay()
    np.testing.assert_array_equal(be.to_host(graph.output), eager)


@pytest.mark.parametrize("down", ["auto", "plain", "rows"])
def test_one_token_down_kernels_with_a_shared_expert(cuda_backend, use_policy, down):
    """The down kernels' shared-expert part (the gated MoE block's experts after its router:
    h of the chosen experts and hs of the shared one), against the reference in float32."""
    from atlas_cuda.ops_moe_decode import MoeDecodeOps
    use_policy(moe_down=down)
    be = cuda_backend
    e, k, hidden, inter, s_inter = 16, 8, 2048, 512, 512
    x, gu, dn, w, ids = _case(7, 1, e, k, hidden, inter, bfloat16)
    rng = np.random.default_rng(8)
    sgu = (rng.standard_normal((2 * s_inter, hidden)) * hidden ** -0.5).astype(bfloat16)
    sdn = (rng.standard_normal((hidden, s_inter)) * s_inter ** -0.5).astype(bfloat16)
    f32 = [a.astype(np.float32) for a in (x, gu, dn, sgu, sdn)]
    want = ref.moe_experts(f32[0], f32[1], f32[2], w, ids, "silu") + ref.linear(
        ref.act_and_mul(ref.linear(f32[0], f32[3]), "silu"), f32[4])
    be.reset_workspace()
    out = be.ctx.bind(MoeDecodeOps).experts(
        *(be.from_host(a) for a in (x, gu, dn, w, ids, sgu, sdn)), None, 0)
    assert _rel_err(be.to_host(out), want) < 1.5e-2

# One token runs moe_block.cu (its experts as moe_experts1.cu's one kernel where the expert
# widths are at most 1,024, else mb_gate_up + mb_down); 2 to 8 tokens moe_decode.cu's kernels.
@pytest.mark.parametrize("fused", ["1", "0"])
@pytest.mark.parametrize("dtype", [bfloat16, np.float16])
@pytest.mark.parametrize("t,e,k,hidden,inter,shared,scoring", [
    (1, 16, 8, 2048, 768, 0, "softmax"), (1, 16, 8, 2048, 512, 512, "softmax"),
    (5, 256, 8, 256, 64, 64, "softmax"), (8, 64, 4, 256, 96, 64, "sigmoid"),
    (2, 1024, 8, 64, 16, 16, "softmax"), (3, 16, 2, 128, 48, 0, "softmax"),
    (12, 16, 2, 128, 48, 32, "softmax"), (8, 16, 2, 128, 48, 32, "softmax"),
    (4, 128, 8, 2048, 768, 0, "softmax"), (2, 32, 4, 4096, 1024, 0, "softmax"),
    # one token, more hidden rows than moe_experts1 has warps: several down rows a warp
    (1, 32, 4, 4096, 1024, 0, "softmax"), (1, 64, 8, 4096, 768, 256, "sigmoid"),
    # one token, experts wider than 1,024: mb_gate_up + mb_down
    (1, 16, 4, 256, 1288, 0, "softmax"), (1, 64, 8, 512, 1096, 64, "sigmoid")])
def test_moe_block_paths(cuda_backend, use_policy, fused, dtype, t, e, k, hidden, inter,
                         shared, scoring):
    use_policy(moe_fused=fused)
    be = cuda_backend
    case = _block_case(t * e + k + shared, t, e, k, hidden, inter, shared, dtype)
    calls = _moe_ops(be)._moe_calls
    be.reset_workspace()
    dev = {name: be.from_host(a) for name, a in case.items()}
    out = be.ops.moe_block(top_k=k, renormalize=True, scoring=scoring, **dev)
    want = ref.moe_block(top_k=k, renormalize=True, scoring=scoring, **case)
    assert _rel_err(be.to_host(out), want) < 1.5e-2
    assert (_moe_ops(be)._moe_calls > calls) == (fused == "1" and t <= 8)


@pytest.mark.parametrize("t,inter", [(1, 64), (1, 1288), (2, 64)])
def test_fused_moe_block_replays_in_a_graph(cuda_backend, use_policy, t, inter):
    # The router's completion counter must return to zero and moe_experts1's 64-bit barrier
    # count must grow by the grid each launch: every replay routes afresh (one token: the
    # one-kernel experts, or mb_gate_up + mb_down for wide experts; two: moe_decode.cu).
    use_policy(moe_fused="1")
    be = cuda_backend
    case = _block_case(5, t, 256, 8, 256, inter, 64, bfloat16)
    dev = {name: be.from_host(a) for name, a in case.items()}
    graph = be.capture(lambda: be.ops.moe_block(top_k=8, renormalize=True, **dev))
    rng = np.random.default_rng(6)
    router = case["router_weight"].astype(np.float64)
    for _ in range(3):
        while True:
            x = rng.standard_normal((t, 256)).astype(bfloat16)
            top = -np.sort(-(x.astype(np.float64) @ router.T), axis=-1)
            if (top[:, 7] - top[:, 8]).min() > 0.05:
                break
        be.copy_from_host(dev["x"], x)
        graph.replay()
        want = ref.moe_block(top_k=8, renormalize=True, **{**case, "x": x})
        assert _rel_err(be.to_host(graph.output), want) < 1.5e-2
    counters = _moe_ops(be)._moe_counters
    if counters is not None:
        assert not be.to_host(counters)[0::4].any()


# auto: shared-expert blocks fused (one token: the stacked norm + router GEMV, then the
# experts), plain blocks after the norm + router GEMV; 1: plain blocks fused too (one token:
# mb_router with the norm folded in); composed: rms_norm then moe_block.
@pytest.mark.parametrize("path", ["auto", "1", "composed"])
@pytest.mark.parametrize("t,e,k,hidden,inter,shared,residual,zc", [
    (1, 128, 8, 2048, 768, 0, True, False), (1, 256, 8, 2048, 512, 512, True, True),
    (3, 64, 4, 256, 96, 64, False, False), (8, 32, 8, 512, 128, 0, True, False),
    (12, 16, 2, 128, 48, 32, True, False)])
def test_rms_norm_moe_block(cuda_backend, use_policy, path, t, e, k, hidden, inter, shared,
                            residual, zc):
    from atlas_core.api import compose_rms_norm_moe_block

    use_policy(moe_fused="1" if path == "1" else "auto")
    be = cuda_backend
    op = (lambda *a, **kw: compose_rms_norm_moe_block(be.ops, *a, **kw)) \
        if path == "composed" else be.ops.rms_norm_moe_block
    case = dict(_block_case(t * e + k + shared + 1, t, e, k, hidden, inter, shared, bfloat16))
    rng = np.random.default_rng(t + e)
    x = case.pop("x")  # the router separates the top-k of x itself; use x as the normed rows
    res = rng.standard_normal(x.shape).astype(bfloat16) if residual else None
    nw = (rng.uniform(-0.01, 0.01, hidden) if zc else np.ones(hidden)).astype(bfloat16)
    raw = (x.astype(np.float32) - (res.astype(np.float32) if residual else 0)).astype(bfloat16)
    be.reset_workspace()
    dev = {name: be.from_host(a) for name, a in case.items()}
    out, r = op(be.from_host(raw), None if res is None else be.from_host(res), be.from_host(nw),
                1e-6, zc, top_k=k, renormalize=True, **dev)
    want, want_r = ref.rms_norm_moe_block(raw, res, nw, 1e-6, zc, top_k=k, renormalize=True, **case)
    assert _rel_err(be.to_host(out), want) < 1.5e-2
    np.testing.assert_array_equal(be.to_host(r).astype(np.float32), want_r.astype(np.float32))


@pytest.mark.parametrize("t,e,k,hidden,inter,scoring,residual", [
    (1, 128, 8, 2048, 768, "softmax", True), (1, 256, 8, 512, 1024, "sigmoid", False),
    (1, 64, 4, 256, 96, "softmax", True), (2, 128, 8, 256, 64, "softmax", True),
    (5, 200, 6, 264, 1288, "softmax", False), (8, 128, 8, 256, 64, "sigmoid", True),
    (3, 512, 32, 256, 64, "softmax", True), (1, 1024, 2, 128, 32, "sigmoid", True),
    (1, 128, 8, 256, 1288, "softmax", True)])
def test_plain_moe_after_router_gemv(cuda_backend, t, e, k, hidden, inter, scoring, residual):
    """A MoE block without a shared expert (qwen3-30b-a3b): the norm rides on the router GEMV,
    then moe_block.cu's expert kernels on its logits (each block picks the top-k; one token
    with widths <= 1,024: moe_experts1.cu's one kernel; at most 256 experts and top-k 8, else
    moe_route and moe_experts), all PDL launches."""
    be = cuda_backend
    case = dict(_block_case(t * e + k + 3, t, e, k, hidden, inter, 0, bfloat16))
    rng = np.random.default_rng(t + e + 1)
    x = case.pop("x")
    res = rng.standard_normal(x.shape).astype(bfloat16) if residual else None
    nw = np.ones(hidden, bfloat16)
    raw = (x.astype(np.float32) - (res.astype(np.float32) if residual else 0)).astype(bfloat16)
    be.reset_workspace()
    dev = {name: be.from_host(a) for name, a in case.items()}
    out, r = be.ops.rms_norm_moe_block(be.from_host(raw), None if res is None else be.from_host(res),
                                       be.from_host(nw), 1e-6, False, top_k=k, renormalize=True,
                                       scoring=scoring, **dev)
    want, want_r = ref.rms_norm_moe_block(raw, res, nw, 1e-6, False, top_k=k, renormalize=True,
                                          scoring=scoring, **case)
    assert _rel_err(be.to_host(out), want) < 1.5e-2
    np.testing.assert_array_equal(be.to_host(r).astype(np.float32), want_r.astype(np.float32))


@pytest.mark.parametrize("inter", [64, 1288])
def test_plain_moe_block_replays_in_a_graph(cuda_backend, inter):
    # Norm + router GEMV, then the experts on its logits (the one-kernel experts, or two
    # kernels for wide experts) as PDL launches: every replay routes afresh from the new x.
    be = cuda_backend
    case = dict(_block_case(11, 1, 128, 8, 256, inter, 0, bfloat16))
    case.pop("x")
    dev = {name: be.from_host(a) for name, a in case.items()}
    nw = np.ones(256, bfloat16)
    dx, dnw = be.from_host(np.zeros((1, 256), bfloat16)), be.from_host(nw)
    graph = be.capture(lambda: be.ops.rms_norm_moe_block(dx, None, dnw, 1e-6, False, top_k=8,
                                                         renormalize=True, **dev)[0])
    rng = np.random.default_rng(12)
    router = case["router_weight"].astype(np.float64)
    for _ in range(3):
        while True:
            x = rng.standard_normal((1, 256)).astype(bfloat16)
            xn = x.astype(np.float64) / np.sqrt((x.astype(np.float64) ** 2).mean() + 1e-6)
            top = -np.sort(-(xn @ router.T), axis=-1)
            if top[0, 7] - top[0, 8] > 0.05:
                break
        be.copy_from_host(dx, x)
        graph.replay()
        want, _ = ref.rms_norm_moe_block(x, None, nw, 1e-6, False, top_k=8, renormalize=True,
                                         **case)
        assert _rel_err(be.to_host(graph.output), want) < 1.5e-2
