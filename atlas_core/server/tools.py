"""Tools and ``tool_choice`` of the three APIs brought to one shape.

Chat templates read OpenAI chat tools (``{"type": "function", "function": {name, description,
parameters}}``), so Anthropic (``input_schema``) and Responses (flat ``name``/``parameters``)
tools are converted to it. ``tool_choice`` becomes a :class:`ToolChoice`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from atlas_core.server.errors import APIError


@dataclass
class ToolChoice:
    """``mode`` is ``none``, ``auto``, ``required`` or ``named`` (then ``name`` is the tool)."""

    mode: str = "auto"
    name: str | None = None

    @property
    def is_forced(self) -> bool:
        return self.mode in ("required", "named")


def _function(name: Any, description: Any, parameters: Any, param: str) -> dict:
    if not isinstance(name, str) or not name:
        raise APIError(400, "each tool needs a non-empty `name`", param=f"{param}.name")
    if parameters is not None and not isinstance(parameters, dict):
        raise APIError(400, f"tool `{name}`: parameters must be a JSON schema object",
                       param=f"{param}.parameters")
    function = {"name": name, "parameters": parameters or {"type": "object", "properties": {}}}
    if description:
        function["description"] = description
    return {"type": "function", "function": function}


def chat_tools(tools: list | None, param: str = "tools") -> list[dict] | None:
    """OpenAI chat tools, checked (400 for a tool that is not a named function)."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" \
                or not isinstance(fn, dict):
            raise APIError(400, "tools must be {\"type\": \"function\", \"function\": {...}} "
                           "objects", param=f"{param}[{i}]")
        out.append(_function(fn.get("name"), fn.get("description"), fn.get("parameters"),
                             f"{param}[{i}].function"))
    return out


def responses_tools(tools: list | None, param: str = "tools") -> list[dict] | None:
    """Responses API function tools (``{"type": "function", "name", "parameters"}``)."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise APIError(400, f"tool type `{kind}` is not supported; this server runs "
                           "function tools only", param=f"{param}[{i}].type")
        out.append(_function(tool.get("name"), tool.get("description"), tool.get("parameters"),
                             f"{param}[{i}]"))
    return out


def anthropic_tools(tools: list | None, param: str = "tools") -> list[dict] | None:
    """Anthropic tools (``name``, ``description``, ``input_schema``); OpenAI-shaped ones pass."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if isinstance(tool, dict) and "function" in tool:
            out.extend(chat_tools([tool], f"{param}[{i}]"))
        elif isinstance(tool, dict) and tool.get("type") in (None, "custom") or \
                isinstance(tool, dict) and "input_schema" in tool:
            out.append(_function(tool.get("name"), tool.get("description"),
                                 tool.get("input_schema"), f"{param}[{i}]"))
        else:
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise APIError(400, f"tool type `{kind}` is not supported; send custom tools with "
                           "an input_schema", param=f"{param}[{i}].type")
    return out


def tool_names(tools: list[dict] | None) -> list[str]:
    return [t["function"]["name"] for t in tools or ()]


def openai_tool_choice(raw: Any, tools: list[dict] | None,
                       param: str = "tool_choice") -> ToolChoice:
    """Chat (``{"type": "function", "function": {"name"}}``) or Responses
    (``{"type": "function", "name"}``) ``tool_choice``, checked against ``tools``."""
    if raw is None:
        choice = ToolChoice("auto" if tools else "none")
    elif raw in ("none", "auto", "required"):
        choice = ToolChoice(raw)
    elif isinstance(raw, dict) and raw.get("type") == "function":
        name = (raw.get("function") or {}).get("name") or raw.get("name")
        choice = ToolChoice("named", name)
    else:
        raise APIError(400, "tool_choice must be none, auto, required or {\"type\": "
                       "\"function\", \"function\": {\"name\": ...}}", param=param)
    return check_choice(choice, tools, param)


def anthropic_tool_choice(raw: dict | None, tools: list[dict] | None
                          ) -> tuple[ToolChoice, bool]:
    """Anthropic ``tool_choice`` (``auto``/``any``/``tool``/``none``) and whether parallel
    calls are allowed (``disable_parallel_tool_use``)."""
    raw = raw or {}
    kind = raw.get("type", "auto" if tools else "none")
    modes = {"auto": "auto", "any": "required", "tool": "named", "none": "none"}
    if kind not in modes:
        raise APIError(400, f"tool_choice.type `{kind}` is unknown; use auto, any, tool or none",
                       param="tool_choice.type")
    choice = check_choice(ToolChoice(modes[kind], raw.get("name")), tools, "tool_choice")
    return choice, not raw.get("disable_parallel_tool_use", False)


def check_choice(choice: ToolChoice, tools: list[dict] | None, param: str) -> ToolChoice:
    """400 when a forced choice has no tools or names a tool that was not given."""
    if choice.mode == "auto" and not tools:
        return ToolChoice("none")
    if choice.is_forced and not tools:
        raise APIError(400, "tool_choice forces a tool call, which needs `tools`; send the "
                       "tools or drop tool_choice", param=param)
    if choice.mode == "named" and choice.name not in tool_names(tools):
        raise APIError(400, f"tool_choice names `{choice.name}`, which is not among the tools "
                       f"({', '.join(tool_names(tools))})", param=param)
    return choice


def template_tool_calls(tool_calls: list[dict]) -> list[dict]:
    """Assistant ``tool_calls`` with JSON-text arguments parsed to objects, the form most
    templates read (Qwen3.5's iterates ``arguments|items``); templates that need text get it
    back at render time (:func:`atlas_core.server.prompts.template_messages`)."""
    out = []
    for call in tool_calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
            try:
                arguments = json.loads(fn["arguments"])
            except ValueError:
                arguments = fn["arguments"]
            call = {**call, "function": {**fn, "arguments": arguments}}
        out.append(call)
    return out
