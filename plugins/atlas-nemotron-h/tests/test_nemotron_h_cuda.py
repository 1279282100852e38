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


@pytest.mark.parametrize("num_tokens", [7, 600])
def test_experts_gemv_and_grouped_paths_match_the_reference(cuda_backend, num_tokens):
    from atlas_nemotron_h.cuda.moe_ops import GROUPED_MIN_TOKENS
    from atlas_nemotron_h.ffn_reference import nemotron_h_moe_experts

    assert (num_tokens >= GROUPED_MIN_TOKENS) == (num_tokens == 600)
    rng = np.random.default_rng(num_tokens)
    x = rng.standard_normal((num_tokens, 64)).astype(np.float32)
    w_up = (rng.standard_normal((16, 48, 64)) / 8).astype(np.float32)
    w_down = (rng.standard_normal((16, 64, 48)) / 7).astype(np.float32)
    ids = np.stack([rng.permutation(16)[:3] for _ in range(num_tokens)]).astype(np.int32)
    weights = rng.uniform(0.1, 1, (num_tokens, 3)).astype(np.float32)
    args = [cuda_backend.from_host(a) for a in (x, w_up, w_down, weights, ids)]
    got = cuda_backend.to_host(cuda_backend.ops.nemotron_h_moe_experts(*args))
    np.testing.assert_allclose(got, nemotron_h_moe_experts(x, w_up, w_down, weights, ids),
                               rtol=1e-4, atol=1e-4)
