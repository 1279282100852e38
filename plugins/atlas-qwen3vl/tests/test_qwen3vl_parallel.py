"""Qwen3-VL split over two processes (numpy backend, ``cpu`` comm): the language model split as
usual, the vision tower held whole by every rank (each encodes the step's images itself); an
image request next to a text request, its image spread over prefill chunks, gives the
single-process greedy tokens and logprobs, dense and MoE (tensor and expert parallel). The
image's pixels go to the workers only with the prefill chunks holding its placeholder tokens
(each of them when the image is split), never with decode steps."""

from __future__ import annotations

import pickle

import pytest

pytest.importorskip("torch")

from qwen3vl_checkpoints import png_bytes, save_hf_checkpoint, small_processor_config  # noqa: E402

from atlas_core.testing.parallel import assert_same, finished_tokens, make_engine  # noqa: E402

pytestmark = pytest.mark.timeout(240)


def _greedy(engine) -> tuple[dict, object]:
    from atlas_core.api import SamplingParams
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=1)
    # text before the image so its 8 placeholder tokens (20..27) straddle the 24-token chunks
    prompt = [10, 20, *range(60, 78), 383, 30, 40, 50]
    ids, mm = engine.model.mm_processor.process(prompt, [png_bytes(40, 56)])
    engine.add_request("img", ids, params, mm_inputs=mm)
    engine.add_request("text", list(range(5, 30)), params)
    return finished_tokens(engine), mm


def _record_steps(executor) -> list:
    """Every step description the engine sends its workers, with its pickled size."""
    sent, send = [], executor._send

    def record(kind, *payload):
        if kind in ("step", "launch"):
            sent.append((payload[0], len(pickle.dumps(payload[0], pickle.HIGHEST_PROTOCOL))))
        return send(kind, *payload)

    executor._send = record
    return sent


def _check_pixels_per_step(sent: list, mm) -> None:
    """Pixels only with the prefill chunks covering the image's placeholders; decode steps are
    smaller than the pixels alone; the engine's own payload keeps its pixels."""
    pixel_bytes = mm.images[0].pixel_values.nbytes
    image_steps = decode_steps = 0
    for desc, size in sent:
        for s in desc.sched.scheduled:
            if s.seq.mm is None:
                continue
            shipped = [i for i, img in enumerate(s.seq.mm.images) if img.pixel_values is not None]
            assert shipped == [i for i, *_ in mm.image_spans(s.start, s.num_tokens)]
            assert all(out is None for out in s.seq.mm.encoded)
            image_steps += bool(shipped)
            if s.start >= mm.num_prompt_tokens:
                decode_steps += 1
                assert not shipped and size < pixel_bytes
    assert image_steps == 2 and decode_steps == 7  # split over two chunks: sent with each
    assert mm.images[0].pixel_values is not None and mm.images[0].pixel_values.nbytes


@pytest.mark.parametrize("arch, ep", [("Qwen3VLForConditionalGeneration", False),
                                      ("Qwen3VLMoeForConditionalGeneration", False),
                                      ("Qwen3VLMoeForConditionalGeneration", True)])
def test_image_request_matches_single_process(arch, ep, registry, tmp_path):
    path = save_hf_checkpoint(arch, tmp_path / "vl", registry, seed=3)
    small_processor_config(path)
    options = dict(max_prefill_tokens=24, block_size=16, dtype="float32")
    single, _ = _greedy(make_engine(path, **options))
    engine = make_engine(path, tp=2, ep=ep, **options)
    sent = _record_steps(engine.runner)
    try:
        parallel, mm = _greedy(engine)
    finally:
        engine.runner.shutdown()
    assert_same(parallel, single)
    _check_pixels_per_step(sent, mm)
    assert len(single["img"][0]) == 8
