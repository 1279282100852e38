"""Tool-call and reasoning parsers for generated text (streamed and whole)."""

from atlas_core.parsers.base import ToolParser
from atlas_core.parsers.deepseek_v3 import DeepSeekV3ToolParser
from atlas_core.parsers.events import ParsedOutput, ParserEvents, ToolCall, ToolCallDelta
from atlas_core.parsers.hermes import HermesToolParser
from atlas_core.parsers.llama3_json import Llama3JsonToolParser
from atlas_core.parsers.mistral import MistralToolParser
from atlas_core.parsers.nemotron_v2 import NemotronV2ToolParser
from atlas_core.parsers.output import OutputParser
from atlas_core.parsers.qwen3_coder import Qwen3CoderToolParser
from atlas_core.parsers.reasoning import ReasoningParser, prompt_opens_reasoning
from atlas_core.parsers.registry import (
    REASONING_PARSERS,
    TOOL_PARSERS,
    default_reasoning_parser_for,
    default_tool_parser_for,
    get_reasoning_parser,
    get_tool_parser,
)

__all__ = [
    "DeepSeekV3ToolParser",
    "NemotronV2ToolParser",
    "HermesToolParser", "Llama3JsonToolParser", "MistralToolParser", "OutputParser", "ParsedOutput",
    "ParserEvents", "Qwen3CoderToolParser", "REASONING_PARSERS", "ReasoningParser", "TOOL_PARSERS",
    "ToolCall", "ToolCallDelta", "ToolParser", "default_reasoning_parser_for", "default_tool_parser_for",
    "get_reasoning_parser", "get_tool_parser", "prompt_opens_reasoning",
]
