"""Recurrent state across steps: chunked prefill and mixed batches equal one-shot runs.

Atlas against itself (no torch). Splitting a prompt changes only float32 rounding, but the tiny
random Qwen3-Next amplifies rounding (HF's own float32 run is 3.6e-5 relative off its float64
one), so the tolerance is that of the HF parity tests: max abs error <= 2e-5 * max(1, max |logit|).
"""

from __future__ import annotations

import numpy as np
import pytest
from qwen35_cases import ARCHS, prompts

from atlas_core.api import load_model
from atlas_core.testing.forward import ForwardRunner

RTOL = 2e-5


def assert_close(ours: np.ndarray, ref: np.ndarray) -> None:
    err, scale = np.abs(ours - ref).max(), max(1.0, float(np.abs(ref).max()))
    assert err <= RTOL * scale, f"max abs error {err:.3g} over logits of scale {scale:.3g}"


def set_gdn_chunk_size(model, size: int) -> None:
    for layer in model.layers:
        if hasattr(layer.mixer, "chunk_size"):
            layer.mixer.chunk_size = size


@pytest.fixture(params=ARCHS)
def model(request, checkpoints, backend, registry):
    return load_model(checkpoints[request.param], backend, registry=registry)


def one_shot(model, backend, tokens: list[int]) -> np.ndarray:
    return ForwardRunner(model, backend, max_seqs=1).step([tokens], all_logits=True)[0]


def test_chunked_prefill_carries_state(model, backend):
    prompt = prompts()[2]
    reference = one_shot(model, backend, prompt)
    set_gdn_chunk_size(model, 4)    # also cross delta-rule chunk boundaries inside each step
    runner = ForwardRunner(model, backend, max_seqs=1)
    rows = [runner.step([prompt[a:b]], all_logits=True)[0] for a, b in ((0, 7), (7, 8), (8, 19))]
    assert_close(np.concatenate(rows), reference)


def test_mixed_batch_equals_each_sequence_alone(model, backend):
    tokens = [p + [3, 1, 4] for p in prompts()]        # prompts of 11, 5, 19 plus three more
    alone = [one_shot(model, backend, t) for t in tokens]
    # Per step, (sequence, tokens to append): prefill chunks, decode rows and fresh prefills mixed.
    schedule = [
        [(0, 6)],
        [(0, 5), (1, 5), (2, 9)],
        [(0, 1), (2, 10), (1, 1)],
        [(1, 1), (0, 1), (2, 1)],
        [(0, 1), (1, 1), (2, 1)],
        [(2, 1)],
    ]
    runner = ForwardRunner(model, backend, max_seqs=3)
    done, got = [0, 0, 0], [[], [], []]
    for step in schedule:
        seqs = [s for s, _ in step]
        chunks = [tokens[s][done[s]:done[s] + n] for s, n in step]
        for (s, n), rows in zip(step, runner.step(chunks, seqs, all_logits=True)):
            got[s].append(rows)
            done[s] += n
    assert done == [len(t) for t in tokens]
    for rows, ref in zip(got, alone):
        assert_close(np.concatenate(rows), ref)


def test_reused_slot_starts_fresh(model, backend):
    prompt = prompts()[1]
    runner = ForwardRunner(model, backend, max_seqs=1)
    first = runner.step([prompt], all_logits=True)[0]
    runner.step([[5]])
    runner.reset()
    np.testing.assert_array_equal(runner.step([prompt], all_logits=True)[0], first)
    runner.reset()
    single = runner.step([prompt[:1]])[0]         # a one-token prompt runs the decode kernels
    np.testing.assert_allclose(single[-1], first[0], rtol=0, atol=RTOL * max(1, np.abs(first[0]).max()))
