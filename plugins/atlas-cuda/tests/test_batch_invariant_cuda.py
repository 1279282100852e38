"""Batch-invariant mode on CUDA (``EngineArgs(batch_invariant=True)``): a request gets the same
tokens and the same logprob bits alone as in a batch of 64 (mixed prompt lengths, staggered
arrivals, a small prefill budget so steps mix prompt chunks cut anywhere with decode rows;
greedy and seeded), on tiny bf16 Qwen3 and Qwen3.5-MoE (hybrid GDN + MoE) checkpoints and on a
Qwen3 with 128-wide heads and ~1,500 tokens of context, where the default decode plan would
split each row's keys. Plus ``linear`` row by row at every row count. Host side:
test_batch_invariant_host.py; the mode: docs/serving.md, Determinism."""

import functools

import numpy as np
import pytest

from cuda_probe import HAS_GPU

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="no CUDA device"),
              pytest.mark.timeout(1200)]

BATCH = 64
MAX_TOKENS = 24
#: Prompt tokens per step: prompts longer than this are chunked, and where a batched prompt's
#: chunks end depends on the other requests of its steps.
PREFILL_BUDGET = 64
#: (name, architecture, config overrides, longest prompt, probe prompt lengths).
CASES = {
    "qwen3": ("Qwen3ForCausalLM", {}, 200, (1, 9, 64, 130, 200)),
    "qwen35_moe": ("Qwen3_5MoeForCausalLM", {}, 200, (1, 9, 64, 130, 200)),
    # head_dim 128: 32 keys a round, so the default plan splits a 1,500-token row many ways
    "qwen3_long": ("Qwen3ForCausalLM",
                   dict(hidden_size=256, head_dim=128, num_attention_heads=8,
                        num_key_value_heads=2, max_position_embeddings=4096),
                   1800, (1, 700, 1500, 1800)),
}


@functools.cache
def _model_dir(name, root):
    from atlas_core.api import Registry
    from atlas_core.testing.checkpoints import write_tiny_checkpoint
    arch, overrides, *_ = CASES[name]
    registry = Registry()
    if arch not in registry.names("weight_loaders"):
        pytest.skip(f"{arch} is not registered (install its plugin)")
    return write_tiny_checkpoint(arch, root / name, dtype="bfloat16", registry=registry,
                                 **overrides)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("batch_invariant")


def _engine(path):
    from atlas_core.api import EngineArgs, LLMEngine
    return LLMEngine.from_args(EngineArgs(
        model=str(path), backend="cuda", batch_invariant=True, max_num_seqs=BATCH,
        max_prefill_tokens=PREFILL_BUDGET, block_size=16, num_kv_blocks=8192,
        enable_prefix_caching=False, gpu_memory_utilization=0.5))


def _prompts(name):
    """``BATCH`` prompts: the probes' lengths first, then random lengths."""
    _, _, longest, probes = CASES[name]
    rng = np.random.default_rng(7)
    lengths = list(probes) + rng.integers(1, longest + 1, BATCH - len(probes)).tolist()
    return [rng.integers(0, 370, n).tolist() for n in lengths]


def _params(i):
    """Even requests greedy, odd ones seeded top-p / top-k sampling; 2 logprobs each (a fresh
    object per request: the engine may fill in defaults)."""
    from atlas_core.api import SamplingParams
    if i % 2 == 0:
        return SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logprobs=2, ignore_eos=True)
    return SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=100 + i,
                          max_tokens=MAX_TOKENS, logprobs=2, ignore_eos=True)


def _completion(out):
    c = out.outputs[0]
    return c.token_ids, [(lp.token_id, lp.logprob, lp.top) for lp in c.logprobs]


def _batched(engine, prompts):
    """All requests in one engine, request ``i`` added before step ``i // 2`` (so prefill
    chunks of new requests share steps with decode rows of earlier ones)."""
    outs, step, pending = {}, 0, list(range(len(prompts)))
    while pending or engine.has_unfinished_requests():
        while pending and pending[0] // 2 <= step:
            i = pending.pop(0)
            engine.add_request(f"r{i}", prompts[i], _params(i))
        for out in engine.step():
            if out.finished:
                outs[out.request_id] = out
        step += 1
    return outs


@pytest.mark.parametrize("name", list(CASES))
def test_alone_equals_in_a_batch_of_64(root, name):
    from atlas_core.testing.fake_model import run_to_completion
    path = _model_dir(name, root)
    prompts = _prompts(name)
    probes = range(len(CASES[name][3]))
    engine = _engine(path)
    assert engine.backend.policy.batch_invariant
    alone = {}
    for i in probes:  # one at a time: every step holds this request only
        engine.add_request(f"a{i}", prompts[i], _params(i))
        alone[i] = _completion(run_to_completion(engine)[f"a{i}"])
    batched = _batched(engine, prompts)
    assert len(batched) == BATCH
    for i in probes:
        got = _completion(batched[f"r{i}"])
        assert got[0] == alone[i][0], f"{name} request {i}: tokens differ"
        assert got[1] == alone[i][1], f"{name} request {i}: logprob bits differ"


def test_linear_rows_are_the_same_at_every_row_count(cuda_backend):
    """Rows 0..7 of ``linear`` at M = 8 .. 1,000 equal the same rows computed 8 at a time and,
    row 0, alone (the GEMM's three tiles; M = 1 took the GEMV before)."""
    from atlas_core.api import as_dtype
    be = cuda_backend
    bf16 = as_dtype("bfloat16")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1000, 512)).astype(bf16)
    w = (rng.standard_normal((768, 512)) * 0.05).astype(bf16)
    dw = be.from_host(w)
    be.set_batch_invariant(True)
    try:
        def rows(m):
            be.reset_workspace()
            y = be.to_host(be.ops.linear(be.from_host(x[:m]), dw))
            return y.view(np.uint16)
        one, eight = rows(1), rows(8)
        np.testing.assert_array_equal(one[0], eight[0])
        for m in (9, 31, 33, 127, 129, 1000):
            np.testing.assert_array_equal(rows(m)[:8], eight, err_msg=f"M={m}")
    finally:
        be.set_batch_invariant(False)
