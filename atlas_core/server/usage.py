"""Token usage accounting shared by the endpoints."""

from __future__ import annotations

from atlas_core.server.openai_schemas import PromptTokensDetails, Usage


def prompt_usage(choices: list, n: int) -> tuple[int, int]:
    """``(prompt_tokens, cached_tokens)``, counting each prompt once (choices ``i*n .. i*n+n-1``
    share prompt ``i``)."""
    firsts = [c for c in choices if c.index % n == 0]
    return (sum(len(c.prompt_ids) for c in firsts),
            sum(min(c.num_cached_tokens, len(c.prompt_ids)) for c in firsts))


def openai_usage(choices: list, n: int) -> Usage:
    """OpenAI ``usage`` with ``prompt_tokens_details.cached_tokens``."""
    prompt, cached = prompt_usage(choices, n)
    completion = sum(len(c.token_ids) for c in choices)
    return Usage(prompt, completion, prompt + completion, PromptTokensDetails(cached))
