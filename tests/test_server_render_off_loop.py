"""Rendering and tokenising a prompt (chat template, tools, grammar) runs off the event loop: a
slow template delays its own request, never /health or other requests."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from atlas_core.server import ServerConfig, create_app
from atlas_core.server.launch import ServerThread
from test_server_support import FakeAsyncEngine

SLOW_S = 1.0


class SlowTemplateEngine(FakeAsyncEngine):
    def __init__(self):
        super().__init__()
        render = self.tokenizer.apply_chat_template

        def slow(*args, **kwargs):
            time.sleep(SLOW_S)  # a huge conversation or a heavy template
            return render(*args, **kwargs)

        self.tokenizer.apply_chat_template = slow
        encode = self.tokenizer.encode
        self.tokenizer.encode = lambda text, *a, **k: (  # a very long completions prompt
            time.sleep(SLOW_S) if text == "long prompt" else None, encode(text, *a, **k))[1]


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"model": "fake", "max_tokens": 2,
                              "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/messages", {"model": "fake", "max_tokens": 2,
                      "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/messages/count_tokens", {"model": "fake",
                                   "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/responses", {"model": "fake", "max_output_tokens": 2, "input": "hi"}),
    ("/v1/completions", {"model": "fake", "max_tokens": 2, "prompt": "long prompt"}),
])
def test_a_slow_template_does_not_block_other_requests(path, body):
    app = create_app(SlowTemplateEngine(), ServerConfig(served_model_names=["fake"]))
    with ServerThread(app) as srv, httpx.Client(base_url=srv.url, timeout=30) as client:
        result = {}
        slow = threading.Thread(target=lambda: result.update(r=client.post(path, json=body)))
        slow.start()
        time.sleep(0.2)  # the slow request is rendering now
        start = time.monotonic()
        assert client.get("/health").status_code == 200
        assert time.monotonic() - start < SLOW_S / 2, "the event loop was blocked by rendering"
        slow.join()
        assert result["r"].status_code == 200, result["r"].text
