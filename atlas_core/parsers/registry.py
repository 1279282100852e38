"""Parsers by name, and which one a model most likely needs."""

from __future__ import annotations

from atlas_core.parsers.base import ToolParser
from atlas_core.parsers.deepseek_v3 import DeepSeekV3ToolParser
from atlas_core.parsers.gemma4 import Gemma4ReasoningParser, Gemma4ToolParser
from atlas_core.parsers.hermes import HermesToolParser
from atlas_core.parsers.llama3_json import Llama3JsonToolParser
from atlas_core.parsers.minimax_m2 import MiniMaxM2ToolParser
from atlas_core.parsers.mistral import MistralToolParser
from atlas_core.parsers.nemotron_v2 import NemotronV2ToolParser
from atlas_core.parsers.qwen3_coder import Qwen3CoderToolParser
from atlas_core.parsers.reasoning import ReasoningParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    cls.name: cls for cls in (HermesToolParser, Qwen3CoderToolParser, MistralToolParser, Llama3JsonToolParser,
                              Gemma4ToolParser, MiniMaxM2ToolParser, DeepSeekV3ToolParser,
                              NemotronV2ToolParser)
}
REASONING_PARSERS: dict[str, type[ReasoningParser]] = {"think": ReasoningParser,
                                                       "gemma4": Gemma4ReasoningParser}

_MODEL_TYPE_TOOL_PARSERS = {
    "qwen2": "hermes", "qwen2_moe": "hermes", "qwen3": "hermes", "qwen3_moe": "hermes",
    "qwen3_5": "qwen3_coder", "qwen3_5_moe": "qwen3_coder", "qwen3_next": "qwen3_coder",
    "nemotron_h": "qwen3_coder", "mistral": "mistral", "mistral3": "mistral", "ministral": "mistral",
    "llama": "llama3_json", "gemma4": "gemma4", "gemma4_text": "gemma4",
    "minimax_m2": "minimax_m2", "deepseek_v3": "deepseek_v3", "mistral4": "mistral",
}


def get_tool_parser(name: str) -> type[ToolParser]:
    """The tool parser class registered as ``name``.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    if name not in TOOL_PARSERS:
        raise ValueError(f"unknown tool-call parser {name!r}; choose one of {sorted(TOOL_PARSERS)}")
    return TOOL_PARSERS[name]


def get_reasoning_parser(name: str) -> type[ReasoningParser]:
    """The reasoning parser class registered as ``name``.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    if name not in REASONING_PARSERS:
        raise ValueError(f"unknown reasoning parser {name!r}; choose one of {sorted(REASONING_PARSERS)}")
    return REASONING_PARSERS[name]


def default_tool_parser_for(model_type: str | None = None, chat_template: str | None = None) -> str | None:
    """Best guess of the tool parser name from the chat template, then config.json's ``model_type``.

    Returns None when neither points at a supported format.
    """
    template = chat_template or ""
    if "<|tool_call>" in template:
        return "gemma4"
    if "<minimax:tool_call>" in template:
        return "minimax_m2"
    if "<｜tool▁calls▁begin｜>" in template:
        return "deepseek_v3"
    if "<function=" in template and "<parameter=" in template:
        return "qwen3_coder"
    if "<TOOLCALL>" in template:
        return "nemotron_v2"
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|python_tag|>" in template or ("<|start_header_id|>" in template and "tools" in template):
        return "llama3_json"
    if chat_template is None or not template:
        return _MODEL_TYPE_TOOL_PARSERS.get((model_type or "").lower())
    return None


def default_reasoning_parser_for(chat_template: str | None = None) -> str | None:
    """``"think"`` when the chat template uses ``<think>`` blocks, ``"gemma4"`` for its
    ``<|channel>`` thinking, else None."""
    if chat_template and "<|channel>" in chat_template:
        return "gemma4"
    return "think" if chat_template and "</think>" in chat_template else None
