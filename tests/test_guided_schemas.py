"""Structured outputs end to end: random JSON schemas, a tiny random Qwen3 sampling at
temperature 1, and every output parses and validates (the grammar forces termination)."""

import json
import re
import random

import jsonschema
import pytest

from atlas_core.engine import SamplingParams
from atlas_core.guided import GuidedDecodingParams
from atlas_core.llm import LLM
from atlas_core.testing.checkpoints import write_tiny_checkpoint

pytestmark = pytest.mark.timeout(300)

NAMES = ["id", "name", "city", "tags", "score", "items", "kind", "ok", "count", "meta", "x", "y"]


def random_leaf(rng: random.Random) -> dict:
    kind = rng.choice(["integer", "number", "string", "enum", "boolean", "nullable"])
    if kind == "integer":
        low = rng.randint(-50, 50)
        schema = {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 200)}
        if rng.random() < 0.3:
            schema["exclusiveMinimum"] = schema.pop("minimum") - 1
        return schema
    if kind == "number":
        low = round(rng.uniform(-10, 10), 2)
        return {"type": "number", "minimum": low, "maximum": low + rng.choice([0.5, 3, 100])}
    if kind == "string":
        low = rng.randint(0, 2)
        return {"type": "string", "minLength": low, "maxLength": low + rng.randint(0, 6)}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", 1, 2.5, None, True], rng.randint(1, 4))}
    if kind == "boolean":
        return {"type": "boolean"}
    return {"type": ["string", "null"], "maxLength": 4}


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    """An object schema: nested objects and arrays (bounded), enums, bounded numbers, strings
    with lengths, required and optional fields; never open-ended, so outputs are finite."""
    props = {}
    for name in rng.sample(NAMES, rng.randint(1, 4 if depth == 0 else 2)):
        roll = rng.random()
        if depth < 2 and roll < 0.2:
            props[name] = random_schema(rng, depth + 1)
        elif depth < 2 and roll < 0.4:
            low = rng.randint(0, 2)
            items = random_schema(rng, depth + 1) if rng.random() < 0.3 else random_leaf(rng)
            props[name] = {"type": "array", "items": items, "minItems": low,
                           "maxItems": low + rng.randint(0, 2)}
        else:
            props[name] = random_leaf(rng)
    required = [n for n in props if rng.random() < 0.6]
    return {"type": "object", "properties": props, "required": required,
            "additionalProperties": False}


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path_factory.mktemp("qwen3-guided"))
    return LLM(str(path), backend="numpy", num_kv_blocks=512, max_num_seqs=32)


def guided(schema, seed, max_tokens=400, **kwargs):
    return SamplingParams(temperature=1.0, seed=seed, max_tokens=max_tokens,
                          guided=GuidedDecodingParams.json_schema(schema), **kwargs)


def assert_valid(output, schema):
    assert output.finish_reason == "stop", f"did not finish: {output.text!r}"
    jsonschema.validate(json.loads(output.text), schema)


@pytest.mark.parametrize("block", range(5))
def test_random_schemas_always_validate(llm, block):
    rng = random.Random(1000 + block)
    schemas = [random_schema(rng) for _ in range(10)]
    params = [guided(s, seed) for s in schemas for seed in (block, block + 100)]
    outs = llm.generate(["Reply in JSON."] * len(params), params)
    for out, p in zip(outs, params):
        assert_valid(out.outputs[0], p.guided.spec)


def test_n_siblings_each_follow_the_grammar(llm):
    schema = random_schema(random.Random(7))
    out = llm.generate("Reply in JSON.", guided(schema, 3, n=4))[0]
    for completion in out.outputs:
        assert_valid(completion, schema)
    assert len({c.text for c in out.outputs}) > 1


def test_preemption_keeps_matchers_in_step(tmp_path):
    path = write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path)
    small = LLM(str(path), backend="numpy", num_kv_blocks=12, block_size=16, max_num_seqs=8)
    schema = {"type": "object", "properties": {"v": {"type": "array", "items": {
        "type": "string", "minLength": 4, "maxLength": 6}, "minItems": 6, "maxItems": 8}},
        "required": ["v"], "additionalProperties": False}
    params = [guided(schema, seed, max_tokens=150) for seed in range(8)]
    outs = small.generate([[5] * 10] * 8, params)
    assert small.engine.stats().num_preemptions > 0
    for out in outs:
        assert_valid(out.outputs[0], schema)


def test_json_object_regex_and_grammar(llm):
    regex = GuidedDecodingParams.regex(r"(yes|no), [0-9]{2,3}")
    lark = GuidedDecodingParams.grammar('start: "x=" NUM ";"\nNUM: /[1-9][0-9]{0,3}/')
    outs = llm.generate(["q"] * 3, [
        SamplingParams(temperature=1.0, seed=1, max_tokens=40, guided=regex),
        SamplingParams(temperature=1.0, seed=2, max_tokens=40, guided=lark),
        SamplingParams(temperature=1.0, seed=3, max_tokens=8, guided=GuidedDecodingParams.json_object()),
    ])

    assert re.fullmatch(r"(yes|no), [0-9]{2,3}", outs[0].outputs[0].text)
    assert re.fullmatch(r"x=[1-9][0-9]{0,3};", outs[1].outputs[0].text)
    assert outs[2].outputs[0].text.startswith("{")


def test_unguided_requests_in_the_same_batch_are_untouched(llm):
    plain = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    alone = llm.generate([[11, 12, 13]], plain)[0].outputs[0].token_ids
    mixed = llm.generate([[11, 12, 13], [11, 12, 13]], [plain, guided(random_schema(random.Random(3)), 1)])
    assert mixed[0].outputs[0].token_ids == alone
