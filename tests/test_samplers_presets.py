"""Sampling presets: sources and precedence, request overrides, /v1/models, and the new sampler
fields through the HTTP API."""

from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import pytest

from atlas_core.engine import EngineArgs
from atlas_core.engine.sampling_presets import (check_presets, defaults_for, merge_presets,
                                                model_presets, read_presets_file)
from atlas_core.server import ServerConfig, create_app
from atlas_core.server.errors import APIError
from atlas_core.server.launch import ServerThread
from atlas_core.server.sampling import make_params
from test_server_support import tiny_engine

MODEL_PRESETS = {"thinking": {"temperature": 0.6, "top_p": 0.95, "top_k": 20},
                 "non_thinking": {"temperature": 0.7, "top_p": 0.8, "presence_penalty": 1.5}}
USER_PRESETS = {"tool_calls": {"temperature": 0.2, "dry_multiplier": 0.8},
                "thinking": {"top_k": 40}}


def test_check_presets_names_what_is_wrong():
    with pytest.raises(ValueError, match="unknown mode 'coding'"):
        check_presets({"coding": {}}, "x.json")
    with pytest.raises(ValueError, match=r"unknown fields \['max_tokens'\]"):
        check_presets({"thinking": {"max_tokens": 5}}, "x.json")
    with pytest.raises(ValueError, match="mode thinking: temperature must be"):
        check_presets({"thinking": {"temperature": -1}}, "x.json")


def test_read_presets_file_errors(tmp_path):
    bad = tmp_path / "p.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        read_presets_file(bad)
    with pytest.raises(ValueError, match="cannot read sampling presets file"):
        read_presets_file(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="cannot read sampling presets file"):
        EngineArgs(sampling_presets=str(tmp_path / "missing.json"))


def test_sources_merge_plugin_then_directory_then_user(tmp_path):
    (tmp_path / "sampling_presets.json").write_text(json.dumps(MODEL_PRESETS))
    user = tmp_path / "user.json"
    user.write_text(json.dumps(USER_PRESETS))
    model = SimpleNamespace(path=tmp_path, config={},
                            sampling_presets={"thinking": {"min_p": 0.05, "top_k": 10}})
    presets = model_presets(model, str(user))
    assert presets["thinking"] == {"min_p": 0.05, "top_k": 40, "temperature": 0.6, "top_p": 0.95}
    assert presets["tool_calls"] == USER_PRESETS["tool_calls"]
    assert merge_presets(None, {"a": {"x": 1}}, {"a": {"y": 2}}) == {"a": {"x": 1, "y": 2}}


def test_precedence_request_over_mode_over_generation_config():
    defaults = {"temperature": 1.0, "top_p": 0.9, "min_p": 0.1, "presets": MODEL_PRESETS}
    assert defaults_for(defaults, MODEL_PRESETS, None) == {"temperature": 1.0, "top_p": 0.9,
                                                           "min_p": 0.1}
    params = make_params({"top_p": 0.5}, defaults, mode="thinking")
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.6, 0.5, 20, 0.1)
    params = make_params({}, defaults, mode="non_thinking")
    assert params.presence_penalty == 1.5 and params.temperature == 0.7
    assert make_params({}, defaults, mode="tool_calls").temperature == 1.0
    with pytest.raises(APIError) as err:
        make_params({"xtc_probability": 3.0}, defaults)
    assert err.value.status == 400 and err.value.param == "xtc_probability"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    user = root / "user_presets.json"
    user.write_text(json.dumps(USER_PRESETS))
    engine = tiny_engine(root, sampling_presets=str(user), scheduling_policy="slai",
                         tbt_deadline_ms=20.0)
    with ServerThread(create_app(engine, ServerConfig(served_model_names=["tiny"]))) as srv:
        yield srv
    engine.shutdown()


def test_models_endpoint_shows_presets(server):
    card = httpx.get(f"{server.url}/v1/models").json()["data"][0]
    assert card["sampling_presets"]["tool_calls"] == USER_PRESETS["tool_calls"]
    assert "presets" not in card["sampling_defaults"]


def test_chat_accepts_sampler_fields_and_priority(server):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
            "temperature": 0.8, "seed": 1, "dry_multiplier": 0.8, "dry_allowed_length": 2,
            "dry_sequence_breakers": ["\n", ":"], "xtc_threshold": 0.1, "xtc_probability": 0.5,
            "top_n_sigma": 1.0, "priority": -1}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 6
    r = httpx.post(f"{server.url}/v1/chat/completions", json={**body, "dry_base": 0.5}, timeout=60)
    assert r.status_code == 400 and "dry_base must be a number in (1, 100]" in r.text
    msg = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
           "top_n_sigma": 1.0, "min_p": 0.05}
    r = httpx.post(f"{server.url}/v1/messages", json=msg, timeout=60)
    assert r.status_code == 200, r.text


def test_weight_loader_class_declares_presets(monkeypatch):
    class Loader:
        sampling_presets = {"tool_calls": {"temperature": 0.3}}

    from atlas_core import plugins
    monkeypatch.setattr(plugins.Registry, "get", lambda self, kind, name: Loader)
    model = SimpleNamespace(config={"architectures": ["SomeForCausalLM"]}, path=None)
    assert model_presets(model) == {"tool_calls": {"temperature": 0.3}}
    Loader.sampling_presets = {"tool_calls": {"temperature": -2}}
    with pytest.raises(ValueError, match="in the model plugin, mode tool_calls: temperature"):
        model_presets(model)
