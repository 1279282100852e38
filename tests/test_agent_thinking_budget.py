"""Engine thinking budgets: the think block is ended by forced tokens, then sampling goes on."""

from __future__ import annotations

import pytest

from atlas_core.engine import SamplingParams
from atlas_core.testing.fake_model import FakeCausalLM, make_fake_engine, run_to_completion
from atlas_core.plugins import Registry

START, END, NEWLINE, WORD, CLOSE_AT = 5, 6, 7, 9, 8
PROMPT = [1, 2, 3]


def engine_with(script):
    backend = Registry().create("gpu_backends", "numpy")
    return make_fake_engine(FakeCausalLM(backend, script=script), eos_token_ids={0})


def run(engine, **params):
    sp = SamplingParams(max_tokens=10, temperature=0, thinking_end_token_ids=[END, NEWLINE],
                        **params)
    engine.add_request("r", PROMPT, sp)
    return run_to_completion(engine)["r"].outputs[0].token_ids


def always_words(context):
    return START if len(context) == len(PROMPT) else WORD


def test_budget_forces_end_after_start_token():
    ids = run(engine_with(always_words), thinking_budget=3, thinking_start_token_ids=[START])
    assert ids == [START, WORD, WORD, WORD, END, NEWLINE, WORD, WORD, WORD, WORD]


def test_budget_when_prompt_opened_the_block():
    ids = run(engine_with(lambda c: WORD), thinking_budget=2)
    assert ids == [WORD, WORD, END, NEWLINE] + [WORD] * 6


def test_zero_budget_closes_at_once():
    ids = run(engine_with(lambda c: WORD), thinking_budget=0)
    assert ids[:3] == [END, NEWLINE, WORD]


def test_block_closed_by_the_model_is_left_alone():
    def closes(context):
        return END if len(context) == len(PROMPT) + 2 else WORD
    ids = run(engine_with(closes), thinking_budget=4)
    assert ids == [WORD, WORD, END] + [WORD] * 7


def test_no_block_when_first_token_is_not_the_start():
    ids = run(engine_with(lambda c: WORD), thinking_budget=1, thinking_start_token_ids=[START])
    assert ids == [WORD] * 10


def test_budget_needs_end_ids():
    with pytest.raises(ValueError, match="thinking_end_token_ids"):
        SamplingParams(thinking_budget=3)
    with pytest.raises(ValueError, match="thinking_budget"):
        SamplingParams(thinking_budget=-1, thinking_end_token_ids=[1])
