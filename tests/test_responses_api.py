"""OpenAI Responses API with the official SDK: a full tool loop (streamed and not), stored
responses and previous_response_id, typed stream events, errors."""

from __future__ import annotations

import json

import openai
import pytest

from test_agent_support import ANSWER, agent_server, qwen3_tokenizer, tool_then_answer

THOUGHT = "Call the weather tool."
TOOL = {"type": "function", "name": "get_weather", "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}
QUESTION = "What is the weather in Paris?"


CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": False}


def reply(prompt: list[int]) -> str:
    if "[json]" in qwen3_tokenizer().decode(prompt):
        return '{"city": "Paris"}'
    return tool_then_answer(think=THOUGHT)(prompt)


@pytest.fixture(scope="module")
def server():
    with agent_server(reply, max_stored_responses=4) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60)


def create(client, **kw):
    return client.responses.create(model="agent", tools=[TOOL], max_output_tokens=200, **kw)


def test_agent_loop_with_items(client):
    first = create(client, input=QUESTION, instructions="Be brief.")
    assert first.status == "completed" and first.object == "response"
    assert [item.type for item in first.output] == ["reasoning", "function_call"]
    reasoning, call = first.output
    assert reasoning.content[0].text == THOUGHT
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert first.usage.output_tokens_details.reasoning_tokens > 0
    items = [{"role": "user", "content": QUESTION}, *[o.model_dump() for o in first.output],
             {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    final = create(client, input=items)
    assert final.output_text == ANSWER
    assert final.output[-1].type == "message" and final.output[-1].status == "completed"


def test_agent_loop_with_previous_response_id(client):
    first = create(client, input=QUESTION)
    call = first.output[-1]
    final = create(client, previous_response_id=first.id, input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert final.output_text == ANSWER and final.previous_response_id == first.id
    assert client.responses.retrieve(final.id).output_text == ANSWER


def test_agent_loop_streamed(client):
    events = list(create(client, input=QUESTION, stream=True))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    for kind in ("response.output_item.added", "response.content_part.added",
                 "response.reasoning_text.delta", "response.function_call_arguments.delta",
                 "response.function_call_arguments.done", "response.output_item.done"):
        assert kind in types
    call = events[-1].response.output[-1]
    assert call.type == "function_call"
    with client.responses.stream(model="agent", tools=[TOOL], max_output_tokens=200,
                                 previous_response_id=events[-1].response.id,
                                 input=[{"type": "function_call_output",
                                         "call_id": call.call_id, "output": "sunny"}]) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == ANSWER == final.output_text


def test_store_false_and_bounded_store(client, server):
    unstored = create(client, input=QUESTION, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError, match="previous response"):
        create(client, input="hi", previous_response_id=unstored.id)
    ids = [create(client, input=QUESTION).id for _ in range(5)]
    assert len(server.app.state.atlas.responses) == 4
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(ids[0])
    client.responses.delete(ids[-1])
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(ids[-1])


def test_truncated_output_is_incomplete(client):
    cut = client.responses.create(model="agent", input=QUESTION, max_output_tokens=12)
    assert cut.status == "incomplete"
    assert cut.incomplete_details.reason == "max_output_tokens"


def test_errors_in_openai_shape(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="agent", input=[{"type": "web_search_call"}])
    assert info.value.body["param"] == "input[0].type"
    with pytest.raises(openai.BadRequestError, match="not supported"):
        client.responses.create(model="agent", input="x", tools=[{"type": "web_search"}])
    with pytest.raises(openai.BadRequestError, match="reasoning.effort"):
        client.responses.create(model="agent", input="x", reasoning={"effort": "huge"})


def test_text_format_json_schema(client):
    fmt = {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}
    result = client.responses.create(model="agent", input="[json] Where?", text={"format": fmt},
                                     max_output_tokens=50)
    assert json.loads(result.output_text) == {"city": "Paris"}
    assert result.text.format.type == "json_schema"
