"""Streaming detokenisation: text that is safe to send as each token arrives."""

from __future__ import annotations

from atlas_core.tokenizer.tokenizer import Tokenizer

_PROMPT_CONTEXT = 5
_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Turns a stream of generated token ids into text pieces.

    Prefix-offset decoding (as vLLM and TGI do it): each step decodes a short window that
    starts a few tokens back (``prefix_offset``) with and without the new tokens, and emits the
    difference. Starting the window on earlier tokens keeps sentencepiece / metaspace spacing
    right; holding text back while it ends in U+FFFD keeps half a UTF-8 character from ever being
    sent. Concatenating every piece and `flush` gives ``tok.decode(generated_ids)`` (for an empty
    prompt; after a prompt, the text that follows the prompt's own decode).

    Special tokens are dropped before decoding when ``skip_special_tokens``, which is what
    ``tokenizers`` does for a full decode, so windows never start on a skipped token.
    """

    def __init__(self, tok: Tokenizer, prompt_ids: list[int], skip_special_tokens: bool = True) -> None:
        self._tok = tok
        self._skip = tok.special_token_ids if skip_special_tokens else frozenset()
        context = [i for i in prompt_ids[-4 * _PROMPT_CONTEXT:] if i not in self._skip]
        self._ids = context[-_PROMPT_CONTEXT:]
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._prefix_text: str | None = None

    def _decode(self, start: int, stop: int | None = None) -> str:
        return self._tok.backend.decode(self._ids[start:stop], skip_special_tokens=False)

    def _emit(self, new_text: str, prefix_text: str) -> str:
        piece = new_text[len(prefix_text):]
        del self._ids[:self._read_offset]
        self._prefix_offset, self._read_offset = 0, len(self._ids)
        self._prefix_text = None
        return piece

    def add(self, token_id: int) -> str:
        """Take one generated token; return the text that became stable (often ``""``)."""
        if token_id in self._skip:
            return ""
        self._ids.append(token_id)
        if self._prefix_text is None:
            self._prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset)
        if len(new_text) > len(self._prefix_text) and not new_text.endswith(_REPLACEMENT):
            return self._emit(new_text, self._prefix_text)
        return ""

    def flush(self) -> str:
        """Return whatever is still held back (an unfinished character decodes as U+FFFD)."""
        if self._read_offset >= len(self._ids):
            return ""
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        return self._emit(self._decode(self._prefix_offset), prefix_text)
