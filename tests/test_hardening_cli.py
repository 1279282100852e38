"""CLI habits from vLLM (issue #30): no prefix matching, ``--model``, vLLM's flag names as
aliases, and ``ATLAS_HOST`` / ``ATLAS_PORT`` / ``ATLAS_API_KEY``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from atlas_core.cli import UserError, build_parser, main
from atlas_core.cli.serve import engine_args, listen_address, served_names, server_config


def _subparsers():
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return parser, action.choices


def _serve(*argv: str):
    return build_parser().parse_args(["serve", *argv])


def test_no_parser_accepts_abbreviated_flags():
    parser, subs = _subparsers()
    assert parser.allow_abbrev is False
    assert subs and all(sub.allow_abbrev is False for sub in subs.values())


def test_abbreviated_flag_is_an_error_not_another_flag(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--served-model", "X"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --served-model" in err and "--served-model-name" in err


def test_model_flag_is_the_model_not_its_served_name():
    args = _serve("--model", "Qwen/Qwen3-0.6B")
    assert args.model == "Qwen/Qwen3-0.6B"
    assert args.served_model_name is None
    assert served_names(args) == ["Qwen/Qwen3-0.6B"]


def test_model_positional_still_works_and_both_must_agree(capsys):
    assert _serve("Qwen/Qwen3-0.6B").model == "Qwen/Qwen3-0.6B"
    assert _serve("M", "--model", "M").model == "M"
    with pytest.raises(SystemExit) as exc:
        _serve("A", "--model", "B")
    assert exc.value.code == 2
    assert "two models given ('A' and 'B')" in capsys.readouterr().err


def test_generate_takes_model_flag_and_max_model_len():
    args = build_parser().parse_args(["generate", "--model", "M", "--max-model-len", "128",
                                      "-p", "hi"])
    assert (args.model, args.max_seq_len, args.prompt) == ("M", 128, ["hi"])


def test_vllm_engine_flag_names_are_aliases():
    args = _serve("--max-model-len", "4096", "--max-num-batched-tokens", "512",
                  "--download-dir", "/tmp/models")
    eargs = engine_args(args)
    assert (eargs.max_seq_len, eargs.max_prefill_tokens, eargs.cache_dir) == (4096, 512,
                                                                             "/tmp/models")


@pytest.mark.parametrize("name", ["qwen3", "deepseek_r1", "think"])
def test_vllm_reasoning_parser_names(name):
    assert server_config(_serve("--reasoning-parser", name)).reasoning_parser == "think"


def test_unknown_reasoning_parser_is_rejected(capsys):
    with pytest.raises(SystemExit):
        _serve("--reasoning-parser", "granite")
    assert "invalid choice: 'granite'" in capsys.readouterr().err


def test_enable_auto_tool_choice_is_accepted():
    args = _serve("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    assert args.enable_auto_tool_choice and server_config(args).tool_call_parser == "hermes"


def test_defaults_without_environment(monkeypatch):
    for name in ("ATLAS_HOST", "ATLAS_PORT", "ATLAS_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    args = _serve()
    assert listen_address(args) == ("127.0.0.1", 8888)
    assert server_config(args).api_keys == []


def test_environment_supplies_host_port_and_key(monkeypatch):
    monkeypatch.setenv("ATLAS_HOST", "0.0.0.0")
    monkeypatch.setenv("ATLAS_PORT", "9001")
    monkeypatch.setenv("ATLAS_API_KEY", "sk-env")
    args = _serve()
    assert listen_address(args) == ("0.0.0.0", 9001)
    assert server_config(args).api_keys == ["sk-env"]


def test_flags_override_environment(monkeypatch):
    monkeypatch.setenv("ATLAS_HOST", "0.0.0.0")
    monkeypatch.setenv("ATLAS_PORT", "9001")
    monkeypatch.setenv("ATLAS_API_KEY", "sk-env")
    args = _serve("--host", "127.0.0.1", "--port", "0", "--api-key", "sk-flag")
    assert listen_address(args) == ("127.0.0.1", 0)
    assert server_config(args).api_keys == ["sk-flag"]


def test_bad_port_in_environment_names_the_variable(monkeypatch):
    monkeypatch.setenv("ATLAS_PORT", "http")
    with pytest.raises(UserError, match="ATLAS_PORT='http' is not a port number"):
        listen_address(_serve())


def test_serve_names_a_gguf_file(tmp_path, capsys):
    gguf = tmp_path / "qwen3-0.6b-Q4_K_M.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    assert main(["serve", "--model", str(gguf), "--port", "0"]) == 2
    assert "is a GGUF file (llama.cpp's format)" in capsys.readouterr().err


def test_core_environment_is_read_in_env_py_and_documented():
    core = Path(__file__).resolve().parents[1] / "atlas_core"
    readers = [p for p in core.rglob("*.py") if p.name != "env.py"
               and re.search(r"(environ|getenv)[^\n]*ATLAS_", p.read_text())]
    assert readers == [], "read ATLAS_* variables in atlas_core/env.py"
    names = set(re.findall(r"ATLAS_[A-Z0-9_]+", (core / "env.py").read_text()))
    doc = (core.parent / "docs" / "env_vars.md").read_text()
    assert {"ATLAS_HOST", "ATLAS_PORT", "ATLAS_API_KEY"} <= names
    assert sorted(n for n in names if f"`{n}`" not in doc) == []
