"""Formatting engine ``TokenLogprob`` lists as OpenAI chat or completions logprobs."""

from __future__ import annotations

from atlas_core.server.openai_schemas import (ChatLogprobs, ChatTokenLogprob, CompletionLogprobs,
                                              TopLogprob)


def token_text(tokenizer, token_id: int) -> str:
    """The text of one token as it appears on its own (special tokens included)."""
    return tokenizer.decode([token_id], skip_special_tokens=False)


def _finite(value: float) -> float:
    return max(float(value), -9999.0)


def chat_logprobs(tokenizer, entries: list, top_n: int) -> ChatLogprobs:
    """``{"content": [{token, logprob, bytes, top_logprobs}]}`` for chat completions."""
    content = []
    for entry in entries:
        text = token_text(tokenizer, entry.token_id)
        top = [TopLogprob(t := token_text(tokenizer, tid), _finite(lp), list(t.encode()))
               for tid, lp in entry.top[:top_n]]
        content.append(ChatTokenLogprob(text, _finite(entry.logprob), list(text.encode()), top))
    return ChatLogprobs(content)


def completion_logprobs(tokenizer, entries: list, top_n: int, offset: int = 0,
                        prompt_entries: list | None = None,
                        prompt_ids: list[int] | None = None) -> CompletionLogprobs:
    """Legacy completions logprobs (``tokens``, ``token_logprobs``, ``top_logprobs``,
    ``text_offset``), optionally preceded by the prompt's (``echo``)."""
    result = CompletionLogprobs([], [], [], [])
    rows: list[tuple[int, float | None, list]] = []
    if prompt_ids is not None:
        entries_by_pos = prompt_entries or [None] * len(prompt_ids)
        for tid, entry in zip(prompt_ids, entries_by_pos):
            rows.append((tid, None if entry is None else entry.logprob,
                         [] if entry is None else entry.top))
    rows.extend((e.token_id, e.logprob, e.top) for e in entries)
    for tid, lp, top in rows:
        text = token_text(tokenizer, tid)
        result.tokens.append(text)
        result.token_logprobs.append(None if lp is None else _finite(lp))
        result.top_logprobs.append(
            {token_text(tokenizer, t): _finite(v) for t, v in top[:top_n]} if lp is not None
            else None)
        result.text_offset.append(offset)
        offset += len(text)
    return result
