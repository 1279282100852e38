"""``atlas serve`` flags of scheduling policies, sampling presets and agent-loop guards
(see docs/serving.md)."""

from __future__ import annotations

import argparse
from typing import Any

from atlas_core.cli._arg_types import non_negative_int

#: EngineArgs fields these flags set (argparse dest == field name).
POLICY_FIELDS = ("scheduling_policy", "tbt_deadline_ms", "admission_age_cap_ms",
                 "sampling_presets", "max_identical_tool_calls", "max_tool_calls",
                 "reasoning_loop_guard", "scrub_tool_markup")


def add_policy_arguments(p: argparse.ArgumentParser) -> None:
    """Add the scheduling, preset and guard flags to ``p``."""
    s = p.add_argument_group("scheduling")
    s.add_argument("--scheduling-policy", choices=["fifo", "slo", "slai"], default="fifo",
                   help="fifo (default) or slo: decode rows near their time-between-tokens "
                   "deadline first, prefill chunks sized to the time left, shortest prompts "
                   "admitted first within --admission-age-cap-ms (slai: alias of slo)")
    s.add_argument("--tbt-deadline-ms", type=float, default=50.0, metavar="MS",
                   help="slo: target time between two tokens of a stream (default 50)")
    s.add_argument("--admission-age-cap-ms", type=float, default=2000.0, metavar="MS",
                   help="slo: a prompt waiting longer than this is admitted before shorter ones "
                   "(default 2000)")
    g = p.add_argument_group("sampling presets and agent guards")
    g.add_argument("--sampling-presets", default=None, metavar="FILE",
                   help='JSON {"thinking": {...}, "non_thinking": {...}, "tool_calls": {...}} '
                   "of sampling defaults per mode; overrides the model's presets")
    g.add_argument("--max-identical-tool-calls", type=non_negative_int, default=3, metavar="N",
                   help="stop a response that repeats the same tool call N times (default 3; "
                   "0: off)")
    g.add_argument("--max-tool-calls", type=non_negative_int, default=64, metavar="N",
                   help="stop a response after N tool calls (default 64; 0: no cap)")
    g.add_argument("--reasoning-loop-guard", action=argparse.BooleanOptionalAction, default=True,
                   help="stop a tool-using response whose reasoning loops (default on)")
    g.add_argument("--scrub-tool-markup", action=argparse.BooleanOptionalAction, default=True,
                   help="remove leaked tool-call markup from content (default on)")


def policy_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The EngineArgs keyword arguments of these flags."""
    return {name: getattr(args, name) for name in POLICY_FIELDS if hasattr(args, name)}
