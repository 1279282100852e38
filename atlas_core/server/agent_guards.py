"""Agent-loop guards of one chat request, from its fields and server flags.

Tool-using requests (tools offered) get :class:`~atlas_core.engine.agent_guards.AgentGuardParams`
built from the request's tool-call and reasoning parsers; the request fields
``max_identical_tool_calls``, ``max_tool_calls`` (0 switches one off) and
``reasoning_loop_guard`` override the server's flags, and ``scrub_tool_markup`` switches the
content scrubber (:mod:`atlas_core.parsers.markup_scrub`).
"""

from __future__ import annotations

from typing import Any

from atlas_core.engine.agent_guards import AgentGuardParams
from atlas_core.server.errors import APIError
from atlas_core.server.state import engine_attr

#: Request fields of the guards (OpenAI chat / Anthropic extras; ``max_tool_calls`` is the
#: Responses API's name).
GUARD_FIELDS = ("max_identical_tool_calls", "max_tool_calls", "reasoning_loop_guard",
                "scrub_tool_markup")


def _checked(fields: dict[str, Any]) -> dict[str, Any]:
    given = {name: fields.pop(name) for name in GUARD_FIELDS if fields.get(name) is not None}
    for name in ("max_identical_tool_calls", "max_tool_calls"):
        value = given.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 0):
            raise APIError(400, f"{name} must be an integer >= 0 (0: off), got {value!r}",
                           param=name)
    for name in ("reasoning_loop_guard", "scrub_tool_markup"):
        if name in given and not isinstance(given[name], bool):
            raise APIError(400, f"{name} must be true or false, got {given[name]!r}", param=name)
    return given


def attach_guards(state: Any, fields: dict[str, Any], tool_cls: type | None, offered: Any,
                  reasoning_cls: type | None, in_reasoning: bool) -> bool:
    """Move the guard fields out of ``fields`` and, when tools are offered, set
    ``fields["agent_guards"]``; returns whether content is scrubbed of tool-call markup.

    Raises:
        APIError: 400 naming a guard field with a wrong value.
    """
    given = _checked(fields)
    if not offered:
        return False
    args = engine_attr(state.engine, "args")
    scrub = given.get("scrub_tool_markup", getattr(args, "scrub_tool_markup", True))
    if tool_cls is not None:
        fields["agent_guards"] = AgentGuardParams(
            tool_parser=tool_cls, tools=offered, reasoning_parser=reasoning_cls,
            in_reasoning=in_reasoning,
            max_identical_tool_calls=given.get("max_identical_tool_calls"),
            max_tool_calls=given.get("max_tool_calls"),
            reasoning_loop=given.get("reasoning_loop_guard"))
    return bool(scrub)
