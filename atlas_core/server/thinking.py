"""Whether a request thinks, and for how many tokens.

Every API says it differently: ``chat_template_kwargs.enable_thinking`` (all), OpenAI
``reasoning_effort`` / Responses ``reasoning.effort``, Anthropic ``thinking`` and
``output_config.effort``. They all become the template's ``enable_thinking`` plus a token
budget that the engine enforces by ending the think block (``SamplingParams.thinking_budget``,
see :mod:`atlas_core.engine.thinking`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from atlas_core.server.errors import APIError

#: Think-block budgets of OpenAI reasoning efforts (``None``: no limit; ``none`` turns it off).
EFFORT_BUDGETS: dict[str, int | None] = {"minimal": 256, "low": 1024, "medium": 4096,
                                         "high": 16384, "xhigh": None}
#: Think-block budgets of Anthropic ``output_config.effort`` (``max``: no limit).
ANTHROPIC_EFFORT_BUDGETS: dict[str, int | None] = {
    **{k: v for k, v in EFFORT_BUDGETS.items() if v is not None}, "xhigh": 32768, "max": None}
#: Template variables a request's ``chat_template_kwargs`` may not set, with what to do instead.
RESERVED_TEMPLATE_KWARGS = {
    "messages": "send the conversation in the request's `messages`",
    "tools": "send tools in the request's `tools`",
    "documents": "put retrieved documents in a message; this server does not pass `documents`",
    "add_generation_prompt": "set the request's `add_generation_prompt` (chat completions)",
    "continue_final_message": "set the request's `continue_final_message` (chat completions)",
    "tokenize": "drop it; the server tokenizes the rendered prompt",
    "template_name": "drop it; the server picks the model's template"}


@dataclass
class ThinkingRequest:
    """What a request asked: ``enabled`` (None: not said) and ``budget`` (None: not said)."""

    enabled: bool | None = None
    budget: int | None = None


def from_effort(effort: str | None, param: str = "reasoning_effort") -> ThinkingRequest:
    """OpenAI ``reasoning_effort``: ``none`` disables thinking, the others set a budget."""
    if effort is None:
        return ThinkingRequest()
    if effort == "none":
        return ThinkingRequest(enabled=False)
    if effort not in EFFORT_BUDGETS:
        raise APIError(400, f"{param} must be one of none, {', '.join(EFFORT_BUDGETS)}; got "
                       f"`{effort}`", param=param)
    return ThinkingRequest(enabled=True, budget=EFFORT_BUDGETS[effort])


def from_anthropic(thinking: dict | None, output_config: dict | None = None
                   ) -> ThinkingRequest:
    """Anthropic ``thinking`` (``{type: enabled, budget_tokens}``, ``disabled`` or
    ``adaptive``) and ``output_config.effort`` (``low`` … ``max``, the budget when
    ``budget_tokens`` does not give one). Other keys (``display``…) do not change thinking."""
    effort = output_config.get("effort") if isinstance(output_config, dict) else None
    budget = _anthropic_effort_budget(effort)
    if not thinking:
        return ThinkingRequest(budget=budget)
    kind = thinking.get("type")
    if kind == "disabled":
        return ThinkingRequest(enabled=False)
    if kind == "adaptive":
        return ThinkingRequest(enabled=True, budget=budget)
    if kind != "enabled":
        raise APIError(400, f"thinking.type must be enabled, disabled or adaptive; got `{kind}`",
                       param="thinking.type")
    tokens = thinking.get("budget_tokens")
    if tokens is not None and (not isinstance(tokens, int) or tokens < 0):
        raise APIError(400, "thinking.budget_tokens must be an integer >= 0",
                       param="thinking.budget_tokens")
    return ThinkingRequest(enabled=True, budget=tokens if tokens is not None else budget)


def _anthropic_effort_budget(effort: str | None) -> int | None:
    if effort is None:
        return None
    if effort not in ANTHROPIC_EFFORT_BUDGETS:
        raise APIError(400, f"output_config.effort must be one of "
                       f"{', '.join(ANTHROPIC_EFFORT_BUDGETS)}; got `{effort}`",
                       param="output_config.effort")
    return ANTHROPIC_EFFORT_BUDGETS[effort]


def resolve_thinking(config, asked: ThinkingRequest, request_kwargs: dict | None
                     ) -> tuple[dict[str, Any], int | None]:
    """The chat-template kwargs and the think budget of one request.

    Precedence, lowest first: server ``default_chat_template_kwargs`` and
    ``default_thinking``, the request's thinking fields, its ``chat_template_kwargs``;
    ``disable_thinking`` overrides them all. A request budget beats the server's
    ``reasoning_budget``; there is no budget when thinking is off.
    """
    check_template_kwargs(request_kwargs)
    kwargs = dict(config.default_chat_template_kwargs)
    if config.default_thinking is not None:
        kwargs.setdefault("enable_thinking", config.default_thinking)
    if asked.enabled is not None:
        kwargs["enable_thinking"] = asked.enabled
    kwargs.update(request_kwargs or {})
    if config.disable_thinking:
        kwargs["enable_thinking"] = False
    if kwargs.get("enable_thinking") is False:
        return kwargs, None
    return kwargs, asked.budget if asked.budget is not None else config.reasoning_budget


def check_template_kwargs(kwargs: dict | None, param: str = "chat_template_kwargs") -> None:
    """400 when ``kwargs`` sets a variable the server passes itself (``tools``, ``messages``…).

    Raises:
        APIError: naming the key and the request field that sets it instead.
    """
    for key in kwargs or ():
        if key in RESERVED_TEMPLATE_KWARGS:
            raise APIError(400, f"{param} cannot set `{key}`: the server passes it to the "
                           f"template itself; {RESERVED_TEMPLATE_KWARGS[key]}",
                           param=f"{param}.{key}")


def budget_params(tokenizer, reasoning_parser, prompt_opens: bool, budget: int | None
                  ) -> dict[str, Any]:
    """``SamplingParams`` fields enforcing ``budget`` (empty when it cannot be enforced).

    The block is closed with the parser's end tag and a blank line, as chat templates render
    a finished think block (``</think>\\n\\n``). When the prompt does not open the block, the
    model must open it with a single-token start tag.
    """
    if budget is None or reasoning_parser is None:
        return {}
    end_ids = tokenizer.encode(reasoning_parser.end + "\n\n", add_special_tokens=False)
    start_ids = [] if prompt_opens else tokenizer.encode(reasoning_parser.start,
                                                         add_special_tokens=False)
    if not end_ids or len(start_ids) > 1:
        return {}
    return {"thinking_budget": budget, "thinking_start_token_ids": start_ids,
            "thinking_end_token_ids": end_ids}
