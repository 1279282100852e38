"""`atlas generate` through atlas_core.cli.main."""

import argparse
import json
import shutil
import subprocess
import sys

import pytest

from atlas_core.cli import main
from atlas_core.testing.checkpoints import write_tiny_checkpoint

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path_factory.mktemp("qwen3")))


def test_json_output(model_dir, capsys):
    rc = main(["generate", model_dir, "--prompt", "Hello", "--prompt", "The quick",
               "--max-tokens", "4", "--temperature", "0.8", "--seed", "3", "--logprobs", "2",
               "--ignore-eos", "--backend", "numpy", "--num-kv-blocks", "32", "--json",
               "--no-chat"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert [d["prompt"] for d in data] == ["Hello", "The quick"]
    c = data[0]["outputs"][0]
    assert len(c["token_ids"]) == 4 and isinstance(c["text"], str)
    assert len(c["logprobs"]) == 4 and len(c["logprobs"][0]["top"]) == 2
    assert c["logprobs"][0]["token_id"] == c["token_ids"][0]


def test_seed_is_reproducible_and_text_output(model_dir, capsys):
    args = ["generate", model_dir, "-p", "Hi", "--max-tokens", "5", "--temperature", "1",
            "--seed", "7", "--backend", "numpy", "--num-kv-blocks", "32"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert main(args) == 0
    assert capsys.readouterr().out == first
    assert "--- prompt 'Hi'" in first and "finish_reason=" in first


def test_chat_flag(model_dir, capsys):
    assert main(["generate", model_dir, "-p", "Hi", "--chat", "--max-tokens", "2", "--json",
                 "--backend", "numpy", "--num-kv-blocks", "32"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["prompt"].startswith("<|im_start|>user")


def test_user_errors_are_one_line(model_dir, capsys):
    assert main(["generate", "/no/such/model", "-p", "x", "--backend", "numpy"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: model '/no/such/model'") and err.count("\n") == 1
    assert main(["generate", model_dir, "-p", "x", "--temperature", "-1", "--backend", "numpy",
                 "--num-kv-blocks", "32"]) == 2
    err = capsys.readouterr().err
    assert "temperature must be" in err and "[0, 100]" in err


def test_subprocess_stdin_prompt(model_dir):
    proc = subprocess.run([sys.executable, "-m", "atlas_core", "generate", model_dir,
                           "--max-tokens", "2", "--json", "--backend", "numpy",
                           "--num-kv-blocks", "32", "--no-chat"], input="Hello",
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)[0]["prompt"] == "Hello"


def test_chat_template_is_the_default(model_dir, capsys):
    assert main(["generate", model_dir, "-p", "Hi", "--max-tokens", "2", "--json",
                 "--backend", "numpy", "--num-kv-blocks", "32"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["prompt"].startswith("<|im_start|>user")


def test_model_without_chat_template(model_dir, tmp_path, capsys):
    plain = tmp_path / "plain"
    shutil.copytree(model_dir, plain)
    config = json.loads((plain / "tokenizer_config.json").read_text())
    config.pop("chat_template")
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    base = ["generate", str(plain), "-p", "Hi", "--max-tokens", "2", "--backend", "numpy",
            "--num-kv-blocks", "32"]
    assert main(base + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["prompt"] == "Hi"
    assert main(base + ["--chat"]) == 2
    assert "no chat template; drop --chat" in capsys.readouterr().err


def _fake_generate(text):
    from atlas_core.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput

    def generate(self, prompts, params=None):
        return [RequestOutput("0", [1, 2], [CompletionOutput(0, [5, 6, 7], text,
                                                             finish_reason="stop")],
                              True, 0, RequestMetrics(0.0), prompt=p["prompt"])
                for p in prompts]
    return generate


@pytest.mark.parametrize("show", [False, True])
def test_think_block_hidden_unless_asked(model_dir, capsys, monkeypatch, show):
    from atlas_core.llm import LLM
    monkeypatch.setattr(LLM, "generate", _fake_generate("<think>\nadd them\n</think>\n\nParis."))
    args = ["generate", model_dir, "-p", "Capital?", "--backend", "numpy", "--num-kv-blocks", "32"]
    assert main(args + (["--show-reasoning"] if show else [])) == 0
    out = capsys.readouterr().out
    assert "<think>" not in out and "</think>" not in out
    assert "--- prompt 'Capital?'\n" in out and "Paris." in out
    assert ("add them" in out) is show
    assert main(args + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)[0]["outputs"][0]
    assert data["reasoning"] == "add them" and data["content"] == "Paris."
    assert data["text"].startswith("<think>")


def test_unfinished_think_block_says_so(model_dir, capsys, monkeypatch):
    from atlas_core.llm import LLM
    monkeypatch.setattr(LLM, "generate", _fake_generate("<think>\nstill going"))
    assert main(["generate", model_dir, "-p", "Q", "--backend", "numpy",
                 "--num-kv-blocks", "32"]) == 0
    out = capsys.readouterr().out
    assert "still going" not in out and "only reasoning so far" in out


@pytest.mark.parametrize("command", ["generate", "bench"])
def test_help_states_every_default(command):
    from atlas_core.cli import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    for action in sub._actions:
        if not action.option_strings or action.default == argparse.SUPPRESS:
            continue
        assert action.help and "default" in action.help, f"{command} {action.option_strings}"
