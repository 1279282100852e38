"""Stop handling and incremental text: when a sequence ends and which text it may show yet.

Stop strings may span token boundaries, so text that could still be the start of a stop string
is held back until it is known not to be one. A matched stop string (and a stop or EOS token's
text) is trimmed unless ``include_stop_str_in_output``.
"""

from __future__ import annotations

from typing import Any, Callable

from atlas_core.engine.sequence import Sequence


class TextState:
    """Per-sequence detokenisation state.

    Attributes:
        text: decoded output text so far (already trimmed at a stop string).
        released: characters of ``text`` safe to show.
        reported_text, reported_tokens: what the last output carried (for stream deltas).
    """

    def __init__(self, detokenizer: Any) -> None:
        self.detokenizer = detokenizer
        self.text = ""
        self.released = 0
        self.reported_text = 0
        self.reported_tokens = 0


def holdback(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of some stop string."""
    best = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), best, -1):
            if stop.startswith(text[len(text) - k:]):
                best = k
                break
    return best


class StopChecker:
    """Decides, token by token, whether a sequence is finished and what text it shows.

    Args:
        eos_token_ids: ids that end generation unless ``ignore_eos``.
        max_seq_len: longest prompt + output.
        detokenizer_factory: ``(prompt_ids, skip_special_tokens) -> obj`` with ``add(id) -> str``
            and ``flush() -> str``; ``None`` means no text (token ids only).
    """

    def __init__(self, eos_token_ids: set[int], max_seq_len: int,
                 detokenizer_factory: Callable[[list[int], bool], Any] | None) -> None:
        self.eos_token_ids = set(eos_token_ids)
        self.max_seq_len = max_seq_len
        self.detokenizer_factory = detokenizer_factory

    def start(self, seq: Sequence) -> None:
        det = None
        if self.detokenizer_factory is not None:
            det = self.detokenizer_factory(seq.prompt_token_ids, seq.params.skip_special_tokens)
        seq.stop_state = TextState(det)

    def masked_ids(self, seq: Sequence) -> tuple[int, ...]:
        """Token ids that may not be sampled next (EOS and stop ids before ``min_tokens``)."""
        p = seq.params
        if len(seq.output_token_ids) >= p.min_tokens:
            return ()
        ids = set(p.stop_token_ids)
        if not p.ignore_eos:
            ids |= self.eos_token_ids
        return tuple(sorted(ids))

    def append(self, seq: Sequence, token_id: int) -> None:
        """Add a sampled token to ``seq``; set ``finish_reason``/``stop_reason`` if it ends."""
        p, state = seq.params, seq.stop_state
        seq.output_token_ids.append(token_id)
        num_out = len(seq.output_token_ids)
        may_stop = num_out >= p.min_tokens
        if may_stop and not p.ignore_eos and token_id in self.eos_token_ids:
            self._finish(seq, "stop", None, add_token_text=p.include_stop_str_in_output)
            return
        if may_stop and token_id in p.stop_token_ids:
            self._finish(seq, "stop", token_id, add_token_text=p.include_stop_str_in_output)
            return
        if state.detokenizer is not None:
            state.text += state.detokenizer.add(token_id)
            if p.stop and may_stop and self._match_stop_string(seq):
                return
        if (p.max_tokens is not None and num_out >= p.max_tokens) or len(seq) >= self.max_seq_len:
            self._finish(seq, "length", None, add_token_text=False)
            return
        state.released = len(state.text) - (holdback(state.text, p.stop) if p.stop else 0)

    def _match_stop_string(self, seq: Sequence) -> bool:
        state, p = seq.stop_state, seq.params
        found = None
        for stop in p.stop:
            idx = state.text.find(stop, state.released)
            if idx >= 0 and (found is None or idx < found[0]):
                found = (idx, stop)
        if found is None:
            return False
        idx, stop = found
        state.text = state.text[:idx + len(stop) if p.include_stop_str_in_output else idx]
        state.released = len(state.text)
        seq.finish_reason, seq.stop_reason = "stop", stop
        return True

    def _finish(self, seq: Sequence, reason: str, stop_reason: Any,
                add_token_text: bool) -> None:
        """End ``seq``; ``add_token_text`` adds the text of the last token (not yet decoded)."""
        state = seq.stop_state
        det = state.detokenizer
        if det is not None:
            if add_token_text:
                state.text += det.add(seq.output_token_ids[-1])
            state.text += det.flush()
        state.released = len(state.text)
        seq.finish_reason, seq.stop_reason = reason, stop_reason

    def finish(self, seq: Sequence, reason: str = "stop") -> None:
        """End ``seq`` after its last appended token (e.g. its guided grammar is complete)."""
        self._finish(seq, reason, None, add_token_text=False)

    def abort(self, seq: Sequence) -> None:
        """End ``seq`` on request (client gone); releases whatever text was held back."""
        seq.stop_state.released = len(seq.stop_state.text)
        seq.finish_reason = "abort"
