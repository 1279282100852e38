"""`GuidedDecodingParams`: what a request's output must match. Light: no llguidance import."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

#: Kinds of constraint, each with the type of its ``spec``.
GUIDED_KINDS = {
    "json_schema": "a JSON schema (dict)",
    "json_object": "None (any JSON object)",
    "regex": "a regular expression (str)",
    "grammar": "a Lark grammar in llguidance syntax (str)",
    "tool_call": "a ToolCallSpec",
}

#: Tool-call formats a grammar can force (names of :mod:`atlas_core.parsers` tool parsers).
TOOL_CALL_FORMATS = ("hermes", "qwen3_coder", "mistral", "llama3_json", "minimax_m2")


class GuidedDecodingError(ValueError):
    """A constraint that cannot be compiled (bad schema, regex or grammar); maps to HTTP 400."""


@dataclass(frozen=True)
class ToolCallSpec:
    """Calls the output must consist of.

    Attributes:
        tools: ``{"name": str, "parameters": JSON schema}`` per callable function.
        format: tool-call format, one of :data:`TOOL_CALL_FORMATS`.
        parallel: allow more than one call.
        max_calls: most calls when ``parallel`` (None: no limit).
    """

    tools: tuple[dict, ...]
    format: str = "hermes"
    parallel: bool = True
    max_calls: int | None = None


@dataclass(frozen=True)
class GuidedDecodingParams:
    """A constraint on the generated text, enforced token by token with a grammar mask.

    Build one with the classmethods, or from OpenAI request fields with
    :func:`atlas_core.guided.guided_from_openai`.

    Attributes:
        kind: one of :data:`GUIDED_KINDS`.
        spec: the constraint (see :data:`GUIDED_KINDS` for its type per kind).

    Raises:
        GuidedDecodingError: ``kind`` unknown or ``spec`` of the wrong type.
    """

    kind: str
    spec: Any = None
    key: str = field(init=False, repr=False, compare=False, default="")

    def __post_init__(self) -> None:
        if self.kind not in GUIDED_KINDS:
            raise GuidedDecodingError(f"guided decoding kind must be one of {sorted(GUIDED_KINDS)}, "
                                      f"got {self.kind!r}")
        want = {"json_schema": dict, "json_object": type(None), "regex": str, "grammar": str,
                "tool_call": ToolCallSpec}[self.kind]
        if not isinstance(self.spec, want) and not (self.kind == "json_schema"
                                                    and isinstance(self.spec, bool)):
            raise GuidedDecodingError(f"a {self.kind} constraint needs {GUIDED_KINDS[self.kind]}, "
                                      f"got {type(self.spec).__name__}")
        spec = self.spec
        if isinstance(spec, ToolCallSpec):
            spec = [spec.format, spec.parallel, spec.max_calls, list(spec.tools)]
        object.__setattr__(self, "key", self.kind + ":" + json.dumps(spec, sort_keys=True))

    def __hash__(self) -> int:
        return hash(self.key)

    @classmethod
    def json_schema(cls, schema: dict) -> "GuidedDecodingParams":
        """Output is one JSON value valid against ``schema``."""
        return cls("json_schema", schema)

    @classmethod
    def json_object(cls) -> "GuidedDecodingParams":
        """Output is one JSON object (any keys and values)."""
        return cls("json_object")

    @classmethod
    def regex(cls, pattern: str) -> "GuidedDecodingParams":
        """Output matches ``pattern`` as a whole."""
        return cls("regex", pattern)

    @classmethod
    def grammar(cls, lark: str) -> "GuidedDecodingParams":
        """Output is a sentence of the Lark grammar ``lark`` (llguidance dialect)."""
        return cls("grammar", lark)

    @classmethod
    def tool_call(cls, tools: list[dict], format: str = "hermes",
                  parallel: bool = True, max_calls: int | None = None) -> "GuidedDecodingParams":
        """Output is one (or, with ``parallel``, several) calls of ``tools`` in ``format``.

        Args:
            tools: OpenAI tools (``{"type": "function", "function": {...}}``) or bare
                ``{"name", "parameters"}`` function specs.
            format: one of :data:`TOOL_CALL_FORMATS`.
            parallel: allow several calls in one output.
            max_calls: most calls in one output when ``parallel`` (None: no limit).
        """
        if format not in TOOL_CALL_FORMATS:
            raise GuidedDecodingError(f"tool-call format must be one of {list(TOOL_CALL_FORMATS)} "
                                      f"to force a call, got {format!r}")
        if max_calls is not None and (not isinstance(max_calls, int) or max_calls < 1):
            raise GuidedDecodingError(f"max_calls must be an integer >= 1, got {max_calls!r}")
        return cls("tool_call", ToolCallSpec(tuple(function_specs(tools)), format, parallel,
                                             max_calls))


def function_specs(tools: list[dict]) -> list[dict]:
    """``{"name", "parameters"}`` of each OpenAI tool (bare function specs and Anthropic tools,
    whose schema is ``input_schema``, too).

    Raises:
        GuidedDecodingError: no tools, or a tool without a name or with a non-object schema.
    """
    specs = []
    for tool in tools or ():
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise GuidedDecodingError(f"each tool needs a function with a non-empty name, got {tool!r}")
        parameters = fn.get("parameters", fn.get("input_schema"))
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise GuidedDecodingError(f"tool {fn['name']!r}: parameters must be a JSON schema object")
        specs.append({"name": fn["name"], "parameters": parameters})
    if not specs:
        raise GuidedDecodingError("forcing a tool call needs at least one tool in 'tools'")
    return specs
