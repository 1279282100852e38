"""Guided decoding (structured outputs): force the output to match a JSON schema, a regex, a
grammar or a valid tool call, by masking disallowed tokens with llguidance each step.

>>> params = SamplingParams(guided=GuidedDecodingParams.json_schema({"type": "object", ...}))
>>> params = SamplingParams(guided=guided_from_openai(response_format=body["response_format"]))

Importing this package does not import llguidance; compiling a constraint does.
"""

from atlas_core.guided.compiler import GrammarCompiler, ll_tokenizer
from atlas_core.guided.matcher import GuidedMatcher, fill_bitmasks
from atlas_core.guided.openai import forced_tool_name, guided_from_openai
from atlas_core.guided.params import (GUIDED_KINDS, TOOL_CALL_FORMATS, GuidedDecodingError,
                                      GuidedDecodingParams, ToolCallSpec, function_specs)
from atlas_core.guided.vllm import guided_from_vllm

__all__ = [
    "GUIDED_KINDS", "GrammarCompiler", "GuidedDecodingError", "GuidedDecodingParams",
    "GuidedMatcher", "TOOL_CALL_FORMATS", "ToolCallSpec", "fill_bitmasks", "forced_tool_name",
    "function_specs", "guided_from_openai", "guided_from_vllm", "ll_tokenizer",
]
