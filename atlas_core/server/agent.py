"""Planning one chat-style generation, shared by OpenAI chat, Anthropic messages and Responses.

Each endpoint converts its request into a :class:`ChatRequest` (template messages, OpenAI-shaped
tools, a :class:`~atlas_core.server.tools.ToolChoice`, thinking wishes, sampling fields);
:func:`plan_chat` renders the prompt, picks the output parsers and builds the engine's
``SamplingParams`` (thinking budget and, for forced tool calls or structured output, a
grammar constraint from :mod:`atlas_core.guided`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from atlas_core.guided import guided_from_openai, guided_from_vllm
from atlas_core.guided.vllm import VLLM_FIELDS
from atlas_core.parsers import prompt_opens_reasoning
from atlas_core.server.agent_guards import attach_guards
from atlas_core.server.errors import APIError
from atlas_core.server.media import attach_images
from atlas_core.server.prompts import render_prompt
from atlas_core.server.sampling import make_params, sampling_mode
from atlas_core.server.shaping import ParsePlan
from atlas_core.server.thinking import ThinkingRequest, budget_params, resolve_thinking
from atlas_core.server.tools import ToolChoice

#: Most stop strings in one request, and most bytes of them in all.
MAX_STOPS = 64
MAX_STOP_BYTES = 8192


@dataclass
class ChatRequest:
    """An API-neutral chat request.

    Attributes:
        messages: template message dicts (see :mod:`atlas_core.server.prompts`).
        tools: OpenAI chat tools, or None.
        tool_choice: what the model may or must call.
        parallel_tool_calls: allow several calls in one turn.
        thinking: the request's thinking wishes.
        template_kwargs: the request's ``chat_template_kwargs``.
        sampling: ``SamplingParams`` fields the request set (besides ``max_tokens``).
        max_tokens, max_tokens_param: the budget asked for and the field that asked.
        response_format: OpenAI ``response_format`` (``{"type": "json_schema", ...}``), or None.
        format_param: the field ``response_format`` came from (for errors).
        guided: a constraint from vLLM-style fields (``guided_json``, ``structured_outputs``…),
            or None; ``guided_param`` names the field it came from.
    """

    messages: list[dict]
    tools: list[dict] | None = None
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    parallel_tool_calls: bool = True
    thinking: ThinkingRequest = field(default_factory=ThinkingRequest)
    template_kwargs: dict | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None
    max_tokens_param: str = "max_tokens"
    n: int = 1
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    response_format: dict | None = None
    format_param: str = "response_format"
    guided: Any = None
    guided_param: str = "guided_json"


@dataclass
class ChatPlan:
    """What :func:`plan_chat` decided: the prompt, the engine params and how to parse."""

    prompt_text: str
    prompt_ids: list[int]
    params: Any
    parse: ParsePlan
    mm: Any = None


def _markers_are_special(tokenizer, texts) -> bool:
    special = getattr(tokenizer, "special_token_ids", ()) or ()
    to_id = getattr(tokenizer, "token_to_id", None)
    return to_id is not None and any(to_id(t) in special for t in texts if t)


def _openai_choice(choice: ToolChoice) -> Any:
    if choice.mode == "named":
        return {"type": "function", "function": {"name": choice.name}}
    return choice.mode


def guided_constraint(req: ChatRequest, tool_parser: str | None) -> Any:
    """The grammar constraint of a forced tool call or structured output, or None.

    Raises:
        APIError: 400 when the schema or the forced tool is invalid.
    """
    fmt = (req.response_format or {}).get("type", "text")
    if req.guided is not None:
        if req.tool_choice.is_forced or fmt != "text":
            other = "tool_choice" if req.tool_choice.is_forced else req.format_param
            raise APIError(400, f"{req.guided_param} and {other} both constrain the output; send "
                           "only one of them", param=req.guided_param)
        return req.guided
    if not req.tool_choice.is_forced and fmt == "text":
        return None
    param = "tool_choice" if req.tool_choice.is_forced else req.format_param
    forced = req.tool_choice.is_forced
    try:
        return guided_from_openai(
            response_format=None if forced else req.response_format,
            tools=req.tools if forced else None,
            tool_choice=_openai_choice(req.tool_choice) if forced else None,
            tool_parser=tool_parser, parallel_tool_calls=req.parallel_tool_calls)
    except ValueError as exc:
        raise APIError(400, f"invalid {param}: {exc}", param=param) from None


def resolve_max_tokens(state, num_prompt: int, max_tokens: int | None, param: str) -> int:
    """The generation budget of a prompt of ``num_prompt`` tokens.

    A ``max_tokens`` larger than the room the context has left is lowered to that room (the
    output then ends with finish reason ``length`` at the context's end), so clients with
    large defaults (32k, 64k) work on smaller contexts; with the server's
    ``strict_max_tokens`` it is a 400 instead, as is a prompt that leaves no room at all.
    """
    limit = state.max_seq_len
    room = limit - num_prompt if limit is not None else None
    if (max_tokens is not None and room is not None and max_tokens > room
            and not state.config.strict_max_tokens):
        max_tokens = room if room > 0 else None
    return state.resolve_max_tokens(num_prompt, max_tokens, param)


def checked_stops(stops: list[str] | None, param: str = "stop") -> list[str] | None:
    """``stops``, or a 400 when there are more than :data:`MAX_STOPS` strings or more than
    :data:`MAX_STOP_BYTES` bytes in all (each one is checked against every step's text)."""
    if not stops:
        return stops
    if len(stops) > MAX_STOPS:
        raise APIError(400, f"{param} has {len(stops)} strings; at most {MAX_STOPS} are allowed",
                       param=param)
    size = sum(len(s.encode()) for s in stops)
    if size > MAX_STOP_BYTES:
        raise APIError(400, f"{param} strings total {size} bytes; at most {MAX_STOP_BYTES} bytes "
                       "are allowed", param=param)
    return stops


def vllm_constraint(req: Any) -> tuple[Any, str]:
    """The constraint of a request's vLLM fields (``guided_json``, ``structured_outputs``…)
    and the field it came from; ``(None, "")`` when there is none.

    Raises:
        APIError: 400 when several are set or one is malformed.
    """
    fields = {name: getattr(req, name, None) for name in (*VLLM_FIELDS, "structured_outputs")}
    try:
        return guided_from_vllm(fields)
    except ValueError as exc:
        param = next(name for name, value in fields.items() if value is not None)
        raise APIError(400, str(exc), param=param) from None


def render_request(state, req: ChatRequest, *, is_guided: bool = False
                   ) -> tuple[str, list[int], int | None]:
    """The prompt text, its token ids and the think budget of ``req``.

    Tools are offered to the template unless ``tool_choice`` is ``none``; a constrained
    (``is_guided``) output is rendered with thinking off, since the grammar starts at once.

    Raises:
        APIError: 400 when the template rejects the conversation.
    """
    offered = req.tools if req.tool_choice.mode != "none" else None
    kwargs, budget = resolve_thinking(state.config, req.thinking, req.template_kwargs)
    if is_guided:
        kwargs["enable_thinking"], budget = False, None
    text, ids = render_prompt(state.tokenizer, req.messages, tools=offered,
                              add_generation_prompt=req.add_generation_prompt,
                              continue_final_message=req.continue_final_message,
                              template_kwargs=kwargs)
    return text, ids, budget


def plan_chat(state, req: ChatRequest) -> ChatPlan:
    """Render, tokenize and plan one request.

    Raises:
        APIError: 400 for conversations the template rejects, context overflow, bad fields.
    """
    offered = req.tools if req.tool_choice.mode != "none" else None
    tool_cls = state.tool_parser_cls if offered else None
    guided = guided_constraint(req, tool_cls.name if tool_cls else None)
    text, ids, budget = render_request(state, req, is_guided=guided is not None)
    ids, mm = attach_images(state, req.messages, ids)
    max_tokens = resolve_max_tokens(state, len(ids), req.max_tokens, req.max_tokens_param)
    reasoning_cls = state.reasoning_parser_cls
    reasoner = reasoning_cls() if reasoning_cls else None
    # A forced output starts at once: templates that open <think> whatever the thinking switch
    # (MiniMax-M2) must not turn the forced call into reasoning.
    opens = (bool(reasoner) and guided is None
             and prompt_opens_reasoning(text, reasoner.start, reasoner.end))
    fields = {**req.sampling, "max_tokens": max_tokens,
              **budget_params(state.tokenizer, reasoner, opens, budget)}
    markers = list(tool_cls.markers if tool_cls else ()) + (
        [reasoner.start, reasoner.end] if reasoner else [])
    if _markers_are_special(state.tokenizer, markers):
        fields["skip_special_tokens"] = False
    if guided is not None:
        fields["guided"] = guided
    scrub = attach_guards(state, fields, tool_cls, offered, reasoning_cls, opens)
    mode = sampling_mode(state, req, offered, reasoner, opens, guided)
    params = make_params(fields, state.generation_defaults, req.n, mode)
    parse = ParsePlan(tool_cls, offered, reasoning_cls, opens, req.parallel_tool_calls, scrub)
    return ChatPlan(text, ids, params, parse, mm)
