"""Images through ``atlas serve``'s app on a tiny Qwen3-VL checkpoint: the OpenAI and Anthropic
SDKs and the Responses API send an image and get the answer the engine gives offline; bad,
oversized, too many and not-allowed images get 400s naming what was wrong."""

import base64
import http.server
import threading

import httpx
import pytest

pytest.importorskip("torch")
openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

from atlas_core.api import (AsyncLLMEngine, EngineArgs, LLMEngine, SamplingParams,  # noqa: E402
                            ServerConfig, ServerThread, create_app)
from qwen3vl_checkpoints import png_bytes, save_hf_checkpoint, small_processor_config  # noqa: E402

PNG = png_bytes(40, 56, seed=7)
B64 = base64.b64encode(PNG).decode()
DATA_URL = f"data:image/png;base64,{B64}"
QUESTION = "What is in this picture?"


@pytest.fixture(scope="module")
def served(tmp_path_factory, registry):
    path = save_hf_checkpoint("Qwen3VLForConditionalGeneration",
                              tmp_path_factory.mktemp("vl"), registry)
    small_processor_config(path)
    engine = AsyncLLMEngine(LLMEngine.from_args(EngineArgs(
        model=str(path), backend="numpy", max_num_seqs=4, num_kv_blocks=64, block_size=16)))
    config = ServerConfig(served_model_names=["tiny-vl"], max_images_per_request=2,
                          max_image_bytes=20_000)
    with ServerThread(create_app(engine, config)) as srv:
        yield srv, engine
    engine.shutdown()


@pytest.fixture(scope="module")
def expected(served):
    """The greedy answer the engine gives offline to the same rendered, expanded prompt."""
    _, engine = served
    llm = engine.engine
    tok = llm.tokenizer
    parts = [{"type": "image"}, {"type": "text", "text": QUESTION}]
    messages = [{"role": "user", "content": parts}]
    ids = tok.encode(tok.apply_chat_template(messages), add_special_tokens=False)
    ids, mm = llm.model.mm_processor.process(ids, [PNG])
    llm.add_request("offline", ids, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True),
                    mm_inputs=mm)
    text = None
    while llm.has_unfinished_requests():
        for out in llm.step():
            text = out.outputs[0].text if out.finished else text
    return text, len(ids)


def test_openai_sdk_data_url(served, expected):
    srv, _ = served
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0, timeout=60)
    resp = client.chat.completions.create(
        model="tiny-vl", max_tokens=6, temperature=0, extra_body={"ignore_eos": True},
        messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": DATA_URL}},
            {"type": "text", "text": QUESTION}]}])
    assert resp.choices[0].message.content == expected[0]
    assert resp.usage.prompt_tokens == expected[1]


def test_anthropic_sdk_base64(served, expected):
    srv, _ = served
    client = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0, timeout=60)
    msg = client.messages.create(
        model="tiny-vl", max_tokens=6, extra_body={"ignore_eos": True, "temperature": 0},
        messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": B64}},
            {"type": "text", "text": QUESTION}]}])
    assert msg.content[0].text == expected[0]
    # the image prompt was cached by the OpenAI request: same image, same blocks
    assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens == expected[1]
    assert msg.usage.cache_read_input_tokens > 0


def test_responses_input_image(served, expected):
    srv, _ = served
    body = {"model": "tiny-vl", "max_output_tokens": 6, "temperature": 0, "ignore_eos": True,
            "input": [{"role": "user", "content": [
                {"type": "input_image", "image_url": DATA_URL},
                {"type": "input_text", "text": QUESTION}]}]}
    resp = httpx.post(f"{srv.url}/v1/responses", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    assert resp.json()["output"][-1]["content"][0]["text"] == expected[0]


def _chat_error(srv, parts):
    body = {"model": "tiny-vl", "max_tokens": 2,
            "messages": [{"role": "user", "content": parts + [{"type": "text", "text": "hi"}]}]}
    resp = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=60)
    assert resp.status_code == 400, resp.text
    return resp.json()["error"]


def _image(url):
    return {"type": "image_url", "image_url": {"url": url}}


@pytest.mark.parametrize("url, code, words", [
    ("data:image/png;base64," + base64.b64encode(b"not a picture").decode(), "invalid_image",
     "cannot decode"),
    ("data:image/png;base64,@@@", "invalid_image", "base64"),
    ("data:image/png,rawbytes", "invalid_image", "base64"),
    ("ftp://example.com/a.png", "invalid_image", "data: or http(s)"),
    ("https://example.com/cat.png", "image_url_not_allowed", "--allowed-media-domains"),
    ("data:image/png;base64," + base64.b64encode(png_bytes(200, 200, 1)).decode(),
     "image_too_large", "larger than 20000 bytes"),
])
def test_bad_images_get_400(served, url, code, words):
    err = _chat_error(served[0], [_image(url)])
    assert err["code"] == code and words in err["message"]
    assert err["param"].startswith("messages[0].content[0]")


def test_too_many_images(served):
    err = _chat_error(served[0], [_image(DATA_URL)] * 3)
    assert err["code"] == "too_many_images" and err["param"] == "messages[0].content[2]"


def test_anthropic_bad_source(served):
    body = {"model": "tiny-vl", "max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "file", "file_id": "f"}}]}]}
    resp = httpx.post(f"{served[0].url}/v1/messages", json=body, timeout=60)
    assert resp.status_code == 400
    assert "base64" in resp.json()["error"]["message"]


def test_anthropic_count_tokens_counts_image_tokens(served, expected):
    body = {"model": "tiny-vl", "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": B64}},
        {"type": "text", "text": QUESTION}]}]}
    resp = httpx.post(f"{served[0].url}/v1/messages/count_tokens", json=body, timeout=60)
    assert resp.json() == {"input_tokens": expected[1]}


class _Images(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path != "/cat.png":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.end_headers()
        self.wfile.write(PNG)

    def log_message(self, *args):
        pass


def test_image_urls_from_allowed_domains(served, expected):
    _, engine = served
    images = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=images.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{images.server_address[1]}"
    config = ServerConfig(served_model_names=["tiny-vl"], allowed_media_domains=["127.0.0.1"])
    try:
        with ServerThread(create_app(engine, config)) as srv:
            client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0,
                                   timeout=60)
            resp = client.chat.completions.create(
                model="tiny-vl", max_tokens=6, temperature=0, extra_body={"ignore_eos": True},
                messages=[{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": f"{base}/cat.png"}},
                    {"type": "text", "text": QUESTION}]}])
            assert resp.choices[0].message.content == expected[0]
            err = _chat_error(srv, [_image(f"{base}/missing.png")])
            assert err["code"] == "image_fetch_failed" and "404" in err["message"]
    finally:
        images.shutdown()
