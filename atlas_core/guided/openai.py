"""OpenAI (and Anthropic) request fields -> `GuidedDecodingParams`, for the HTTP server."""

from __future__ import annotations

from typing import Any

from atlas_core.guided.params import (TOOL_CALL_FORMATS, GuidedDecodingError, GuidedDecodingParams,
                                      function_specs)


def _as_dict(value: Any, what: str) -> dict:
    if isinstance(value, dict):
        return value
    try:
        import msgspec
        value = msgspec.to_builtins(value)
    except TypeError:
        value = None
    if not isinstance(value, dict):
        raise GuidedDecodingError(f"{what} must be a JSON object")
    return value


def forced_tool_name(tool_choice: Any) -> str | bool:
    """The function ``tool_choice`` names, True for "must call some tool", False otherwise.

    Understands OpenAI (``"required"``, ``{"type": "function", "function": {"name"}}``) and
    Anthropic (``{"type": "any"}``, ``{"type": "tool", "name"}``) forms.
    """
    if tool_choice is None or isinstance(tool_choice, str):
        if tool_choice in (None, "auto", "none", "required"):
            return tool_choice == "required"
        raise GuidedDecodingError(f"tool_choice must be 'none', 'auto', 'required' or a named "
                                  f"function, got {tool_choice!r}")
    choice = _as_dict(tool_choice, "tool_choice")
    kind = choice.get("type")
    if kind == "any":
        return True
    if kind in ("auto", "none"):
        return False
    name = (choice.get("function") or {}).get("name") if kind == "function" else choice.get("name")
    if kind not in ("function", "tool") or not isinstance(name, str) or not name:
        raise GuidedDecodingError("a named tool_choice must look like {\"type\": \"function\", "
                                  "\"function\": {\"name\": \"...\"}}")
    return name


def guided_from_openai(*, response_format: Any = None, tools: list | None = None,
                       tool_choice: Any = None, tool_parser: str | None = None,
                       parallel_tool_calls: bool | None = True) -> GuidedDecodingParams | None:
    """The constraint a chat/completions request asks for, or None when its output is free.

    A forced tool call (``tool_choice`` ``"required"`` or a named function) wins over
    ``response_format``; ``"auto"`` and ``"none"`` constrain nothing.

    Args:
        response_format: ``{"type": "text" | "json_object" | "json_schema", "json_schema":
            {"name", "schema", "strict"}}`` (dicts or msgspec structs).
        tools: the request's tools (OpenAI function tools, or Anthropic ``input_schema`` tools).
        tool_choice: the request's tool_choice.
        tool_parser: the served model's tool-call format (the server's ``--tool-call-parser``
            or the model default), one of ``hermes``, ``qwen3_coder``, ``mistral``, ``llama3_json``.
        parallel_tool_calls: allow several calls when a call is forced (default True).

    Raises:
        GuidedDecodingError: (a ``ValueError``; answer HTTP 400) with a one-line reason.
    """
    forced = forced_tool_name(tool_choice)
    if forced is not False:
        specs = function_specs(list(tools or []))
        if isinstance(forced, str):
            specs = [s for s in specs if s["name"] == forced]
            if not specs:
                raise GuidedDecodingError(f"tool_choice names function {forced!r}, which is not in tools")
        if tool_parser not in TOOL_CALL_FORMATS:
            raise GuidedDecodingError(
                f"tool_choice {'required' if forced is True else 'naming a function'} needs a "
                f"tool-call format this server can force ({', '.join(TOOL_CALL_FORMATS)}); got "
                f"{tool_parser!r}: start the server with --tool-call-parser")
        return GuidedDecodingParams.tool_call(specs, tool_parser, parallel_tool_calls is not False)
    if response_format is None:
        return None
    fmt = _as_dict(response_format, "response_format")
    kind = fmt.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return GuidedDecodingParams.json_object()
    if kind != "json_schema":
        raise GuidedDecodingError(f"response_format type must be 'text', 'json_object' or "
                                  f"'json_schema', got {kind!r}")
    spec = fmt.get("json_schema")
    spec = _as_dict(spec, "response_format.json_schema") if spec is not None else {}
    schema = spec.get("schema", spec.get("schema_"))
    if not isinstance(schema, dict):
        raise GuidedDecodingError("response_format json_schema needs a 'schema' object, e.g. "
                                  "{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"x\", "
                                  "\"schema\": {...}}}")
    return GuidedDecodingParams.json_schema(schema)
