"""Guided decoding pieces: constraint params, OpenAI mapping, compiler errors, matchers, masks."""

import numpy as np
import pytest

from atlas_core.engine import SamplingParams
from atlas_core.guided import (GrammarCompiler, GuidedDecodingError, GuidedDecodingParams,
                               fill_bitmasks, guided_from_openai)
from atlas_core.ops import reference as ref
from atlas_core.testing.tiny_tokenizer import write_tokenizer
from atlas_core.tokenizer import Tokenizer

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    write_tokenizer(path, 384)
    return Tokenizer.from_dir(path)


@pytest.fixture(scope="module")
def compiler(tokenizer):
    return GrammarCompiler(tokenizer)


def allowed(matcher):
    row = np.zeros(matcher.bitmask_width, np.int32)
    matcher.fill_bitmask(row)
    bits = np.unpackbits(row.view(np.uint8), bitorder="little")[:matcher.vocab_size]
    return set(np.flatnonzero(bits).tolist())


def test_params_validate_kind_and_spec():
    with pytest.raises(GuidedDecodingError, match="kind must be one of"):
        GuidedDecodingParams("yaml", "x")
    with pytest.raises(GuidedDecodingError, match="needs a JSON schema"):
        GuidedDecodingParams("json_schema", "{}")
    with pytest.raises(GuidedDecodingError, match="format must be one of"):
        GuidedDecodingParams.tool_call([WEATHER], "xml")
    with pytest.raises(GuidedDecodingError, match="non-empty name"):
        GuidedDecodingParams.tool_call([{"type": "function", "function": {}}])
    with pytest.raises(ValueError, match="guided must be a GuidedDecodingParams"):
        SamplingParams(guided={"type": "json_object"})
    a, b = GuidedDecodingParams.json_schema({"a": 1, "b": 2}), GuidedDecodingParams.json_schema({"b": 2, "a": 1})
    assert a.key == b.key and hash(a) == hash(b)


def test_guided_from_openai_mapping():
    assert guided_from_openai() is None
    assert guided_from_openai(response_format={"type": "text"}) is None
    assert guided_from_openai(tools=[WEATHER], tool_choice="auto", tool_parser="hermes") is None
    assert guided_from_openai(response_format={"type": "json_object"}).kind == "json_object"
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    g = guided_from_openai(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": schema, "strict": True}})
    assert (g.kind, g.spec) == ("json_schema", schema)
    g = guided_from_openai(response_format={"type": "json_object"}, tools=[WEATHER],
                           tool_choice="required", tool_parser="qwen3_coder", parallel_tool_calls=False)
    assert g.kind == "tool_call" and g.spec.format == "qwen3_coder" and not g.spec.parallel
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert [t["name"] for t in guided_from_openai(
        tools=[WEATHER, {"name": "other"}], tool_choice=named, tool_parser="hermes").spec.tools] \
        == ["get_weather"]
    anthropic = [{"name": "get_weather", "input_schema": {"type": "object"}}]
    g = guided_from_openai(tools=anthropic, tool_choice={"type": "tool", "name": "get_weather"},
                           tool_parser="hermes")
    assert g.spec.tools[0]["parameters"] == {"type": "object"}
    assert guided_from_openai(tools=anthropic, tool_choice={"type": "any"}, tool_parser="hermes")


@pytest.mark.parametrize("kwargs,message", [
    (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}},
          tool_parser="hermes"), "names function 'nope', which is not in tools"),
    (dict(tools=[WEATHER], tool_choice="required"), "--tool-call-parser"),
    (dict(tool_choice="required", tool_parser="hermes"), "at least one tool"),
    (dict(tool_choice="sometimes"), "tool_choice must be"),
    (dict(response_format={"type": "yaml"}), "response_format type must be"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x"}}), "needs a 'schema'"),
])
def test_guided_from_openai_errors(kwargs, message):
    with pytest.raises(GuidedDecodingError, match=message):
        guided_from_openai(**kwargs)


@pytest.mark.parametrize("params,message", [
    (GuidedDecodingParams.json_schema({"type": "objectx"}), "invalid JSON schema: .*objectx"),
    (GuidedDecodingParams.json_schema({"type": "string", "pattern": "(("}), "invalid JSON schema"),
    (GuidedDecodingParams.regex("(("), "invalid regex"),
    (GuidedDecodingParams.grammar("start: missing"), "invalid Lark grammar"),
    (GuidedDecodingParams.tool_call([{"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"type": "nope"}}}}]), "invalid parameters schema of tool 'f'"),
])
def test_compiler_errors_are_one_line_value_errors(compiler, params, message):
    with pytest.raises(ValueError, match=message) as info:
        compiler.check(params)
    assert isinstance(info.value, GuidedDecodingError) and "\n" not in str(info.value)


def test_matcher_masks_consumes_rolls_back_and_replays(compiler, tokenizer):
    m = compiler.matcher(GuidedDecodingParams.regex("ab|ac"))
    a, b, c = (tokenizer.token_to_id(x) for x in "abc")
    assert a in allowed(m) and b not in allowed(m)
    assert m.consume(a) and allowed(m) >= {b, c} and not m.is_finished()
    assert m.consume(c) and m.is_finished() and m.is_accepting()
    assert m.rollback(1) and m.num_tokens == 1 and b in allowed(m)
    m.sync([a, b])
    assert m.num_tokens == 2 and m.is_finished()
    m.sync([a])
    assert allowed(m) >= {b, c}
    assert not m.consume(a) and m.error


def test_reference_op_applies_llguidance_masks(compiler, tokenizer):
    matchers = [compiler.matcher(GuidedDecodingParams.regex("[0-9]+")), None,
                compiler.matcher(GuidedDecodingParams.json_object())]
    bitmask = np.zeros((4, matchers[0].bitmask_width), np.int32)
    fill_bitmasks(matchers, bitmask)
    assert (bitmask[1] == -1).all()
    for i in (0, 2):
        row = np.zeros_like(bitmask[i])
        matchers[i].fill_bitmask(row)
        np.testing.assert_array_equal(bitmask[i], row)
    logits = np.random.default_rng(0).standard_normal((3, 384)).astype(np.float32)
    out = ref.apply_token_bitmask(logits, bitmask[:3])
    finite = [set(np.flatnonzero(np.isfinite(r)).tolist()) for r in out]
    assert finite[0] == allowed(matchers[0]) and finite[2] == allowed(matchers[2])
    assert tokenizer.token_to_id("7") in finite[0] and tokenizer.token_to_id("{") in finite[2]
    np.testing.assert_array_equal(out[1], logits[1])


def test_hermes_call_starts_with_the_tool_call_token(compiler, tokenizer):
    m = compiler.matcher(guided_from_openai(tools=[WEATHER], tool_choice="required",
                                            tool_parser="hermes"))
    assert allowed(m) == {tokenizer.token_to_id("<tool_call>")}


def test_qwen3_coder_string_values_cannot_close_the_call_early(compiler, tokenizer):
    params = guided_from_openai(tools=[WEATHER], tool_choice="required", tool_parser="qwen3_coder")
    head = "<tool_call>\n<function=get_weather>\n<parameter=city>\n"
    ok = compiler.matcher(params)
    ids = tokenizer.encode(head + "a <b> </x>\n</parameter>\n</function>\n</tool_call>")
    assert all(ok.consume(t) for t in ids) and ok.is_accepting()
    bad = compiler.matcher(params)
    ids = tokenizer.encode(head + "a</function>")
    assert not all(bad.consume(t) for t in ids)


def test_engine_refuses_bad_schema_before_queueing(tmp_path):
    from atlas_core.llm import LLM
    from atlas_core.testing.checkpoints import write_tiny_checkpoint
    llm = LLM(str(write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path)), backend="numpy",
              num_kv_blocks=16)
    bad = SamplingParams(guided=GuidedDecodingParams.json_schema({"type": "objectx"}))
    with pytest.raises(GuidedDecodingError, match="invalid JSON schema"):
        llm.engine.validate_request([1, 2], bad)
    with pytest.raises(GuidedDecodingError):
        llm.engine.add_request("r", [1, 2], bad)
    assert not llm.engine.has_unfinished_requests()
