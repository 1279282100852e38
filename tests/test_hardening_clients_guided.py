"""vLLM guided-decoding fields through the llguidance path, and llguidance's EOS signature
(issue #30): ``guided_*`` / ``structured_outputs`` constrain the output instead of being ignored;
a model with several EOS ids compiles on llguidance that takes one EOS id or a list."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import llguidance
import numpy as np
import openai
import pytest

from atlas_core.guided import (GrammarCompiler, GuidedDecodingError, fill_bitmasks,
                               guided_from_vllm)
from atlas_core.guided.compiler import as_lark
from atlas_core.guided.params import GuidedDecodingParams
from atlas_core.guided.vllm import literal_regex
from atlas_core.server import ServerConfig, create_app
from atlas_core.server.launch import ServerThread
from atlas_core.testing.tiny_tokenizer import write_tokenizer
from atlas_core.tokenizer import Tokenizer
from test_server_support import tiny_engine

pytestmark = pytest.mark.timeout(180)

USER = [{"role": "user", "content": "Hi"}]
POINT = {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}},
         "required": ["x"], "additionalProperties": False}
CHOICES = ["yes.", "no (never)", "maybe+[x]"]


def test_vllm_fields_map_to_constraints():
    assert guided_from_vllm({}) == (None, "")
    params, param = guided_from_vllm({"guided_json": POINT})
    assert (params, param) == (GuidedDecodingParams.json_schema(POINT), "guided_json")
    assert guided_from_vllm({"guided_json": json.dumps(POINT)})[0] == params
    assert guided_from_vllm({"guided_regex": "[0-9]+"})[0] == GuidedDecodingParams.regex("[0-9]+")
    assert guided_from_vllm({"guided_grammar": "start: \"a\""})[0].kind == "grammar"
    choice = guided_from_vllm({"guided_choice": CHOICES})[0]
    assert choice.kind == "regex"
    assert all(re.fullmatch(_python_regex(choice.spec), c) for c in CHOICES)
    assert not re.fullmatch(_python_regex(choice.spec), "yesx")
    structured = guided_from_vllm({"structured_outputs": {"choice": ["a", "b"],
                                                          "disable_any_whitespace": True}})
    assert structured[1] == "structured_outputs.choice"
    assert guided_from_vllm({"structured_outputs": {"json": POINT}})[0] == params
    assert guided_from_vllm({"structured_outputs": {"json_object": True}})[0].kind == "json_object"


def _python_regex(spec: str) -> str:
    return re.sub(r"\\x\{([0-9A-F]+)\}", lambda m: re.escape(chr(int(m.group(1), 16))), spec)


@pytest.mark.parametrize("fields, message", [
    ({"guided_json": POINT, "guided_regex": "a"}, "guided_json, guided_regex each constrain"),
    ({"guided_choice": []}, "non-empty list"),
    ({"guided_json": "{not json"}, "not JSON"),
    ({"structured_outputs": {"structural_tag": "x"}}, "structural_tag is not supported"),
    ({"structured_outputs": {"json": POINT, "regex": "a"}}, "exactly one of"),
    ({"structured_outputs": {}}, "exactly one of"),
])
def test_vllm_field_errors(fields, message):
    with pytest.raises(GuidedDecodingError, match=message):
        guided_from_vllm(fields)


def test_literal_regex_escapes_everything_llguidance_reads_as_syntax():
    assert literal_regex("a.b") == "a\\x{2E}b" and literal_regex("é<x>") == "é\\x{3C}x\\x{3E}"


def test_gbnf_grammars_are_converted():
    assert as_lark('start: "a"') == 'start: "a"'
    assert "start" in as_lark('root ::= "yes" | "no"')


@pytest.fixture()
def two_eos_tokenizer(tmp_path):
    write_tokenizer(tmp_path, 384)
    tok = Tokenizer.from_dir(tmp_path)
    tok.eos_token_ids = {379, 380}
    return tok


def _allowed(matcher) -> set[int]:
    row = np.zeros(matcher.bitmask_width, np.int32)
    matcher.fill_bitmask(row)
    bits = np.unpackbits(row.view(np.uint8), bitorder="little")[:matcher.vocab_size]
    return set(np.flatnonzero(bits).tolist())


def _single_eos_llguidance(monkeypatch):
    """llguidance as it was before LLTokenizer took a list of EOS ids (e.g. 1.6.1)."""
    real = llguidance.LLTokenizer

    def one_eos(tokenizer, n_vocab=None, eos_token=None, slices=None):
        if isinstance(eos_token, list):
            raise TypeError("argument 'eos_token': 'list' object cannot be interpreted as an "
                            "integer")
        return real(tokenizer, n_vocab=n_vocab, eos_token=eos_token)
    monkeypatch.setattr(llguidance, "LLTokenizer", one_eos)


@pytest.mark.parametrize("single_eos_api", [False, True])
def test_several_eos_ids_end_a_grammar(two_eos_tokenizer, monkeypatch, single_eos_api):
    if single_eos_api:
        _single_eos_llguidance(monkeypatch)
    tok = two_eos_tokenizer
    compiler = GrammarCompiler(tok)
    compiler.check(GuidedDecodingParams.json_schema(POINT))
    for last in (379, 380):
        m = compiler.matcher(GuidedDecodingParams.regex("ab"))
        a, b = tok.encode("ab", add_special_tokens=False)
        assert m.consume(a) and 379 not in _allowed(m)
        assert m.consume(b) and {379, 380} <= _allowed(m)
        assert m.consume(last) and m.is_finished()
    pair = [compiler.matcher(GuidedDecodingParams.regex("a")) for _ in range(2)]
    for m in pair:
        m.consume(tok.encode("a", add_special_tokens=False)[0])
    bitmask = np.zeros((2, pair[0].bitmask_width), np.int32)
    fill_bitmasks(pair, bitmask)
    for row in bitmask:
        bits = np.unpackbits(row.view(np.uint8), bitorder="little")
        assert bits[379] and bits[380]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    engine = tiny_engine(tmp_path_factory.mktemp("tiny-vllm-guided"), max_seq_len=512)
    with ServerThread(create_app(engine, ServerConfig(served_model_names=["tiny"]))) as srv:
        yield srv
    engine.shutdown()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def chat(client, seed=0, **extra):
    reply = client.chat.completions.create(model="tiny", messages=USER, temperature=1.0,
                                           seed=seed, max_tokens=60, extra_body=extra)
    return reply.choices[0]


@pytest.mark.parametrize("seed", range(2))
def test_guided_choice(client, seed):
    assert chat(client, seed, guided_choice=CHOICES).message.content in CHOICES
    out = chat(client, seed, structured_outputs={"choice": CHOICES}).message.content
    assert out in CHOICES


def test_guided_regex_json_and_grammar(client):
    assert re.fullmatch(r"[0-9]{3}-[a-c]{2}",
                        chat(client, guided_regex=r"[0-9]{3}-[a-c]{2}").message.content)
    jsonschema.validate(json.loads(chat(client, guided_json=POINT).message.content), POINT)
    content = chat(client, structured_outputs={"json": POINT}).message.content
    jsonschema.validate(json.loads(content), POINT)
    assert chat(client, guided_grammar='root ::= "up" | "down"').message.content in ("up", "down")


def test_completions_honour_guided_fields(client):
    reply = client.completions.create(model="tiny", prompt="Answer:", temperature=1.0, seed=3,
                                      max_tokens=40, extra_body={"guided_regex": "(red|blue)!"})
    assert reply.choices[0].text in ("red!", "blue!")


@pytest.mark.parametrize("extra, message", [
    ({"guided_regex": "a", "guided_choice": ["b"]}, "send only one of them"),
    ({"guided_regex": "a", "response_format": {"type": "json_object"}},
     "guided_regex and response_format both constrain"),
    ({"guided_regex": "(unclosed"}, "invalid regex"),
    ({"structured_outputs": {"grammar": "root ::= ("}}, "grammar"),
])
def test_guided_field_errors_are_400s(client, extra, message):
    with pytest.raises(openai.BadRequestError, match=re.escape(message)):
        client.chat.completions.create(model="tiny", messages=USER, max_tokens=5,
                                       extra_body=extra)


@pytest.mark.parametrize("field", ["output_config", "output_format"])
def test_anthropic_structured_output_is_honoured(server, field):
    fmt = {"type": "json_schema", "schema": POINT}
    body = {"model": "tiny", "max_tokens": 60, "temperature": 1.0, "messages": USER,
            field: {"format": fmt} if field == "output_config" else fmt}
    reply = httpx.post(f"{server.url}/v1/messages", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    (block,) = reply.json()["content"]
    jsonschema.validate(json.loads(block["text"]), POINT)
    bad = httpx.post(f"{server.url}/v1/messages", timeout=60, json={
        **body, field: {"format": {"type": "regex"}} if field == "output_config"
        else {"type": "regex"}})
    assert bad.status_code == 400 and "type must be json_schema" in bad.text
