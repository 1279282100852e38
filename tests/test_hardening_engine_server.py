"""Engine hardening over HTTP (#30): bad numbers are 400s naming the field in every API,
``/health`` waits for warm-up, ``/health/ready?deep=1`` catches a stuck engine, and a dead
engine loop ends open streams, turns ``/health`` 503 and stops the server (exit status 1)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import threading

import httpx
import pytest

from atlas_core.engine import AsyncLLMEngine
from atlas_core.server import ServerConfig, create_app
from atlas_core.server.launch import ServerThread
from atlas_core.testing.checkpoints import write_tiny_checkpoint
from atlas_core.testing.fake_model import make_fake_engine
from atlas_core.testing.tiny_tokenizer import write_tokenizer
from atlas_core.tokenizer import Tokenizer
from test_server_support import wait_until

pytestmark = pytest.mark.timeout(120)

VOCAB = 300
MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    write_tokenizer(path, VOCAB)
    return Tokenizer.from_dir(path)


def gate_forward(engine) -> threading.Event:
    """Hold every model forward of ``engine`` until the returned event is set."""
    gate = threading.Event()
    forward = engine.model.forward

    def gated(input_ids, meta):
        gate.wait(30)
        return forward(input_ids, meta)
    engine.model.forward = gated
    return gate


def config() -> ServerConfig:
    return ServerConfig(served_model_names=["fake"])


BAD_REQUESTS = [
    ("/v1/chat/completions", {"messages": MSGS, "top_k": 2 ** 31}, "top_k"),
    ("/v1/chat/completions", {"messages": MSGS, "top_k": VOCAB + 1}, "top_k"),
    ("/v1/chat/completions", {"messages": MSGS, "logit_bias": {str(VOCAB): 1}}, "logit_bias"),
    ("/v1/chat/completions", {"messages": MSGS, "seed": 2 ** 64}, "seed"),
    ("/v1/chat/completions", {"messages": MSGS, "stop_token_ids": [2 ** 40]}, "stop_token_ids"),
    ("/v1/completions", {"prompt": "hi", "top_k": 2 ** 31}, "top_k"),
    ("/v1/completions", {"prompt": "hi", "top_k": VOCAB + 1}, "top_k"),
    ("/v1/completions", {"prompt": "hi", "stop_token_ids": [VOCAB]}, "stop_token_ids"),
    ("/v1/messages", {"messages": MSGS, "top_k": 2 ** 31}, "top_k"),
    ("/v1/messages", {"messages": MSGS, "top_k": VOCAB + 1}, "top_k"),
    ("/v1/responses", {"input": "hi", "top_k": 2 ** 31}, "top_k"),
    ("/v1/responses", {"input": "hi", "top_k": VOCAB + 1}, "top_k"),
]


def test_every_api_answers_out_of_range_numbers_with_a_400_naming_the_field(tokenizer):
    aengine = AsyncLLMEngine(make_fake_engine(tokenizer=tokenizer))
    with ServerThread(create_app(aengine, config())) as srv:
        with httpx.Client(base_url=srv.url, timeout=30) as client:
            for path, body, field in BAD_REQUESTS:
                limit = "max_output_tokens" if path == "/v1/responses" else "max_tokens"
                r = client.post(path, json={"model": "fake", limit: 3, **body})
                assert r.status_code == 400, (path, body, r.text)
                error = r.json()["error"]
                assert error["message"].split(": ")[-1].startswith(f"{field} must be"), error
                if path != "/v1/messages":
                    assert error["param"] == field, error
            ok = client.post("/v1/chat/completions",
                             json={"model": "fake", "messages": MSGS, "max_tokens": 3,
                                   "top_k": VOCAB})
            assert ok.status_code == 200, ok.text
            assert client.get("/health").status_code == 200
    aengine.shutdown()
    assert not aengine.errored


def test_health_is_503_until_the_warm_up_generation_has_run(tokenizer):
    engine = make_fake_engine(tokenizer=tokenizer)
    gate = gate_forward(engine)
    aengine = AsyncLLMEngine(engine)
    app = create_app(None, config(), loader=lambda: aengine)
    with ServerThread(app) as srv:
        with httpx.Client(base_url=srv.url, timeout=30) as client:
            assert wait_until(lambda: client.get("/health").json()["status"] == "warming up")
            assert client.get("/health").status_code == 503
            assert client.get("/health/ready").status_code == 503
            assert engine.stats().num_generation_tokens == 0
            gate.set()
            assert wait_until(lambda: client.get("/health").status_code == 200)
            assert engine.stats().num_generation_tokens >= 2
            ready = client.get("/health/ready").json()
            assert ready["engine"] == "running" and ready["warm"] is True
            deep = client.get("/health/ready", params={"deep": "1"})
            assert deep.status_code == 200 and deep.json()["seconds"] >= 0
    aengine.shutdown()


def test_deep_readiness_reports_a_stuck_engine(tokenizer):
    engine = make_fake_engine(tokenizer=tokenizer)
    gate = gate_forward(engine)
    gate.set()
    aengine = AsyncLLMEngine(engine)
    with ServerThread(create_app(aengine, config())) as srv:
        with httpx.Client(base_url=srv.url, timeout=30) as client:
            assert client.get("/health/ready", params={"deep": "1"}).status_code == 200
            gate.clear()
            stuck = client.get("/health/ready", params={"deep": "1", "timeout": "0.3"})
            assert stuck.status_code == 503
            assert "no token within 0.3 s" in stuck.json()["message"]
            assert client.get("/health").status_code == 200
            for bad in ("abc", "0", "1000", "nan"):
                r = client.get("/health/ready", params={"deep": "1", "timeout": bad})
                assert r.status_code == 400 and r.json()["error"]["param"] == "timeout"
            gate.set()
            assert wait_until(lambda: client.get(
                "/health/ready", params={"deep": "1"}).status_code == 200)
    aengine.shutdown()


class Fatal(BaseException):
    """Escapes every ``except Exception``: the engine loop thread dies."""


def test_a_dead_engine_ends_open_streams_and_stops_the_server(tokenizer):
    engine = make_fake_engine(tokenizer=tokenizer)
    gate = gate_forward(engine)
    step = engine.step

    def dying_step():
        if engine.stats().num_generation_tokens >= 3:
            raise Fatal("device lost")
        return step()
    engine.step = dying_step
    aengine = AsyncLLMEngine(engine)
    app = create_app(aengine, config())
    state = app.state.atlas
    with ServerThread(app) as srv:
        body = {"model": "fake", "messages": MSGS, "max_tokens": 50, "stream": True,
                "stream_options": {"include_usage": False}}
        with httpx.Client(base_url=srv.url, timeout=30) as client:
            with client.stream("POST", "/v1/chat/completions", json=body) as response:
                gate.set()
                events = [line for line in response.iter_lines() if line.startswith("data: ")]
        assert response.status_code == 200 and events[-1] == "data: [DONE]"
        assert '"error"' in events[-2] and "the engine has stopped" in events[-2]
        assert "device lost" not in events[-2]
        assert wait_until(lambda: not srv.thread.is_alive(), timeout=15)
    code, health = state.health()
    assert code == 503 and health["status"] == "error" and "device lost" not in health["message"]
    assert "device lost" in state.exit_reason
    assert b"atlas_engine_alive 0.0" in state.metrics.render()


SCRIPT = textwrap.dedent("""
    import sys
    from atlas_core.cli import main
    from atlas_core.engine.llm_engine import LLMEngine

    step = LLMEngine._step

    def faulty(self):
        if any(not rid.startswith("atlas-health-") for rid in self.groups):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return step(self)
    LLMEngine._step = faulty
    sys.exit(main())
""")


def test_serve_exits_non_zero_once_the_engine_loop_has_died(tmp_path):
    write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, "serve", str(tmp_path), "--backend",
                             "numpy", "--port", "0", "--num-kv-blocks", "32",
                             "--served-model-name", "tiny"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = re.search(r"(http://\S+)/v1", proc.stdout.readline()).group(1)
        assert wait_until(lambda: httpx.get(f"{url}/health").status_code == 200, timeout=90)
        body = {"model": "tiny", "max_tokens": 3, "messages": MSGS}
        first = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
        assert first.status_code == 500 and "RuntimeError" in first.text and "illegal memory" not in first.text
        assert "other requests are unaffected" in first.text
        assert httpx.get(f"{url}/health").status_code == 200
        second = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
        third = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
        assert second.status_code == 500
        assert third.status_code == 503 and "the engine has stopped" in third.text
        assert proc.wait(timeout=30) == 1
        last = proc.stderr.read().strip().splitlines()[-1]
        assert last.startswith("error: the engine stopped") and "illegal memory" in last
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
