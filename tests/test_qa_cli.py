"""QA regressions of the ``atlas`` command: bad input is one ``error:`` line, never a traceback."""

from __future__ import annotations

import pytest

from atlas_core.cli import error_message, main
from atlas_core.testing.checkpoints import write_tiny_checkpoint


def last_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("argv, words", [
    (["serve", "--port", "99999"], ["--port", "99999"]),
    (["serve", "--quantization", "fp8"], ["unrecognized", "--quantization", "atlas serve --help"]),
    (["serve", "--tool-parser", "hermes"], ["--tool-call-parser"]),
    (["generate", "--max-token", "3x"], ["--max-tokens"]),
    (["serve", "--request-timeout", "-1"], ["--request-timeout", "-1"]),
    (["serve", "--served-model-name", ""], ["--served-model-name", "empty"]),
])
def test_argument_errors_name_the_flag(capsys, argv, words):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    line = last_error_line(capsys)
    assert all(w in line for w in words), line


def test_serve_unknown_backend_fails_before_listening(capsys, tmp_path):
    write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path)
    assert main(["serve", str(tmp_path), "--backend", "nope", "--port", "0"]) == 2
    line = last_error_line(capsys)
    assert line.startswith("error: --backend nope") and "numpy" in line and "'" not in line


def test_unexpected_errors_are_one_line(capsys, monkeypatch):
    """Every subcommand gets the same safety net (atlas bench used to print tracebacks)."""
    import atlas_core.cli.bench as bench

    def broken(args):
        raise KeyError("no gpu backend named 'nope'; registered: numpy")
    monkeypatch.setattr(bench, "run", broken)
    assert main(["bench", "--model", "tiny"]) == 2
    assert last_error_line(capsys) == "error: no gpu backend named 'nope'; registered: numpy"

    def crash(args):
        raise RuntimeError("device lost")
    monkeypatch.setattr(bench, "run", crash)
    assert main(["bench", "--model", "tiny"]) == 1
    line = last_error_line(capsys)
    assert "RuntimeError: device lost" in line and "ATLAS_LOG_LEVEL=DEBUG" in line


def test_error_message_unquotes_key_errors():
    assert error_message(KeyError("no such thing")) == "no such thing"
    assert error_message(ValueError("two\nlines")) == "two lines"


def test_generate_without_tokenizer(capsys, tmp_path):
    write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path)
    for f in tmp_path.glob("tokenizer*"):
        f.unlink()
    assert main(["generate", str(tmp_path), "-p", "hi", "--backend", "numpy"]) == 2
    assert "has no tokenizer" in last_error_line(capsys)


def test_generate_prompt_given_as_model(capsys):
    """`atlas generate "What is 482 + 39?"` (a docs recipe) says to use -p, loads nothing."""
    assert main(["generate", "What is 482 + 39?"]) == 2
    assert "-p 'What is 482 + 39?'" in last_error_line(capsys)


def test_serve_without_tokenizer_exits_with_one_line(tmp_path):
    """It used to print "model ready" and then answer every request 503."""
    import subprocess
    import sys

    write_tiny_checkpoint("Qwen3ForCausalLM", tmp_path)
    for f in tmp_path.glob("tokenizer*"):
        f.unlink()
    code = "import sys; from atlas_core.cli import main; sys.exit(main())"
    proc = subprocess.run([sys.executable, "-c", code, "serve", str(tmp_path), "--port", "0",
                           "--backend", "numpy"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "model ready" not in proc.stdout
    assert "has no tokenizer" in proc.stderr.strip().splitlines()[-1]
