"""Gated DeltaNet ops on CUDA (this plugin's kernels and wrappers, ``atlas-qwen35[cuda]``) at
model-sized shapes, in CUDA graphs, each kernel path the policy can pick, and tiny hybrid
Qwen3.5 / Qwen3-Next checkpoints through the engine against the numpy backend (guided decoding
and the float32 q/k norms of these models included).

Tolerances: ops as the contract (``||out - ref|| / ||ref||``: float32 1e-5, bfloat16 1.2e-2,
ten times looser for the delta rule's state recurrence); float32 engines must pick the same
greedy tokens with top logprobs within 1e-4; bfloat16 logits (teacher-forced) no further from
the float32 truth than twice the numpy backend's bfloat16 run.
"""

import dataclasses

import numpy as np
import pytest

from atlas_core.api import reference as core_ref
from atlas_core.testing.contracts_cases import check_case
from atlas_core.testing.contracts_ops import assert_close, make_rng, randn, rel_error
from atlas_qwen35 import gdn_reference as ref
from atlas_qwen35.gdn_cases import gated_delta_rule_decode_case

from qwen35_cuda_probe import HAS_GPU

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="no CUDA device")]
ARCHS = ["Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM"]
#: (num_k_heads, num_v_heads, head_k_dim, head_v_dim) as in Qwen3-Next / Qwen3.5, fewer heads.
HEADS = (2, 4, 128, 128)


@pytest.fixture
def policy(cuda_backend):
    """``policy(**fields)``: the session backend runs this test with these kernel policy fields
    (:class:`atlas_cuda.policy.KernelPolicy`), restored afterwards."""
    original = cuda_backend.policy
    yield lambda **fields: cuda_backend.set_policy(dataclasses.replace(original, **fields))
    cuda_backend.set_policy(original)


def _layout(num_q, context, slots):
    cu = np.concatenate([[0], np.cumsum(num_q)]).astype(np.int32)
    return cu, (np.array(num_q) + np.array(context)).astype(np.int32), np.array(slots, np.int32)


def _delta_inputs(rng, n, dtype):
    hk, hv, dk, dv = HEADS
    g, beta = ref.gdn_gating(randn(rng, (n, 2 * hv)), np.log(rng.uniform(0.5, 4, hv)),
                             randn(rng, (hv,)))
    return randn(rng, (n, 2 * hk * dk + hv * dv), dtype), g, beta


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("form", ["recurrent", "chunked"])
def test_delta_rule_model_heads(cuda_backend, dtype, form):
    be, rng = cuda_backend, make_rng("delta_rule_model", dtype, form)
    hk, hv, dk, dv = HEADS
    cu, seq_lens, slots = _layout([70, 1, 3, 1], [0, 9, 5, 4], [2, 0, 5, -1])
    qkv, g, beta = _delta_inputs(rng, int(cu[-1]), dtype)
    pool = (rng.standard_normal((6, hv, dk, dv)) * 0.5).astype(np.float32)
    dev_pool = be.from_host(pool)
    kwargs = dict(num_k_heads=hk, num_v_heads=hv, head_k_dim=dk, head_v_dim=dv)
    op = getattr(be.ops, f"gated_delta_rule_{form}")
    out = op(*(be.from_host(a) for a in (qkv, g, beta)), dev_pool,
             *(be.from_host(a) for a in (cu, seq_lens, slots)), **kwargs)
    want = getattr(ref, f"gated_delta_rule_{form}")(qkv, g, beta, pool, cu, seq_lens, slots,
                                                    **kwargs)
    assert_close(be.to_host(out), want, "output", 10.0)
    assert_close(be.to_host(dev_pool), pool, "state pool", 10.0)


#: (query counts, context before this step, slots): chunk-unaligned lengths 1..300, initial
#: states, padding rows (-1), an empty sequence.
CHUNKED_LAYOUTS = {
    "varlen": ([300, 1, 64, 129, 7, 65, 0, 128], [0, 9, 5, 0, 3, 40, 2, 1],
               [2, 0, 5, -1, 1, 3, 4, 6]),
    "lengths": ([1, 2, 3, 17, 63, 127, 191, 255, 257, 299], [0] * 10, list(range(10))),
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", sorted(CHUNKED_LAYOUTS))
@pytest.mark.parametrize("head_v_dim", [128, 64])
def test_chunked_kernels_match_reference(cuda_backend, policy, dtype, layout, head_v_dim):
    """gdn_chunked.cu (policy gdn_prefill=chunked) against the NumPy chunked reference."""
    policy(gdn_prefill="chunked")
    be, rng = cuda_backend, make_rng("gdn_chunked", dtype, layout, head_v_dim)
    hk, hv, dk, dv = 2, 4, 128, head_v_dim
    cu, seq_lens, slots = _layout(*CHUNKED_LAYOUTS[layout])
    n = int(cu[-1])
    g, beta = ref.gdn_gating(randn(rng, (n, 2 * hv)), np.log(rng.uniform(0.5, 4, hv)),
                             randn(rng, (hv,)))
    qkv = randn(rng, (n, 2 * hk * dk + hv * dv), dtype)
    pool = (rng.standard_normal((12, hv, dk, dv)) * 0.5).astype(np.float32)
    dev_pool = be.from_host(pool)
    kwargs = dict(num_k_heads=hk, num_v_heads=hv, head_k_dim=dk, head_v_dim=dv)
    out = be.ops.gated_delta_rule_chunked(*(be.from_host(a) for a in (qkv, g, beta)), dev_pool,
                                          *(be.from_host(a) for a in (cu, seq_lens, slots)),
                                          **kwargs)
    want = ref.gated_delta_rule_chunked(qkv, g, beta, pool, cu, seq_lens, slots, **kwargs)
    assert_close(be.to_host(out), want, "output", 10.0)
    assert_close(be.to_host(dev_pool), pool, "state pool", 10.0)
    if dtype == "float32":  # tighter than the contract: float32 math throughout
        assert rel_error(be.to_host(out), want) < 1e-4


def test_chunked_then_sequential_agree(cuda_backend, policy):
    """A long prefill split in two steps (second one continuing from the slot) gives the
    same outputs and state whichever kernel runs each step."""
    be, rng = cuda_backend, make_rng("gdn_chunked_ab")
    hk, hv, dk, dv = HEADS
    kwargs = dict(num_k_heads=hk, num_v_heads=hv, head_k_dim=dk, head_v_dim=dv)
    qkv, g, beta = _delta_inputs(rng, 400, "float32")
    results = {}
    for mode in ("chunked", "sequential"):
        policy(gdn_prefill=mode)
        pool, outs = be.zeros((1, hv, dk, dv), np.float32), []
        for lo, hi in ((0, 150), (150, 400)):
            cu, seq_lens, slots = _layout([hi - lo], [lo], [0])
            outs.append(be.to_host(be.ops.gated_delta_rule_chunked(
                *(be.from_host(a[lo:hi]) for a in (qkv, g, beta)), pool,
                *(be.from_host(a) for a in (cu, seq_lens, slots)), **kwargs)))
        results[mode] = (np.concatenate(outs), be.to_host(pool))
    assert rel_error(results["chunked"][0], results["sequential"][0]) < 1e-4
    assert rel_error(results["chunked"][1], results["sequential"][1]) < 1e-4


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_conv1d_prefill_then_updates(cuda_backend, dtype):
    be, rng = cuda_backend, make_rng("conv_chain", dtype)
    dim, k = 1024, 4
    cu, seq_lens, slots = _layout([37, 2, 5], [0, 1, 0], [1, 3, -1])
    x, w, b = randn(rng, (int(cu[-1]), dim), dtype), randn(rng, (dim, k), dtype, 0.5), None
    pool = randn(rng, (4, k - 1, dim))
    dev_pool = be.from_host(pool)
    out = be.ops.causal_conv1d(be.from_host(x), be.from_host(w), b, dev_pool,
                               *(be.from_host(a) for a in (cu, seq_lens, slots)))
    assert_close(be.to_host(out), ref.causal_conv1d(x, w, b, pool, cu, seq_lens, slots), "prefill")
    for step in range(3):
        seq_lens = seq_lens + 1
        xt = randn(rng, (3, dim), dtype)
        out = be.ops.causal_conv1d_update(be.from_host(xt), be.from_host(w), b, dev_pool,
                                          be.from_host(seq_lens), be.from_host(slots))
        want = ref.causal_conv1d_update(xt, w, b, pool, seq_lens, slots)
        assert_close(be.to_host(out), want, f"update {step}")
    assert_close(be.to_host(dev_pool), pool, "conv state")


@pytest.mark.parametrize("kernel", [None, "head", "split"])
def test_decode_step_in_a_graph(cuda_backend, policy, kernel):
    """conv update + gating + delta rule + gated norm captured once, replayed on new inputs
    (as four ops, or as gated_delta_rule_decode's two fused kernels, the second one
    gdn_decode_norm or gdn_decode_split)."""
    fused = kernel is not None
    policy(gdn_fused=fused, gdn_decode=kernel or "auto")
    be, rng = cuda_backend, make_rng("gdn_graph")
    hk, hv, dk, dv = HEADS
    dim, k, num_seqs = 2 * hk * dk + hv * dv, 4, 3
    seq_lens, slots = np.array([5, 9, 1], np.int32), np.array([1, 0, 2], np.int32)
    conv, ssm = randn(rng, (3, k - 1, dim)), randn(rng, (3, hv, dk, dv), scale=0.5)
    w, a_log, dt_bias = randn(rng, (dim, k), scale=0.5), np.zeros(hv, np.float32), randn(rng, (hv,))
    norm_w = randn(rng, (dv,))
    host = dict(conv=conv, ssm=ssm, w=w, a_log=a_log, dt=dt_bias, norm=norm_w, sl=seq_lens,
                idx=slots, cu=np.arange(num_seqs + 1, dtype=np.int32))
    dev = {name: be.from_host(a) for name, a in host.items()}
    qkv, ba, z = (be.empty(shape, np.float32)
                  for shape in ((num_seqs, dim), (num_seqs, 2 * hv), (num_seqs, hv, dv)))
    heads = dict(num_k_heads=hk, num_v_heads=hv, head_k_dim=dk, head_v_dim=dv)

    def step():
        if fused:
            return be.ops.gated_delta_rule_decode(
                qkv, z.reshape(num_seqs, hv * dv), ba, dev["w"], dev["a_log"], dev["dt"],
                dev["norm"], dev["conv"], dev["ssm"], dev["cu"], dev["sl"], dev["idx"], **heads)
        x = be.ops.causal_conv1d_update(qkv, dev["w"], None, dev["conv"], dev["sl"], dev["idx"])
        g, beta = be.ops.gdn_gating(ba, dev["a_log"], dev["dt"])
        core = be.ops.gated_delta_rule_recurrent(x, g, beta, dev["ssm"], dev["cu"], dev["sl"],
                                                 dev["idx"], **heads)
        return be.ops.rms_norm_gated(core, z, dev["norm"], 1e-6)

    host_in = [randn(rng, a.shape) for a in (qkv, ba, z)]
    for a, h in zip((qkv, ba, z), host_in):
        be.copy_from_host(a, h)
    be.reset_workspace()
    graph = be.capture(step)  # runs the step eagerly once, then records it
    x = ref.causal_conv1d_update(host_in[0], w, None, conv, seq_lens, slots)
    g, beta = ref.gdn_gating(host_in[1], a_log, dt_bias)
    ref.gated_delta_rule_recurrent(x, g, beta, ssm, np.arange(4, dtype=np.int32), seq_lens, slots,
                                   **heads)
    seq_lens = seq_lens + 1
    be.copy_from_host(dev["sl"], seq_lens)
    for replay in range(2):
        host_in = [randn(rng, a.shape) for a in (qkv, ba, z)]
        for a, h in zip((qkv, ba, z), host_in):
            be.copy_from_host(a, h)
        graph.replay()
        x = ref.causal_conv1d_update(host_in[0], w, None, conv, seq_lens, slots)
        g, beta = ref.gdn_gating(host_in[1], a_log, dt_bias)
        core = ref.gated_delta_rule_recurrent(x, g, beta, ssm, np.arange(4, dtype=np.int32),
                                              seq_lens, slots, **heads)
        want = ref.rms_norm_gated(core, host_in[2], norm_w, 1e-6)
        assert_close(be.to_host(graph.output), want, f"replay {replay}", 10.0)
    assert_close(be.to_host(dev["ssm"]), ssm, "ssm state", 10.0)
    assert_close(be.to_host(dev["conv"]), conv, "conv state")


def test_token_bitmask_bf16_logits(cuda_backend):
    be, rng = cuda_backend, make_rng("bitmask_bf16")
    logits = randn(rng, (3, 1000), "bfloat16")
    mask = rng.integers(-2**31, 2**31, (3, 32), dtype=np.int64).astype(np.int32)
    out = be.to_host(be.ops.apply_token_bitmask(be.from_host(logits), be.from_host(mask)))
    np.testing.assert_array_equal(out, core_ref.apply_token_bitmask(logits, mask))


@pytest.fixture(scope="module")
def hybrid_paths(tmp_path_factory):
    from atlas_core.api import Registry
    from atlas_core.testing.checkpoints import write_tiny_checkpoint

    registry = Registry()
    if "Qwen3_5ForCausalLM" not in registry.names("weight_loaders"):
        pytest.skip("atlas-qwen35 is not installed: pip install --no-deps -e plugins/atlas-qwen35")
    root = tmp_path_factory.mktemp("hybrid")
    return {(arch, dtype): write_tiny_checkpoint(arch, root / f"{arch}-{dtype}", dtype=dtype,
                                                 registry=registry)
            for arch in ARCHS for dtype in ("float32", "bfloat16")}


def _greedy(path, backend, prompts):
    from atlas_core.api import LLM, SamplingParams

    llm = LLM(str(path), backend=backend, num_kv_blocks=64, max_num_seqs=4, block_size=8,
              max_prefill_tokens=16)
    params = SamplingParams(temperature=0, max_tokens=8, logprobs=3, ignore_eos=True)
    return [o.outputs[0] for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]


@pytest.mark.parametrize("arch", ARCHS)
def test_hybrid_engine_greedy_matches_numpy(hybrid_paths, arch):
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 370, n).tolist() for n in (11, 5, 23)]
    got = _greedy(hybrid_paths[arch, "float32"], "cuda", prompts)
    want = _greedy(hybrid_paths[arch, "float32"], "numpy", prompts)
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids
        for lg, lw in zip(g.logprobs, w.logprobs):
            np.testing.assert_allclose([v for _, v in lg.top], [v for _, v in lw.top], atol=1e-4)


def _teacher_forced_logits(path, backend, registry, dtype=None):
    from atlas_core.api import load_model
    from atlas_core.testing.forward import ForwardRunner

    tokens = np.random.default_rng(5).integers(0, 370, 32).tolist()
    model = load_model(path, backend, registry=registry, dtype=dtype)
    runner = ForwardRunner(model, backend, max_seqs=1)
    rows = [runner.step([tokens[:29]], all_logits=True)[0]]
    rows += [runner.step([[t]])[0] for t in tokens[29:]]
    return np.concatenate(rows)


@pytest.mark.parametrize("path", ["unfused", "head", "split"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("heads", [HEADS, (1, 1, 32, 32), (2, 4, 16, 8), (1, 2, 64, 256),
                                   (2, 2, 256, 64)])
def test_gated_delta_rule_decode_paths(cuda_backend, policy, path, dtype, heads):
    """The four separate ops, gdn_decode_norm (a block per value head) and gdn_decode_split
    (clusters of column slabs: 8 x 16, 2 x 16, none (falls back), 8 x 32, 4 x 16 columns)."""
    policy(gdn_fused=path != "unfused", gdn_decode="head" if path == "head" else "split")
    check_case(cuda_backend, cuda_backend.op_registry, "gated_delta_rule_decode",
               gated_delta_rule_decode_case(dtype, heads))


@pytest.mark.parametrize("cols", [32, 16])
@pytest.mark.parametrize("batch", [1, 8])
def test_decode_split_matches_head_kernel(cuda_backend, policy, monkeypatch, batch, cols):
    """gdn_decode_split (``cols`` value columns per block) against gdn_decode_norm at
    Qwen3.5-35B's GDN heads (16 / 32 heads, 128 x 128), bfloat16, from the same state and
    inputs."""
    from atlas_qwen35.cuda import gdn_ops
    monkeypatch.setattr(gdn_ops, "SPLIT_COLS", (cols,))
    be, rng = cuda_backend, make_rng("gdn_split", batch)
    hk, hv, dk, dv = 16, 32, 128, 128
    dim, k = 2 * hk * dk + hv * dv, 4
    seq_lens, slots = np.full(batch, 7, np.int32), np.arange(batch, dtype=np.int32)[::-1].copy()
    bf = "bfloat16"
    host = [randn(rng, (batch, dim), bf), randn(rng, (batch, hv * dv), bf),
            randn(rng, (batch, 2 * hv), bf), randn(rng, (dim, k), bf, 0.5),
            np.log(rng.uniform(0.5, 4, hv)).astype(np.float32), randn(rng, (hv,)),
            randn(rng, (dv,), bf)]
    conv, ssm = randn(rng, (batch, k - 1, dim)), randn(rng, (batch, hv, dk, dv), scale=0.5)
    args = [be.from_host(a) for a in host]
    meta = [be.from_host(a) for a in (np.arange(batch + 1, dtype=np.int32), seq_lens, slots)]
    results = {}
    for kernel in ("head", "split"):
        policy(gdn_decode=kernel)
        pools = [be.from_host(conv), be.from_host(ssm)]
        out = be.ops.gated_delta_rule_decode(*args, *pools, *meta, num_k_heads=hk,
                                             num_v_heads=hv, head_k_dim=dk, head_v_dim=dv)
        results[kernel] = [be.to_host(out).astype(np.float32), be.to_host(pools[1])]
    assert rel_error(results["split"][0], results["head"][0]) < 1e-2
    assert rel_error(results["split"][1], results["head"][1]) < 1e-5


def test_hybrid_moe_bf16_logits_with_fused_decode(hybrid_paths, cuda_backend, policy):
    """The fused decode kernels (moe_block, gated_delta_rule_decode) inside a whole model."""
    policy(moe_fused="1", gdn_fused=True)
    test_hybrid_bf16_logits_as_close_as_numpy(hybrid_paths, cuda_backend, "Qwen3_5MoeForCausalLM")


@pytest.mark.parametrize("arch", ARCHS)
def test_hybrid_bf16_logits_as_close_as_numpy(hybrid_paths, cuda_backend, arch):
    """bfloat16 rounding alone moves tiny random hybrids' logits by 2-18% (numpy backend vs the
    same weights in float32); the cuda backend must stay within twice what numpy's bf16 gets."""
    from atlas_core.api import Registry

    registry = Registry()
    numpy_backend = registry.create("gpu_backends", "numpy")
    path = hybrid_paths[arch, "bfloat16"]
    truth = _teacher_forced_logits(path, numpy_backend, registry, "float32")
    numpy_err = rel_error(_teacher_forced_logits(path, numpy_backend, registry), truth)
    cuda_err = rel_error(_teacher_forced_logits(path, cuda_backend, registry), truth)
    assert cuda_err < max(2 * numpy_err, 0.03), (cuda_err, numpy_err)


def test_qk_norm_rope_float32_norm_weights(cuda_backend):
    """Regression: Qwen3.5 keeps zero-centred q/k norms in float32 under bfloat16 activations;
    the kernel read them as bfloat16."""
    be, rng = cuda_backend, make_rng("rope_f32_norm")
    h, kh, d, t = 4, 2, 32, 5
    cs = core_ref.rope_cos_sin_cache(8, 64, {"rope_type": "default", "rope_theta": 10000.0})
    pos = rng.integers(0, 64, t).astype(np.int32)
    qkv = randn(rng, (t, (h + 2 * kh) * d), "bfloat16")
    qn, kn = randn(rng, (d,)) + 1, randn(rng, (d,)) + 1
    slots = np.arange(t, dtype=np.int32)
    kc, vc = randn(rng, (2, 8, kh, d), "bfloat16"), randn(rng, (2, 8, kh, d), "bfloat16")
    dk, dv = be.from_host(kc), be.from_host(vc)
    kw = dict(num_heads=h, num_kv_heads=kh, head_dim=d, rotary_dim=8)
    q = be.ops.qk_norm_rope_and_cache(be.from_host(qkv), be.from_host(pos), be.from_host(cs),
                                      dk, dv, be.from_host(slots), q_norm=be.from_host(qn),
                                      k_norm=be.from_host(kn), **kw)
    want = core_ref.qk_norm_rope_and_cache(qkv, pos, cs, kc, vc, slots, q_norm=qn, k_norm=kn,
                                           **kw)
    assert_close(be.to_host(q), want, "q")
    assert_close(be.to_host(dk), kc, "k cache")

def test_guided_json_on_cuda(hybrid_paths):
    """Structured output through apply_token_bitmask on the device (needs llguidance)."""
    pytest.importorskip("llguidance", reason="llguidance is not installed")
    import json

    from atlas_core.api import LLM, SamplingParams
    from atlas_core.api import GuidedDecodingParams

    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
              "required": ["a", "b"], "additionalProperties": False}
    llm = LLM(str(hybrid_paths["Qwen3_5ForCausalLM", "float32"]), backend="cuda",
              num_kv_blocks=128, max_num_seqs=4)
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=200,
                             guided=GuidedDecodingParams.json_schema(schema)) for s in range(3)]
    for out in llm.generate(["{", "x", "json"], params):
        c = out.outputs[0]
        assert c.finish_reason == "stop", c.text
        assert set(json.loads(c.text)) == {"a", "b"}
