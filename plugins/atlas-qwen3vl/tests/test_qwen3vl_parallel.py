"""Qwen3-VL split over two processes (numpy backend, ``cpu`` comm): the language model split as
usual, the vision tower held whole by every rank (each encodes the step's images itself); an
image request next to a text request, its image spread over prefill chunks, gives the
single-process greedy tokens and logprobs, dense and MoE (tensor and expert parallel)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from qwen3vl_checkpoints import png_bytes, save_hf_checkpoint, small_processor_config  # noqa: E402

from atlas_core.testing.parallel import assert_same, finished_tokens, make_engine  # noqa: E402

pytestmark = pytest.mark.timeout(240)


def _greedy(engine) -> dict:
    from atlas_core.api import SamplingParams
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=1)
    ids, mm = engine.model.mm_processor.process([10, 20, 383, 30, 40, 50], [png_bytes(40, 56)])
    engine.add_request("img", ids, params, mm_inputs=mm)
    engine.add_request("text", list(range(5, 30)), params)
    return finished_tokens(engine)


@pytest.mark.parametrize("arch, ep", [("Qwen3VLForConditionalGeneration", False),
                                      ("Qwen3VLMoeForConditionalGeneration", False),
                                      ("Qwen3VLMoeForConditionalGeneration", True)])
def test_image_request_matches_single_process(arch, ep, registry, tmp_path):
    path = save_hf_checkpoint(arch, tmp_path / "vl", registry, seed=3)
    small_processor_config(path)
    options = dict(max_prefill_tokens=24, block_size=16, dtype="float32")
    single = _greedy(make_engine(path, **options))
    engine = make_engine(path, tp=2, ep=ep, **options)
    try:
        parallel = _greedy(engine)
    finally:
        engine.runner.shutdown()
    assert_same(parallel, single)
    assert len(single["img"][0]) == 8
