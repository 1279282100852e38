"""On a GPU: the tiny Nemotron-H model on the cuda backend gives numpy's greedy tokens
(float32, logprobs within 1e-4), teacher-forced bf16 logits near float32 ones, and a decode
step of the Mamba-2 ops replayed from a captured CUDA graph matches the reference. Skipped
without a device (``pytest -m gpu plugins/atlas-nemotron-h``)."""

from __future__ import annotations

import numpy as np
import pytest
from nemotron_checkpoints import prompt, save_hf_checkpoint
from nemotron_cuda_probe import HAS_GPU

from atlas_core.testing.contracts_cases import check_case
from atlas_core.testing.contracts_ops import to_device
from atlas_nemotron_h import mamba2_reference as ref
from atlas_nemotron_h.op_cases import mamba2_decode_case

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not HAS_GPU, reason="no CUDA device or atlas-cuda missing")]


@pytest.fixture(scope="module")
def bf16_checkpoint(registry, tmp_path_factory):
    return save_hf_checkpoint(tmp_path_factory.mktemp("nemotron_h") / "bf16", dtype="bfloat16",
                              registry=registry)


def _greedy(path, backend, prompts):
    from atlas_core.api import LLM, SamplingParams

    llm = LLM(str(path), backend=backend, num_kv_blocks=64, max_num_seqs=4, block_size=8,
              max_prefill_tokens=16)
    params = SamplingParams(temperature=0, max_tokens=12, logprobs=3, ignore_eos=True)
    return [o.outputs[0] for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]


def test_cuda_greedy_matches_numpy(checkpoint):
    prompts = [prompt(1, 11), prompt(2, 5), prompt(3, 37)]
    got, want = _greedy(checkpoint, "cuda", prompts), _greedy(checkpoint, "numpy", prompts)
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids
        for lg, lw in zip(g.logprobs, w.logprobs):
            np.testing.assert_allclose([v for _, v in lg.top], [v for _, v in lw.top], atol=1e-4)


def test_bf16_logits_close_to_float32(bf16_checkpoint, checkpoint, cuda_backend, registry):
    from atlas_core.api import load_model
    from atlas_core.testing.forward import ForwardRunner

    tokens = prompt(6, 40)

    def logits(path, backend, dtype=None):
        model = load_model(path, backend, registry=registry, dtype=dtype)
        runner = ForwardRunner(model, backend, max_seqs=1)
        rows = [runner.step([tokens[:36]], all_logits=True)[0]]
        return np.concatenate(rows + [runner.step([[t]])[0] for t in tokens[36:]])

    bf16 = logits(bf16_checkpoint, cuda_backend)
    f32 = logits(bf16_checkpoint, registry.create("gpu_backends", "numpy"), "float32")
    assert np.abs(bf16 - f32).max() <= 0.05 * max(1.0, np.abs(f32).max())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decode_step_replays_from_a_graph(cuda_backend, dtype):
    from atlas_core.api import OpRegistry

    case = mamba2_decode_case(dtype, (8, 64, 1, 128))
    check_case(cuda_backend, OpRegistry.load(), "mamba2_decode", case)
    args = [to_device(cuda_backend, a) for a in case.args]
    host = [a.copy() if isinstance(a, np.ndarray) else a for a in case.args]
    graph = cuda_backend.capture(lambda: cuda_backend.ops.mamba2_decode(*args, **case.kwargs))
    expected = ref.mamba2_decode(*host, **case.kwargs)       # capture ran it once eagerly
    for _ in range(3):
        graph.replay()
        expected = ref.mamba2_decode(*host, **case.kwargs)
    got = cuda_backend.to_host(graph.output)
    scale = max(1.0, float(np.abs(expected.astype(np.float32)).max()))
    assert np.abs(got.astype(np.float32) - expected.astype(np.float32)).max() <= 0.05 * scale
    ssm = cuda_backend.to_host(args[10])
    used = [s for s in case.args[-1] if s >= 0]
    np.testing.assert_allclose(ssm[used], host[10][used], rtol=0.05, atol=0.05)


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("num_tokens", [7, 600])
def test_experts_gemv_and_grouped_paths_match_the_reference(cuda_backend, num_tokens, shared):
    from atlas_nemotron_h.cuda.moe_ops import GROUPED_MIN_TOKENS
    from atlas_nemotron_h.ffn_reference import nemotron_h_moe_experts

    assert (num_tokens >= GROUPED_MIN_TOKENS) == (num_tokens == 600)
    rng = np.random.default_rng(num_tokens)
    x = rng.standard_normal((num_tokens, 64)).astype(np.float32)
    w_up = (rng.standard_normal((16, 48, 64)) / 8).astype(np.float32)
    w_down = (rng.standard_normal((16, 64, 48)) / 7).astype(np.float32)
    ids = np.stack([rng.permutation(16)[:3] for _ in range(num_tokens)]).astype(np.int32)
    weights = rng.uniform(0.1, 1, (num_tokens, 3)).astype(np.float32)
    host = [x, w_up, w_down, weights, ids]
    if shared:
        host += [(rng.standard_normal((80, 64)) / 8).astype(np.float32),
                 (rng.standard_normal((64, 80)) / 9).astype(np.float32)]
    args = [cuda_backend.from_host(a) for a in host]
    got = cuda_backend.to_host(cuda_backend.ops.nemotron_h_moe_experts(*args))
    np.testing.assert_allclose(got, nemotron_h_moe_experts(*host), rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def nano_moe():
    """Nemotron-3 Nano's MoE shapes in bf16 (hidden 2688, 128 experts, top-6, expert width
    1856, shared expert 3712), with 8 experts' weights instead of 128 (the kernels see the same
    row lengths)."""
    from atlas_core.testing.contracts_ops import as_dtype

    rng = np.random.default_rng(2688)
    bf16 = as_dtype("bfloat16")
    hidden, inter = 2688, 1856
    router = (rng.standard_normal((128, hidden)) / hidden ** 0.5).astype(np.float32)
    bias = (rng.standard_normal(128) * 0.05).astype(np.float32)
    w_up = (rng.standard_normal((8, inter, hidden)) / hidden ** 0.5).astype(np.float32)
    w_down = (rng.standard_normal((8, hidden, inter)) / inter ** 0.5).astype(np.float32)
    s_up = (rng.standard_normal((3712, hidden)) / hidden ** 0.5).astype(np.float32)
    s_down = (rng.standard_normal((hidden, 3712)) / 3712 ** 0.5).astype(np.float32)
    return router, bias, *(w.astype(bf16) for w in (w_up, w_down, s_up, s_down))


@pytest.mark.parametrize("num_tokens", [1, 3, 8])
def test_nano_shaped_moe_replays_from_a_graph(cuda_backend, nano_moe, num_tokens):
    """The router (logits GEMV + top-k kernel) and the expert GEMVs with the shared expert at
    the bench shapes, in a captured decode graph (PDL launches between them), against the
    references."""
    from atlas_core.testing.contracts_ops import as_dtype
    from atlas_nemotron_h import ffn_reference as fr

    router, bias, w_up, w_down, s_up, s_down = nano_moe
    rng = np.random.default_rng(num_tokens)
    x = rng.standard_normal((num_tokens, 2688)).astype(as_dtype("bfloat16"))
    route = dict(top_k=6, n_group=1, topk_group=1, renormalize=True, routed_scaling_factor=2.5)
    want_w, want_ids = fr.nemotron_h_moe_route(x, router, bias, **route)
    ids = np.stack([rng.permutation(8)[:6] for _ in range(num_tokens)]).astype(np.int32)
    want = fr.nemotron_h_moe_experts(x, w_up, w_down, want_w, ids, s_up, s_down)
    dev = [cuda_backend.from_host(a) for a in (x, router, bias, w_up, w_down, ids, s_up, s_down)]
    ops = cuda_backend.ops

    def step():
        weights, got_ids = ops.nemotron_h_moe_route(dev[0], dev[1], dev[2], **route)
        return weights, got_ids, ops.nemotron_h_moe_experts(dev[0], dev[3], dev[4], weights,
                                                            dev[5], dev[6], dev[7])

    graph = cuda_backend.capture(step)
    for _ in range(2):
        graph.replay()
    weights, got_ids, out = (cuda_backend.to_host(a) for a in graph.output)
    np.testing.assert_array_equal(got_ids, want_ids)
    np.testing.assert_allclose(weights, want_w, rtol=1e-5, atol=1e-6)
    got, ref = out.astype(np.float32), want.astype(np.float32)
    assert np.abs(got - ref).max() <= 0.02 * np.abs(ref).max()


@pytest.mark.parametrize("num_tokens", [1, 6, 8, 9, 33, 64])
def test_fused_router_routes_as_the_two_kernels(cuda_backend, nano_moe, monkeypatch, num_tokens):
    """ATLAS_NEMOTRON_ROUTE=fused (one kernel; its last block of each 8-token group selects) at
    the nano router's shape: the same ids and weights as the two kernels, bit for bit, eager
    and replayed from a graph several times (each call's last block resets its group's
    counter, so a replay starts from zero)."""
    from atlas_core.testing.contracts_ops import as_dtype
    from atlas_nemotron_h import ffn_reference as fr

    router, bias = nano_moe[:2]
    rng = np.random.default_rng(100 + num_tokens)
    x = rng.standard_normal((num_tokens, 2688)).astype(as_dtype("bfloat16"))
    route = dict(top_k=6, n_group=1, topk_group=1, renormalize=True, routed_scaling_factor=2.5)
    want_w, want_ids = fr.nemotron_h_moe_route(x, router, bias, **route)
    dev = [cuda_backend.from_host(a) for a in (x, router, bias)]
    ops = cuda_backend.ops
    monkeypatch.setenv("ATLAS_NEMOTRON_ROUTE", "two")
    two_w, two_ids = (cuda_backend.to_host(a) for a in ops.nemotron_h_moe_route(*dev, **route))
    monkeypatch.setenv("ATLAS_NEMOTRON_ROUTE", "fused")
    for _ in range(3):
        got_w, got_ids = (cuda_backend.to_host(a) for a in ops.nemotron_h_moe_route(*dev, **route))
        np.testing.assert_array_equal(got_ids, two_ids)
        np.testing.assert_array_equal(got_w, two_w)
    np.testing.assert_array_equal(got_ids, want_ids)
    np.testing.assert_allclose(got_w, want_w, rtol=1e-5, atol=1e-6)
    graph = cuda_backend.capture(lambda: ops.nemotron_h_moe_route(*dev, **route))
    for _ in range(4):
        graph.replay()
        got_w, got_ids = (cuda_backend.to_host(a) for a in graph.output)
        np.testing.assert_array_equal(got_ids, two_ids)
        np.testing.assert_array_equal(got_w, two_w)


def test_fused_router_decodes_the_same_tokens(checkpoint, monkeypatch):
    """The tiny checkpoint's greedy tokens with the fused router are numpy's."""
    monkeypatch.setenv("ATLAS_NEMOTRON_ROUTE", "fused")
    test_cuda_greedy_matches_numpy(checkpoint)


@pytest.mark.parametrize("scheme", ["fp8_block", "nvfp4_modelopt"])
def test_cuda_greedy_with_experts_kept_quantized(tmp_path, registry, monkeypatch, scheme):
    """ATLAS_CUDA_QUANT_WEIGHTS=1: the experts stay FP8 / NVFP4 on the device and the cuda op
    dequantizes them each call; greedy tokens equal numpy's of the same quantized model."""
    from atlas_core.testing.quant_checkpoints import write_quantized_checkpoint
    path = write_quantized_checkpoint("NemotronHForCausalLM", tmp_path / "q", scheme,
                                      registry=registry)
    prompts = [prompt(1, 11), prompt(2, 5)]
    want = _greedy(path, "numpy", prompts)
    monkeypatch.setenv("ATLAS_CUDA_QUANT_WEIGHTS", "1")
    got = _greedy(path, "cuda", prompts)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]


def test_cuda_ngram_speculation_keeps_plain_greedy_tokens(checkpoint):
    """Verify steps run mamba2_decode once a position into per-position state rows (the cuda
    kernels with other state indices): greedy tokens equal plain decoding on cuda."""
    from atlas_core.api import LLM, SamplingParams

    prompts = [prompt(1, 11) * 3, prompt(2, 5), prompt(3, 37)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outs = {}
    for spec in (None, {"method": "ngram", "num_speculative_tokens": 3,
                        "draft_token_cost": 0.0}):
        llm = LLM(str(checkpoint), backend="cuda", num_kv_blocks=64, max_num_seqs=4,
                  block_size=8, speculative_config=spec)
        outs[spec is None] = [o.outputs[0].token_ids for o in
                              llm.generate([{"prompt_token_ids": p} for p in prompts], params)]
    assert outs[False] == outs[True]
