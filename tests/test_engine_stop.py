"""Stop tokens, EOS, stop strings across token boundaries, min_tokens, streamed text deltas."""

import pytest

from atlas_core.engine import SamplingParams
from atlas_core.testing.fake_model import FakeCausalLM, make_fake_engine, scripted
from atlas_core.engine.stop import holdback
from atlas_core.plugins import Registry
from atlas_core.testing.tiny_tokenizer import write_tokenizer
from atlas_core.tokenizer import Tokenizer

PROMPT = [358, 290, 277]
EOS = 379


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    write_tokenizer(path, 384)
    return Tokenizer.from_dir(path)


def run(tok, continuation, **params):
    backend = Registry().create("gpu_backends", "numpy")
    model = FakeCausalLM(backend, vocab_size=384, script=scripted(PROMPT, continuation))
    engine = make_fake_engine(model, tokenizer=tok)
    engine.add_request("r", PROMPT, SamplingParams(temperature=0, **params))
    stream = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            stream.append(out)
    return stream


def text_ids(tok, text):
    return tok.encode(text)


def test_holdback():
    assert holdback("abc S", ["STOP"]) == 1
    assert holdback("abc ST", ["STOP", "T"]) == 2
    assert holdback("abc", ["STOP"]) == 0
    assert holdback("xxSTO", ["STOP"]) == 3


@pytest.mark.parametrize("include, expected", [(False, "Hello world "), (True, "Hello world STOP")])
def test_stop_string_across_tokens(tok, include, expected):
    ids = text_ids(tok, "Hello world STOP here")
    stream = run(tok, ids, max_tokens=30, stop=["STOP"], include_stop_str_in_output=include)
    final = stream[-1].outputs[0]
    assert final.text == expected
    assert final.finish_reason == "stop" and final.stop_reason == "STOP"
    assert final.token_ids == ids[:12]
    assert "".join(o.outputs[0].new_text for o in stream) == expected
    for out in stream[:-1]:
        assert "S" not in out.outputs[0].text


def test_eos_ends_and_is_kept_as_token_not_text(tok):
    ids = text_ids(tok, "Hello") + [EOS, 75]
    final = run(tok, ids, max_tokens=30)[-1].outputs[0]
    assert final.token_ids == ids[:-1] and final.text == "Hello"
    assert final.finish_reason == "stop" and final.stop_reason is None


def test_ignore_eos_runs_to_max_tokens(tok):
    ids = text_ids(tok, "Hello") + [EOS]
    final = run(tok, ids, max_tokens=8, ignore_eos=True)[-1].outputs[0]
    assert len(final.token_ids) == 8 and final.finish_reason == "length"


def test_stop_token_ids(tok):
    ids = text_ids(tok, "Hello world")
    final = run(tok, ids, max_tokens=30, stop_token_ids=[81])[-1].outputs[0]
    assert final.token_ids[-1] == 81 and final.stop_reason == 81
    assert final.text == "Hello wo"
    with_text = run(tok, ids, max_tokens=30, stop_token_ids=[81],
                    include_stop_str_in_output=True)[-1].outputs[0]
    assert with_text.text == "Hello wor"


def test_min_tokens_masks_eos_and_stop_strings(tok):
    final = run(tok, [EOS, EOS, EOS], max_tokens=10, min_tokens=3)[-1].outputs[0]
    assert EOS not in final.token_ids[:3]
    assert len(final.token_ids) >= 3
    ids = text_ids(tok, "Hello world")
    early = run(tok, ids, max_tokens=len(ids), stop=["Hel"], min_tokens=4)[-1].outputs[0]
    assert early.finish_reason == "length" and len(early.token_ids) == len(ids)


def test_utf8_never_half_a_character(tok):
    ids = text_ids(tok, "café 東京")
    stream = run(tok, ids, max_tokens=len(ids))
    assert stream[-1].outputs[0].text == "café 東京"
    assert all("\ufffd" not in o.outputs[0].new_text for o in stream)


def test_stop_strings_need_a_tokenizer():
    engine = make_fake_engine()
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        engine.add_request("r", [1, 2], SamplingParams(stop=["x"]))


def test_length_releases_held_text(tok):
    ids = text_ids(tok, "Hello world S")
    final = run(tok, ids, max_tokens=len(ids), stop=["STOP"])[-1].outputs[0]
    assert final.text == "Hello world S" and final.finish_reason == "length"
