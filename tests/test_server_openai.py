"""The OpenAI SDK against a real server and engine (tiny random Qwen3, numpy backend)."""

from __future__ import annotations

import httpx
import openai
import pytest

from atlas_core.server import ServerConfig, create_app
from atlas_core.server.launch import ServerThread
from test_server_support import tiny_engine

USER = [{"role": "user", "content": "Tell me a story about a lighthouse."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    engine = tiny_engine(tmp_path_factory.mktemp("tiny"))
    app = create_app(engine, ServerConfig(served_model_names=["tiny", "tiny-alias"]))
    with ServerThread(app) as srv:
        srv.engine = engine
        yield srv
    engine.shutdown()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=30)


def chat(client, **kw):
    return client.chat.completions.create(**{"model": "tiny", "messages": USER, "max_tokens": 8,
                                             "temperature": 0, **kw})


def test_chat_greedy_and_usage(client):
    first = chat(client)
    choice = first.choices[0]
    assert first.object == "chat.completion" and first.model == "tiny"
    assert choice.message.role == "assistant" and choice.finish_reason == "length"
    assert first.usage.completion_tokens == 8
    assert first.usage.total_tokens == first.usage.prompt_tokens + 8
    again = chat(client)
    assert again.choices[0].message.content == choice.message.content
    assert again.usage.prompt_tokens_details.cached_tokens > 0


def test_chat_stream_matches_non_stream(client):
    whole = chat(client, max_tokens=10).choices[0].message.content
    chunks = list(chat(client, max_tokens=10, stream=True,
                       stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    finals = [c.choices[0].finish_reason for c in chunks
              if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10


def test_system_developer_and_multipart(client):
    messages = [{"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi"},
                                             {"type": "text", "text": "there"}]}]
    out = client.chat.completions.create(model="tiny-alias", messages=messages, max_tokens=4)
    assert out.model == "tiny-alias" and out.usage.completion_tokens == 4


def test_logprobs(client):
    out = chat(client, logprobs=True, top_logprobs=3, max_tokens=5)
    content = out.choices[0].logprobs.content
    assert len(content) == 5
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[-1].logprob
        assert entry.token == entry.top_logprobs[0].token  # greedy picks the most likely


def test_stop_string(client):
    text = chat(client, max_tokens=12).choices[0].message.content
    stop = text[4:7]
    if not stop.strip() or "\ufffd" in stop:
        pytest.skip("greedy text has no usable stop substring")
    out = chat(client, max_tokens=12, stop=[stop])
    assert out.choices[0].finish_reason == "stop"
    assert out.choices[0].message.content == text[:text.index(stop)]


def test_seed_determinism(client):
    kw = {"temperature": 1.0, "max_tokens": 8, "seed": 1234}
    a = chat(client, **kw).choices[0].message.content
    assert a == chat(client, **kw).choices[0].message.content
    assert a != chat(client, **{**kw, "seed": 99}).choices[0].message.content


def test_n_choices(client):
    many = chat(client, n=3, temperature=1.0, max_tokens=8, seed=5)
    assert [c.index for c in many.choices] == [0, 1, 2]
    assert len({c.message.content for c in many.choices}) > 1
    assert many.usage.completion_tokens == 24
    chunks = list(chat(client, n=2, stream=True, temperature=1.0, seed=7))
    finished = {c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason}
    assert finished == {0, 1}
    batch = client.completions.create(model="tiny", prompt=[[5, 6, 7], [8, 9]], max_tokens=3,
                                        temperature=0, n=2)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert batch.choices[0].text == batch.choices[1].text
    assert batch.usage.prompt_tokens == 5 and batch.usage.completion_tokens == 12


def test_completions_prompt_forms(client, server):
    single = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=5,
                                       temperature=0)
    assert single.object == "text_completion" and single.usage.completion_tokens == 5
    ids = httpx.post(f"{server.url}/tokenize", json={"prompt": "Once upon a time"}).json()["tokens"]
    by_ids = client.completions.create(model="tiny", prompt=ids, max_tokens=5, temperature=0)
    assert by_ids.choices[0].text == single.choices[0].text
    batch = client.completions.create(model="tiny", prompt=[ids, ids[:3]], max_tokens=3,
                                      temperature=0)
    assert [c.index for c in batch.choices] == [0, 1]
    assert batch.choices[0].text == single.choices[0].text[:len(batch.choices[0].text)]
    strings = client.completions.create(model="tiny", prompt=["a", "b"], max_tokens=2)
    assert len(strings.choices) == 2 and strings.usage.completion_tokens == 4


def test_completions_echo_logprobs_stream(client):
    out = client.completions.create(model="tiny", prompt="Hello world", max_tokens=3,
                                    temperature=0, echo=True, logprobs=2)
    choice = out.choices[0]
    assert choice.text.startswith("Hello world")
    assert choice.logprobs.token_logprobs[0] is None
    assert len(choice.logprobs.tokens) == out.usage.prompt_tokens + 3
    streamed = list(client.completions.create(model="tiny", prompt="Hello world", max_tokens=3,
                                              temperature=0, stream=True))
    text = "".join(c.choices[0].text for c in streamed if c.choices)
    assert "Hello world" + text == choice.text


def test_models(client):
    ids = [m.id for m in client.models.list().data]
    assert ids == ["tiny", "tiny-alias"]
    assert client.models.retrieve("tiny-alias").id == "tiny-alias"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


def test_tokenize_detokenize(server):
    url = server.url
    tok = httpx.post(f"{url}/tokenize", json={"prompt": "abc def", "add_special_tokens": False})
    body = tok.json()
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 256
    text = httpx.post(f"{url}/detokenize", json={"tokens": body["tokens"]}).json()["prompt"]
    assert text == "abc def"
    chat_tokens = httpx.post(f"{url}/tokenize", json={"messages": USER}).json()
    assert chat_tokens["count"] == chat(openai.OpenAI(base_url=f"{url}/v1", api_key="x")
                                        ).usage.prompt_tokens


def test_metrics_count_requests(server, client):
    chat(client, max_tokens=2)
    text = httpx.get(f"{server.url}/metrics").text
    assert 'atlas_requests_total{endpoint="/v1/chat/completions",status="200"}' in text
    assert "atlas_time_to_first_token_seconds_count" in text
    assert "atlas_kv_cache_blocks_total 128.0" in text


def test_errors_against_the_real_engine(server, client):
    bad_ids = httpx.post(f"{server.url}/v1/completions", json={"prompt": [1, 2, 10 ** 6]})
    assert bad_ids.status_code == 400 and bad_ids.json()["error"]["param"] == "prompt[0]"
    clamped = chat(client, max_tokens=250)
    assert clamped.choices[0].finish_reason == "length"
    assert clamped.usage.prompt_tokens + clamped.usage.completion_tokens == 256
    assert chat(client, max_tokens=1).usage.completion_tokens == 1
