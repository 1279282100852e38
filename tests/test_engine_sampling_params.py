"""SamplingParams and EngineArgs validation: clear errors naming the field and its range."""

import pytest

from atlas_core.engine import EngineArgs, SamplingParams


@pytest.mark.parametrize("kwargs, field", [
    ({"n": 0}, "n"), ({"max_tokens": 0}, "max_tokens"), ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"), ({"temperature": -0.1}, "temperature"),
    ({"top_p": -0.1}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"top_k": -2}, "top_k"),
    ({"min_p": 2.0}, "min_p"), ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"presence_penalty": 3.0}, "presence_penalty"), ({"frequency_penalty": -2.5}, "frequency_penalty"),
    ({"logit_bias": {1: 200.0}}, "logit_bias"), ({"seed": -1}, "seed"), ({"stop": [""]}, "stop"),
    ({"stop_token_ids": [-3]}, "stop_token_ids"), ({"logprobs": 21}, "logprobs"),
    ({"prompt_logprobs": -1}, "prompt_logprobs"),
])
def test_invalid_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field} must be"):
        SamplingParams(**kwargs)


def test_defaults_and_normalisation():
    p = SamplingParams(stop="END", top_k=-1, logit_bias={"5": 1})
    assert p.stop == ["END"] and p.top_k == 0 and p.logit_bias == {5: 1.0}
    assert not SamplingParams().is_greedy and SamplingParams(temperature=0).is_greedy
    assert SamplingParams(presence_penalty=0.5).has_penalties and not SamplingParams().has_penalties
    assert SamplingParams(max_tokens=None).max_tokens is None


def test_vocab_checks():
    with pytest.raises(ValueError, match="stop_token_ids must be token ids in"):
        SamplingParams(stop_token_ids=[100]).validate_vocab(64)


@pytest.mark.parametrize("kwargs", [{"max_num_seqs": 0}, {"gpu_memory_utilization": 1.5},
                                    {"kv_cache_dtype": "int4"}, {"num_kv_blocks": 0}])
def test_engine_args_validation(kwargs):
    with pytest.raises(ValueError):
        EngineArgs(**kwargs)


def test_engine_args_batch_default():
    assert EngineArgs(max_num_seqs=7).max_batch_size == 7
