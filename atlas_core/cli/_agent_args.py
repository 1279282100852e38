"""``atlas serve`` flags of tool calling, reasoning and the Responses API (see
docs/tool-calling.md, docs/reasoning.md), and the ServerConfig fields they set."""

from __future__ import annotations

import argparse
from typing import Any

from atlas_core.cli._arg_types import non_negative_int

#: vLLM's ``--reasoning-parser`` names -> Atlas's parser of the same format.
VLLM_REASONING_PARSERS = {"qwen3": "think", "deepseek_r1": "think"}


def add_agent_arguments(p: argparse.ArgumentParser) -> None:
    """Add the tool-calling, reasoning and Responses API flags to ``p``."""
    from atlas_core.parsers import REASONING_PARSERS, TOOL_PARSERS
    a = p.add_argument_group("tools and reasoning")
    a.add_argument("--tool-call-parser", default="auto",
                   choices=["auto", "none", *sorted(TOOL_PARSERS)],
                   help="tool-call format of the model's output (default auto: from the chat "
                   "template and model_type; none: leave calls in the content)")
    a.add_argument("--reasoning-parser", default="auto", type=_reasoning_parser,
                   choices=["auto", "none", *sorted(REASONING_PARSERS)],
                   help="reasoning format (default auto: think when the chat template has "
                   "<think> blocks; none: leave reasoning in the content; vLLM's "
                   f"{' and '.join(VLLM_REASONING_PARSERS)} mean think)")
    a.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="accepted for vLLM compatibility: Atlas always parses tool calls "
                   "(tool_choice auto) unless --tool-call-parser none")
    a.add_argument("--default-thinking", choices=["on", "off"], default=None,
                   help="enable_thinking for requests that do not choose (default: the chat "
                   "template's own default)")
    a.add_argument("--disable-thinking", action="store_true",
                   help="render every prompt with enable_thinking false, whatever requests ask")
    a.add_argument("--reasoning-budget", type=non_negative_int, default=None, metavar="TOKENS",
                   help="default most tokens of a think block, then it is closed and the "
                   "answer follows (default: no limit; requests may set their own)")
    a.add_argument("--max-stored-responses", type=non_negative_int, default=1000, metavar="N",
                   help="Responses API results kept in memory for previous_response_id "
                   "(least recently used dropped first; default 1000, 0 stores none)")


def agent_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The ServerConfig keyword arguments of these flags (``none`` parsers become None)."""
    return dict(tool_call_parser=_parser_name(args.tool_call_parser),
                reasoning_parser=_parser_name(args.reasoning_parser),
                default_thinking=(None if args.default_thinking is None
                                  else args.default_thinking == "on"),
                disable_thinking=args.disable_thinking,
                reasoning_budget=args.reasoning_budget,
                max_stored_responses=args.max_stored_responses)


def _reasoning_parser(text: str) -> str:
    return VLLM_REASONING_PARSERS.get(text, text)


def _parser_name(value: str) -> str | None:
    return None if value == "none" else value
