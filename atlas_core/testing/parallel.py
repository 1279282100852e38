"""Tensor / expert parallel runs against one process, for any tiny checkpoint.

``assert_parallel_matches(path, tp=2, ep=True)`` runs the same greedy requests on the numpy
backend in one process and as ``tp`` worker processes joined by the ``cpu`` comm backend, and
asserts the same tokens and logprobs within float32 rounding (the partial sums are added in
another order). A model family's tests call it on its tiny checkpoints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

#: Logprobs of a split run may differ from one process by float32 rounding of the partial sums.
LOGPROB_ATOL = 1e-4


def make_engine(path: str | Path, tp: int = 1, ep: bool = False, **kwargs: Any) -> Any:
    """An :class:`~atlas_core.engine.LLMEngine` on the numpy backend, split over ``tp``
    processes (expert parallel with ``ep``)."""
    from atlas_core.engine import EngineArgs, LLMEngine
    args = dict(model=str(path), backend="numpy", num_kv_blocks=48, max_num_seqs=4,
                tensor_parallel_size=tp, enable_expert_parallel=ep, distributed_timeout=60)
    return LLMEngine.from_args(EngineArgs(**{**args, **kwargs}))


def generate(engine: Any, prompts: list[list[int]], max_tokens: int = 6,
             logprobs: int | None = 1) -> dict[str, tuple[list[int], list[float]]]:
    """Greedy ``request id -> (token ids, logprobs)`` of every prompt."""
    from atlas_core.engine import SamplingParams
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True,
                            logprobs=logprobs)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, params)
    return finished_tokens(engine)


def finished_tokens(engine) -> dict[str, tuple[list[int], list[float]]]:
    """Step ``engine`` until idle: ``request id -> (token ids, logprobs)`` of every request."""
    out = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                c = o.outputs[0]
                out[o.request_id] = (c.token_ids, [lp.logprob for lp in c.logprobs or []])
    return out


def assert_same(parallel: dict, single: dict, atol: float = LOGPROB_ATOL) -> None:
    """The same tokens, and logprobs within ``atol``."""
    assert {k: v[0] for k, v in parallel.items()} == {k: v[0] for k, v in single.items()}
    for k in single:
        assert parallel[k][1] == pytest.approx(single[k][1], abs=atol)


def assert_parallel_matches(path: str | Path, prompts: list[list[int]], tp: int = 2,
                            ep: bool = False, single: dict | None = None,
                            **kwargs: Any) -> dict:
    """Greedy outputs of ``tp`` processes equal one process's (``single``, computed when not
    given); returns the single-process outputs for the next comparison."""
    if single is None:
        single = generate(make_engine(path, **kwargs), prompts)
    engine = make_engine(path, tp=tp, ep=ep, **kwargs)
    try:
        parallel = generate(engine, prompts)
    finally:
        engine.runner.shutdown()
    assert_same(parallel, single)
    return single
