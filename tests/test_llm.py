"""The offline LLM API on a tiny Qwen3 checkpoint."""

import pytest

from atlas_core import LLM, SamplingParams
from atlas_core.engine import loading
from atlas_core.plugins import Registry
from atlas_core.testing.checkpoints import write_tiny_checkpoint

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path_factory.mktemp("qwen3"))
    return LLM(str(path), backend="numpy", num_kv_blocks=64, max_num_seqs=4)


def test_generate_text_prompts_in_order(llm):
    params = SamplingParams(temperature=0, max_tokens=5, logprobs=2, ignore_eos=True)
    outs = llm.generate(["Hello", "The quick brown fox"], params)
    assert [o.prompt for o in outs] == ["Hello", "The quick brown fox"]
    assert outs[0].prompt_token_ids == llm.tokenizer.encode("Hello")
    for out in outs:
        c = out.outputs[0]
        assert out.finished and len(c.token_ids) == 5 and c.finish_reason == "length"
        assert c.text == llm.tokenizer.decode(c.token_ids)
        assert len(c.logprobs) == 5 and all(len(lp.top) == 2 for lp in c.logprobs)
    again = llm.generate({"prompt_token_ids": outs[1].prompt_token_ids}, params)
    assert again[0].outputs[0].token_ids == outs[1].outputs[0].token_ids


def test_token_id_prompts_and_per_prompt_params(llm):
    outs = llm.generate([[1, 2, 3], [4, 5]], [SamplingParams(max_tokens=2, ignore_eos=True),
                                              SamplingParams(max_tokens=3, ignore_eos=True)])
    assert [len(o.outputs[0].token_ids) for o in outs] == [2, 3]
    single = llm.generate([7, 8, 9], SamplingParams(max_tokens=1))
    assert len(single) == 1 and single[0].prompt_token_ids == [7, 8, 9]
    with pytest.raises(ValueError, match="2 sampling_params for 1 prompts"):
        llm.generate(["a"], [SamplingParams(), SamplingParams()])


def test_default_params_come_from_generation_config(llm):
    outs = llm.generate(["Hello", "Hello"])
    assert outs[0].outputs[0].token_ids == outs[1].outputs[0].token_ids


def test_chat_uses_the_template(llm):
    out = llm.chat([{"role": "user", "content": "Hi"}], SamplingParams(max_tokens=3))[0]
    assert out.prompt.startswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant")
    many = llm.chat([[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]],
                    SamplingParams(max_tokens=1))
    assert len(many) == 2


def test_unknown_engine_argument():
    with pytest.raises(TypeError, match="unknown engine argument.*max_num_seq\\b"):
        LLM("x", max_num_seq=3)


def test_missing_demo_model(monkeypatch, tmp_path):
    monkeypatch.setattr(loading, "DEMO_MODEL_DIR", tmp_path / "atlas-demo")
    with pytest.raises(FileNotFoundError, match="built-in demo model is missing"):
        LLM(backend="numpy")


def test_default_backend(monkeypatch):
    reg = Registry()
    monkeypatch.setenv("ATLAS_BACKEND", "mock")
    assert loading.default_backend_name(reg) == "mock"
    monkeypatch.delenv("ATLAS_BACKEND")
    monkeypatch.setattr(loading, "gpu_present", lambda: False)
    assert loading.default_backend_name(reg) == "numpy"
