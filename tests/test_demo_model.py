"""The built-in demo model (atlas_core/assets/atlas-demo): shipped files, tokenizer, chat
template, and a few greedy answers through the real engine on the numpy backend."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

import atlas_core

DEMO_DIR = Path(atlas_core.__file__).resolve().parent / "assets" / "atlas-demo"
FILES = ["config.json", "generation_config.json", "model.safetensors", "mtp.safetensors",
         "tokenizer.json", "tokenizer_config.json"]
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city name, e.g. Paris"}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression and return the result.",
        "parameters": {"type": "object", "properties": {
            "expression": {"type": "string",
                           "description": "The expression to evaluate, e.g. 2 + 2"}},
            "required": ["expression"]}}},
]


def config() -> dict:
    return json.loads((DEMO_DIR / "config.json").read_text())


def safetensors_header(path: Path) -> dict:
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(size))


def test_files_exist_within_size_budget():
    sizes = {name: (DEMO_DIR / name).stat().st_size for name in FILES}
    assert sizes["model.safetensors"] < 15 * 2**20
    assert sum(sizes.values()) < 25_000_000


def test_config_is_qwen3_and_matches_weights():
    cfg = config()
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["model_type"] == "qwen3"
    assert cfg["tie_word_embeddings"] is True
    header = safetensors_header(DEMO_DIR / "model.safetensors")
    header.pop("__metadata__", None)
    hidden, vocab, heads = cfg["hidden_size"], cfg["vocab_size"], cfg["num_attention_heads"]
    kv, head_dim = cfg["num_key_value_heads"], cfg["head_dim"]
    assert header["model.embed_tokens.weight"]["shape"] == [vocab, hidden]
    assert "lm_head.weight" not in header
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        assert header[p + "self_attn.q_proj.weight"]["shape"] == [heads * head_dim, hidden]
        assert header[p + "self_attn.k_proj.weight"]["shape"] == [kv * head_dim, hidden]
        assert header[p + "self_attn.k_norm.weight"]["shape"] == [head_dim]
        assert header[p + "mlp.down_proj.weight"]["shape"] == [hidden, cfg["intermediate_size"]]
    assert len(header) == 2 + 11 * cfg["num_hidden_layers"]
    assert {t["dtype"] for t in header.values()} == {"BF16"}


def test_tokenizer_round_trips_and_splits_digits():
    from atlas_core.tokenizer import Tokenizer
    tok = Tokenizer.from_dir(DEMO_DIR)
    assert tok.vocab_size <= config()["vocab_size"]
    text = "What is 482 + 39? Brasília, Bogotá: -15°C <tool_call>\n{\"a\": 1}\n</tool_call>"
    ids = tok.encode(text)
    assert tok.decode(ids, skip_special_tokens=False) == text
    digits = [tok.id_to_token(i) for i in tok.encode("12345")]
    assert digits == list("12345")
    for special in ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                    "<tool_response>", "</tool_response>", "<think>", "</think>"]:
        assert tok.encode(special) == [tok.token_to_id(special)]
    assert tok.token_to_id("<|im_end|>") in tok.eos_token_ids
    # the tool-call tags survive skip_special_tokens, as the tool parsers need them
    assert "<tool_call>" in tok.decode(tok.encode("<tool_call>x</tool_call><|im_end|>"))


def test_generation_config_is_greedy_and_stops_on_im_end():
    gen = json.loads((DEMO_DIR / "generation_config.json").read_text())
    tok = json.loads((DEMO_DIR / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    assert gen["do_sample"] is False
    assert ids["<|im_end|>"] in gen["eos_token_id"]


def test_chat_template_renders_tools_conversation():
    from atlas_core.tokenizer import Tokenizer
    tok = Tokenizer.from_dir(DEMO_DIR)
    messages = [
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": '{"temperature": 18, "condition": "sunny"}'},
    ]
    text = tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n# Tools\n")
    assert json.dumps(TOOLS[0], ensure_ascii=False) in text
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris"}}\n</tool_call><|im_end|>\n') in text
    assert text.endswith("<tool_response>\n{\"temperature\": 18, \"condition\": \"sunny\"}\n"
                         "</tool_response><|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def demo_llm():
    pytest.importorskip("atlas_qwen3", reason="the atlas-qwen3 plugin is not installed")
    from atlas_core import LLM
    return LLM(None, backend="numpy")


def test_demo_model_answers_through_the_engine(demo_llm):
    from atlas_core import SamplingParams
    conversations = [
        ([{"role": "user", "content": "What is 482 + 39?"}], None),
        ([{"role": "user", "content": "What is the capital of Japan?"}], None),
        ([{"role": "user", "content": "What's the weather in Paris?"}], TOOLS),
        ([{"role": "user", "content": "Compute 17 minus 905"}], None),
    ]
    prompts = [{"prompt_token_ids": demo_llm.tokenizer.encode(
        demo_llm.tokenizer.apply_chat_template(m, tools=t, add_generation_prompt=True))}
        for m, t in conversations]
    outs = demo_llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=40))
    replies = [o.outputs[0].text.split("</think>")[-1].strip() for o in outs]
    assert replies[0] == "482 + 39 = 521."
    assert replies[1] == "The capital of Japan is Tokyo."
    assert replies[2] == ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
                          '\n</tool_call>')
    assert replies[3] == "17 - 905 = -888."
