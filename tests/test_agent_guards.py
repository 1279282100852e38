"""Agent-loop guards on scripted models that loop, the markup scrubber, the request fields and
the /metrics counters."""

from types import SimpleNamespace

import numpy as np
import pytest

from atlas_core.engine import SamplingParams
from atlas_core.engine.agent_guards import AgentGuardParams, call_key, reasoning_loops
from atlas_core.parsers import HermesToolParser, ReasoningParser
from atlas_core.parsers import markup_scrub
from atlas_core.parsers.markup_scrub import MarkupScrubber, scrub
from atlas_core.plugins import Registry
from atlas_core.server.agent import ChatRequest
from atlas_core.server.agent_guards import attach_guards
from atlas_core.server.config import ServerConfig
from atlas_core.server.sampling import sampling_mode
from atlas_core.server.errors import APIError
from atlas_core.server.metrics import Metrics
from atlas_core.server.shaping import OutputShaper, ParsePlan
from atlas_core.testing.fake_model import FakeCausalLM, make_fake_engine, run_to_completion, scripted
from atlas_core.testing.tiny_tokenizer import write_tokenizer
from atlas_core.tokenizer import Tokenizer

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
PROMPT = [1, 2, 3]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    write_tokenizer(path, 384)
    return Tokenizer.from_dir(path)


def run(tok, text, guards, max_extra=20):
    ids = tok.encode(text)
    model = FakeCausalLM(Registry().create("gpu_backends", "numpy"), vocab_size=tok.vocab_size,
                         max_position_embeddings=4096, script=scripted(PROMPT, ids))
    engine = make_fake_engine(model, tokenizer=tok, num_kv_blocks=512)
    engine.add_request("r", PROMPT, SamplingParams(temperature=0.0, max_tokens=len(ids) + max_extra,
                                                   ignore_eos=True, agent_guards=guards))
    out = run_to_completion(engine)["r"].outputs[0]
    return out, len(ids), engine


def test_identical_tool_call_three_times_stops(tok):
    out, total, engine = run(tok, CALL * 6, AgentGuardParams(tool_parser=HermesToolParser))
    assert out.finish_reason == "stop" and out.stop_reason == "agent_guard:repeated_tool_call"
    assert out.text.count("</tool_call>") == 3 and len(out.token_ids) < total
    assert engine.agent_guards.num_stops["repeated_tool_call"] == 1
    assert not engine.agent_guards.states


def test_guard_switched_off_by_the_request_lets_it_run(tok):
    out, total, _ = run(tok, CALL * 4, AgentGuardParams(tool_parser=HermesToolParser,
                                                        max_identical_tool_calls=0),
                        max_extra=0)
    assert out.finish_reason == "length" and out.stop_reason is None
    assert len(out.token_ids) == total


def test_tool_call_cap(tok):
    calls = "".join(CALL.replace("Paris", city) for city in ("Oslo", "Rome", "Lima", "Kyiv"))
    out, _, _ = run(tok, calls, AgentGuardParams(tool_parser=HermesToolParser, max_tool_calls=2))
    assert out.stop_reason == "agent_guard:max_tool_calls"
    assert out.text.count("</tool_call>") == 2


def test_reasoning_paraphrase_loop_stops(tok):
    thought = "I should check the weather in Paris again to be sure of it. "
    out, total, _ = run(tok, thought * 40 + "</think>done", AgentGuardParams(
        tool_parser=HermesToolParser, reasoning_parser=ReasoningParser, in_reasoning=True))
    assert out.stop_reason == "agent_guard:reasoning_loop"
    assert len(out.token_ids) < total


def test_reasoning_loop_rule():
    rng = np.random.default_rng(0)
    vocab = [f"w{i}" for i in range(500)]
    assert not reasoning_loops([vocab[i] for i in rng.integers(0, 500, 400)])
    cycle = "so the answer is the weather in Paris which I should check".split()
    near = [w if rng.random() > 0.05 else "again" for w in cycle * 40]
    assert reasoning_loops(near)
    assert not reasoning_loops(cycle * 3)


def test_call_identity_ignores_json_spacing():
    assert call_key("f", '{"a": 1, "b": [1, 2]}') == call_key("f", '{"b":[1,2],"a":1}')
    assert call_key("f", '{"a": 1}') != call_key("g", '{"a": 1}')


def test_scrubber_removes_markup_split_across_deltas():
    before = markup_scrub.num_scrubbed()
    s = MarkupScrubber()
    pieces = ["Here is the file", " <param", "eter=path>/tmp/x</para", "meter> and a < b", " ok"]
    text = "".join(s.feed(p) for p in pieces) + s.finish()
    assert text == "Here is the file /tmp/x and a < b ok"
    assert markup_scrub.num_scrubbed() - before == 2
    assert scrub("a <|tool_call_begin|> b <function=run>") == "a  b "
    assert scrub("<tool_call>{bad}</tool_call>") == "<tool_call>{bad}</tool_call>"
    assert scrub("x < y and [1, 2] <b>bold</b>") == "x < y and [1, 2] <b>bold</b>"


def test_shaper_scrubs_content_only_when_planned():
    plan = ParsePlan(scrub_markup=True)
    events = OutputShaper(plan).feed_all("Done.<parameter=x>1</parameter>")
    assert events.content == "Done.1"
    assert OutputShaper(ParsePlan()).feed_all("<parameter=x>").content == "<parameter=x>"


def _state(**args):
    return SimpleNamespace(engine=SimpleNamespace(args=SimpleNamespace(**args)))


def test_attach_guards_reads_request_fields_and_flags():
    fields = {"temperature": 0.5, "max_tool_calls": 5, "scrub_tool_markup": False}
    tools = [{"type": "function", "function": {"name": "f"}}]
    scrub_on = attach_guards(_state(scrub_tool_markup=True), fields, HermesToolParser, tools,
                             None, False)
    assert scrub_on is False and "max_tool_calls" not in fields
    guards = fields["agent_guards"]
    assert guards.max_tool_calls == 5 and guards.max_identical_tool_calls is None
    plain = {"max_tool_calls": 5}
    assert attach_guards(_state(scrub_tool_markup=True), plain, None, None, None, False) is False
    assert plain == {}
    with pytest.raises(APIError, match="max_identical_tool_calls must be an integer >= 0"):
        attach_guards(_state(), {"max_identical_tool_calls": -1}, HermesToolParser, tools, None, False)


def test_sampling_mode_of_a_chat_request():
    state = SimpleNamespace(config=ServerConfig(served_model_names=["m"]))
    req = ChatRequest(messages=[], tools=None)
    reasoner = ReasoningParser()
    assert sampling_mode(state, req, [{"type": "function"}], reasoner, True, None) == "tool_calls"
    assert sampling_mode(state, req, None, reasoner, True, None) == "thinking"
    assert sampling_mode(state, req, None, reasoner, False, None) == "thinking"
    assert sampling_mode(state, req, None, None, False, None) == "non_thinking"
    assert sampling_mode(state, req, None, reasoner, False, object()) == "non_thinking"
    off = ChatRequest(messages=[], tools=None, template_kwargs={"enable_thinking": False})
    assert sampling_mode(state, off, None, reasoner, False, None) == "non_thinking"


def test_metrics_count_guard_stops_and_scrubs():
    metrics = Metrics(lambda: None)
    stream = SimpleNamespace(start_time=0.0)
    choice = SimpleNamespace(prompt_ids=[1], token_ids=[1, 2], first_token_time=None,
                             stop_reason="agent_guard:repeated_tool_call")
    metrics.on_finish(stream, choice)
    scrub("</parameter>")
    text = metrics.render().decode()
    assert 'atlas_agent_guard_stops_total{guard="repeated_tool_call"} 1.0' in text
    assert 'atlas_agent_guard_stops_total{guard="reasoning_loop"} 0.0' in text
    assert "atlas_tool_markup_scrubbed_total" in text


LOOP_REPLIES = {"loop": (CALL * 6).strip(), "leak": "Done.<parameter=city>Paris</parameter> ok"}


def _loop_reply(prompt):
    from test_agent_support import qwen3_tokenizer
    text = qwen3_tokenizer().decode(prompt, skip_special_tokens=False)
    return next(r for k, r in LOOP_REPLIES.items() if f"[{k}]" in text)


@pytest.fixture(scope="module")
def agent():
    from test_agent_support import agent_server
    with agent_server(_loop_reply) as srv:
        yield srv


def _chat(agent, kind, **kw):
    import httpx

    from test_agent_support import WEATHER_TOOL
    body = {"model": "agent", "messages": [{"role": "user", "content": f"[{kind}] weather?"}],
            "tools": [WEATHER_TOOL], "max_tokens": 400, **kw}
    r = httpx.post(f"{agent.url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_http_loop_is_stopped_and_counted(agent):
    import httpx
    choice = _chat(agent, "loop")
    assert choice["stop_reason"] == "agent_guard:repeated_tool_call"
    assert len(choice["message"]["tool_calls"]) == 3
    off = _chat(agent, "loop", max_identical_tool_calls=0)
    assert off["stop_reason"] is None and len(off["message"]["tool_calls"]) == 6
    metrics = httpx.get(f"{agent.url}/metrics").text
    assert 'atlas_agent_guard_stops_total{guard="repeated_tool_call"} 1.0' in metrics


def test_http_leaked_markup_is_scrubbed_unless_switched_off(agent):
    assert _chat(agent, "leak")["message"]["content"] == "Done.Paris ok"
    raw = _chat(agent, "leak", scrub_tool_markup=False)["message"]["content"]
    assert raw == LOOP_REPLIES["leak"]
