"""``atlas serve`` flags of tool calling, reasoning and the Responses API."""

from __future__ import annotations

import argparse

import pytest

from atlas_core.cli import serve


def config_of(*argv):
    parser = argparse.ArgumentParser()
    serve.add_parser(parser.add_subparsers())
    return serve.server_config(parser.parse_args(["serve", *argv]))


def test_defaults():
    c = config_of()
    assert (c.tool_call_parser, c.reasoning_parser) == ("auto", "auto")
    assert c.default_thinking is None and not c.disable_thinking
    assert c.reasoning_budget is None and c.max_stored_responses == 1000


def test_flags():
    c = config_of("--tool-call-parser", "qwen3_coder", "--reasoning-parser", "none",
                  "--default-thinking", "off", "--disable-thinking", "--reasoning-budget", "512",
                  "--max-stored-responses", "0")
    assert (c.tool_call_parser, c.reasoning_parser) == ("qwen3_coder", None)
    assert c.default_thinking is False and c.disable_thinking
    assert c.reasoning_budget == 512 and c.max_stored_responses == 0
    assert config_of("--default-thinking", "on").default_thinking is True


@pytest.mark.parametrize("argv", [["--tool-call-parser", "nope"], ["--reasoning-budget", "-1"],
                                  ["--max-stored-responses", "x"]])
def test_bad_values_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as info:
        config_of(*argv)
    assert info.value.code == 2 and "error:" in capsys.readouterr().err
