"""Forced tool calls: a tiny random Qwen3 at temperature 1 always emits calls that the format's
own parser reads, naming a given tool, with arguments valid against its parameter schema."""

import dataclasses
import json
import random

import jsonschema
import pytest

from atlas_core.engine import SamplingParams
from atlas_core.guided import TOOL_CALL_FORMATS, guided_from_openai
from atlas_core.llm import LLM
from atlas_core.parsers import get_tool_parser
from atlas_core.testing.checkpoints import write_tiny_checkpoint

pytestmark = pytest.mark.timeout(300)


def tool(name, properties, required):
    return {"type": "function", "function": {
        "name": name, "description": f"{name} tool",
        "parameters": {"type": "object", "properties": properties, "required": required}}}


TOOLS = [
    tool("get_weather", {"city": {"type": "string", "minLength": 1, "maxLength": 8},
                         "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                         "days": {"type": "integer", "minimum": 1, "maximum": 14}}, ["city"]),
    tool("search", {"query": {"type": "string", "maxLength": 10},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 5},
                    "exact": {"type": "boolean"},
                    "filters": {"type": "array", "maxItems": 2,
                                "items": {"type": "string", "enum": ["news", "code"]}}},
           ["query", "limit"]),
    tool("noop", {}, []),
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path_factory.mktemp("qwen3-tools"))
    return LLM(str(path), backend="numpy", num_kv_blocks=512, max_num_seqs=32)


def generate(llm, fmt, tool_choice, seeds, parallel=True, tools=TOOLS):
    guided = guided_from_openai(tools=tools, tool_choice=tool_choice, tool_parser=fmt,
                                parallel_tool_calls=parallel)
    # A random model chains calls freely; bound them so every output ends within max_tokens.
    guided = dataclasses.replace(guided, spec=dataclasses.replace(guided.spec, max_calls=3))
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=300, guided=guided,
                             skip_special_tokens=False) for s in seeds]
    prompt = llm.engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the weather in Paris?"}])
    return [o.outputs[0] for o in llm.generate([prompt] * len(params), params)]


def parse_calls(fmt, output, tools=TOOLS):
    assert output.finish_reason == "stop", f"did not finish: {output.text!r}"
    text = output.text.removesuffix("<|im_end|>")
    parsed = get_tool_parser(fmt)(tools).parse(text)
    assert parsed.content == "", f"text outside calls: {parsed.content!r} in {output.text!r}"
    assert parsed.tool_calls, f"no call parsed from {output.text!r}"
    for call in parsed.tool_calls:
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    return parsed.tool_calls


@pytest.mark.parametrize("fmt", TOOL_CALL_FORMATS)
def test_required_tool_call_always_parses_and_validates(llm, fmt):
    outputs = generate(llm, fmt, "required", range(12))
    names = {call.name for out in outputs for call in parse_calls(fmt, out)}
    assert names <= set(SCHEMAS) and len(names) > 1


@pytest.mark.parametrize("fmt", ["hermes", "qwen3_coder", "minimax_m2"])
def test_named_tool_choice_always_calls_that_function(llm, fmt):
    choice = {"type": "function", "function": {"name": "search"}}
    for out in generate(llm, fmt, choice, range(10)):
        assert {call.name for call in parse_calls(fmt, out)} == {"search"}


@pytest.mark.parametrize("fmt", ["hermes", "qwen3_coder", "minimax_m2"])
def test_parallel_calls_only_when_allowed(llm, fmt):
    single = generate(llm, fmt, "required", range(10), parallel=False)
    assert all(len(parse_calls(fmt, out)) == 1 for out in single)
    many = generate(llm, fmt, "required", range(20), parallel=True)
    assert max(len(parse_calls(fmt, out)) for out in many) > 1
    assert max(len(parse_calls(fmt, out)) for out in many) <= 3


def test_qwen3_coder_raw_string_values(llm):
    code = [tool("run", {"code": {"type": "string", "maxLength": 12}}, ["code"])]
    SCHEMAS["run"] = code[0]["function"]["parameters"]
    for out in generate(llm, "qwen3_coder", "required", range(10), tools=code):
        for call in parse_calls("qwen3_coder", out, code):
            assert call.name == "run" and isinstance(json.loads(call.arguments)["code"], str)


def test_random_tool_schemas_hermes(llm):
    rng = random.Random(5)
    from test_guided_schemas import random_schema
    tools = [tool(f"fn_{i}", **_split(random_schema(rng))) for i in range(5)]
    SCHEMAS.update({t["function"]["name"]: t["function"]["parameters"] for t in tools})
    for out in generate(llm, "hermes", "required", range(10), tools=tools):
        parse_calls("hermes", out, tools)


def _split(schema):
    return {"properties": schema["properties"], "required": schema["required"]}
