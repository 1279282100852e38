"""vLLM's guided-decoding request fields -> `GuidedDecodingParams`.

Clients written for vLLM constrain output with ``guided_json``, ``guided_regex``,
``guided_choice`` and ``guided_grammar``, or with the newer ``structured_outputs`` object
(``{"json" | "regex" | "choice" | "grammar" | "json_object": ...}``). They map onto the same
constraints as OpenAI's ``response_format`` and run through the same llguidance path.
"""

from __future__ import annotations

import json
from typing import Any

from atlas_core.guided.params import GuidedDecodingError, GuidedDecodingParams

#: The flat vLLM fields, in the order they are looked at.
VLLM_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
#: Keys of ``structured_outputs`` that constrain the output.
STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object")
#: Keys of ``structured_outputs`` that tune a backend and have no effect here.
STRUCTURED_OPTIONS = ("disable_fallback", "disable_any_whitespace",
                      "disable_additional_properties", "whitespace_pattern", "backend")
_SAFE = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_ ")


def literal_regex(text: str) -> str:
    """A regex (llguidance / Rust syntax) matching exactly ``text``: ASCII punctuation and
    control characters are written as ``\\x{HEX}``."""
    return "".join(c if c in _SAFE or ord(c) > 127 else f"\\x{{{ord(c):X}}}" for c in text)


def _json_schema(value: Any, param: str) -> GuidedDecodingParams:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise GuidedDecodingError(f"{param} is a string but not JSON: {exc}") from None
    if not isinstance(value, (dict, bool)):
        raise GuidedDecodingError(f"{param} must be a JSON schema object")
    return GuidedDecodingParams.json_schema(value)


def _choice(value: Any, param: str) -> GuidedDecodingParams:
    if (not isinstance(value, list) or not value
            or not all(isinstance(c, str) and c for c in value)):
        raise GuidedDecodingError(f"{param} must be a non-empty list of non-empty strings")
    return GuidedDecodingParams.regex("(" + "|".join(literal_regex(c) for c in value) + ")")


def _text(value: Any, param: str) -> str:
    if not isinstance(value, str) or not value:
        raise GuidedDecodingError(f"{param} must be a non-empty string")
    return value


def _constraint(kind: str, value: Any, param: str) -> GuidedDecodingParams:
    if kind == "json":
        return _json_schema(value, param)
    if kind == "choice":
        return _choice(value, param)
    if kind == "regex":
        return GuidedDecodingParams.regex(_text(value, param))
    if kind == "json_object":
        if value is not True:
            raise GuidedDecodingError(f"{param} must be true")
        return GuidedDecodingParams.json_object()
    return GuidedDecodingParams.grammar(_text(value, param))


def _structured(value: Any) -> tuple[str, Any, str]:
    if not isinstance(value, dict):
        raise GuidedDecodingError("structured_outputs must be an object such as "
                                  "{\"json\": {...}}, {\"regex\": \"...\"} or {\"choice\": [...]}")
    unknown = [k for k in value if k not in STRUCTURED_KINDS + STRUCTURED_OPTIONS]
    if unknown:
        raise GuidedDecodingError(f"structured_outputs.{unknown[0]} is not supported; use one of "
                                  f"{', '.join(STRUCTURED_KINDS)}")
    kinds = [k for k in STRUCTURED_KINDS if value.get(k) not in (None, False)]
    if len(kinds) != 1:
        raise GuidedDecodingError("structured_outputs must set exactly one of "
                                  f"{', '.join(STRUCTURED_KINDS)}; got {kinds or 'none'}")
    return kinds[0], value[kinds[0]], f"structured_outputs.{kinds[0]}"


def guided_from_vllm(fields: dict[str, Any]) -> tuple[GuidedDecodingParams | None, str]:
    """The constraint of a request's vLLM fields, and the field it came from.

    Args:
        fields: the request's ``guided_json``, ``guided_regex``, ``guided_choice``,
            ``guided_grammar`` and ``structured_outputs`` (None when not sent).

    Returns:
        ``(params, param)``; ``(None, "")`` when no field constrains the output.

    Raises:
        GuidedDecodingError: more than one field is set, or one is malformed.
    """
    found = []
    for name in VLLM_FIELDS:
        if fields.get(name) is not None:
            found.append((name.removeprefix("guided_"), fields[name], name))
    if fields.get("structured_outputs") is not None:
        found.append(_structured(fields["structured_outputs"]))
    if not found:
        return None, ""
    if len(found) > 1:
        names = ", ".join(param for _, _, param in found)
        raise GuidedDecodingError(f"{names} each constrain the output; send only one of them")
    kind, value, param = found[0]
    return _constraint(kind, value, param), param
