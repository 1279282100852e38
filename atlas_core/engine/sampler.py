"""Device-side sampling: penalties, logit bias, seeded sampling and logprobs for one step.

Every logits row of a step belongs to one sequence: its sampling row (the last query token of a
sequence that samples) or a prompt-logprobs row (scores the next prompt token). Parameters go to
the device as per-row vectors through static buffers; penalties, biases and logprobs only run
when some row asks for them. Only the sampled token ids (and asked-for logprobs) reach the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from atlas_core.engine.logits_filters import apply_logits_filters
from atlas_core.engine.outputs import TokenLogprob
from atlas_core.engine.sequence import Sequence
from atlas_core.guided.bitmask import TokenBitmask


@dataclass
class LogitsRow:
    """What one row of the step's logits is for.

    Attributes:
        seq: the sequence it belongs to.
        samples: sample the next token from it.
        target: for a prompt-logprobs row, the prompt token it scores.
        position: for a prompt-logprobs row, the position whose logits score ``target``.
        stop_ids: token ids masked out (``min_tokens`` not reached yet).
        matcher: the sequence's guided-decoding matcher (sampling rows of guided requests).
        draft_ids: speculative decoding: the drafts this row's logits follow (the row samples
            output token ``len(output) + len(draft_ids)``, as if they were already appended;
            empty: the usual row).
    """

    seq: Sequence
    samples: bool = True
    target: int | None = None
    position: int = -1
    stop_ids: tuple[int, ...] = ()
    matcher: Any = None
    draft_ids: tuple[int, ...] = ()

    @property
    def draft_index(self) -> int:
        """Drafts before this row (0: the sequence's usual sampling row)."""
        return len(self.draft_ids)


_PARAM_FIELDS = (("temperature", np.float32), ("top_k", np.int32), ("top_p", np.float32),
                 ("min_p", np.float32), ("seeds", np.uint64), ("steps", np.int64))


class Sampler:
    """Turns a step's logits into token ids (and logprobs) on the device.

    Args:
        backend: the GpuBackend.
        max_rows: most logits rows in one step.
        vocab_size: logits width.

    Attributes:
        encode: text -> token ids (the engine's tokenizer), for DRY breaker strings; ``None``
            uses only breaker ids.
    """

    encode = None

    def __init__(self, backend, max_rows: int, vocab_size: int) -> None:
        self.backend = backend
        self.vocab_size = vocab_size
        self.host = {name: np.zeros(max_rows, dtype) for name, dtype in _PARAM_FIELDS}
        self.device = {name: backend.from_host(arr) for name, arr in self.host.items()}
        self.token_bitmask = TokenBitmask(backend, vocab_size)

    def upload_params(self, rows: list[LogitsRow], num_rows: int, ahead: int = 0,
                      copies: list | None = None) -> dict:
        """Write per-row sampling params (pad rows greedy) and return device views of ``num_rows``.

        ``rows`` may hold ``None`` for padding rows between real ones (verify graphs).

        ``ahead``: output tokens sampled but not yet appended to each sequence (async
        scheduling plans a step before the previous one's token is known); seeded sampling
        draws by output position, so it counts them. ``copies``: append the ``(device, host)``
        pairs there for the caller's one ``copy_many`` instead of copying now.
        """
        h = self.host
        for name in h:
            h[name][:num_rows] = 0
        for i, row in enumerate(rows):
            if row is None:  # a padding row inside the step (verify graphs)
                h["top_p"][i] = 1.0
                continue
            p = row.seq.params
            if row.samples and not p.is_greedy:
                h["temperature"][i] = p.temperature
            h["top_k"][i] = min(p.top_k, self.vocab_size)
            h["top_p"][i] = p.top_p
            h["min_p"][i] = p.min_p
            h["seeds"][i] = row.seq.seed
            h["steps"][i] = len(row.seq.output_token_ids) + ahead + row.draft_index
        for i in range(len(rows), num_rows):
            h["top_p"][i] = 1.0
        views = {name: self.device[name][:num_rows] for name in h}
        pairs = [(views[name], h[name][:num_rows]) for name in h]
        if copies is None:
            self.backend.copy_many(pairs)
        else:
            copies.extend(pairs)
        return views

    @staticmethod
    def needs_eager(rows: list[LogitsRow]) -> bool:
        """Whether some row needs penalties, biases, logits filters or logprobs (ops outside a
        decode graph)."""
        return any(r.seq.params.has_penalties or r.seq.params.has_logits_filters
                   or r.seq.params.logit_bias or r.stop_ids
                   or r.seq.params.logprobs is not None or r.target is not None
                   or r.matcher is not None for r in rows)

    def sample(self, logits, params: dict):
        """``ops.sample`` over device views from :meth:`upload_params`; device int32 ``[rows]``."""
        return self.backend.ops.sample(logits, params["temperature"], params["top_k"],
                                       params["top_p"], params["min_p"], params["seeds"],
                                       params["steps"])

    def process(self, logits, rows: list[LogitsRow], params: dict):
        """Grammar masks, penalties and bias (only when asked), then sampling; returns device
        token ids."""
        ops, be = self.backend.ops, self.backend
        n = len(rows)
        if any(r.matcher is not None for r in rows):
            logits = self.token_bitmask.apply(logits, [r.matcher for r in rows],
                                              [r.draft_ids for r in rows])
        if any(r.seq.params.has_penalties for r in rows):
            prompt, output = _padded([r.seq.prompt_token_ids for r in rows]), _padded(
                [r.seq.output_token_ids + list(r.draft_ids) for r in rows])
            vec = [np.array([getattr(r.seq.params, f) for r in rows], np.float32)
                   for f in ("repetition_penalty", "presence_penalty", "frequency_penalty")]
            logits = ops.apply_penalties(logits, be.from_host(prompt), be.from_host(output),
                                         *(be.from_host(v) for v in vec))
        if any(r.seq.params.logit_bias or r.stop_ids for r in rows):
            bias = np.zeros((n, self.vocab_size), np.float32)
            for i, r in enumerate(rows):
                for tok, value in (r.seq.params.logit_bias or {}).items():
                    if tok < self.vocab_size:
                        bias[i, tok] += value
                bias[i, [t for t in r.stop_ids if t < self.vocab_size]] = -np.inf
            logits = ops.add(logits, be.from_host(bias))
        if any(r.samples and r.seq.params.has_logits_filters for r in rows):
            logits = apply_logits_filters(be, logits, rows, self.host["steps"][:n], self.encode)
        return self.sample(logits, params)

    def logprobs(self, raw_logits, rows: list[LogitsRow], tokens):
        """Queue the logprob work on the device; returns a handle for :meth:`fetch_logprobs`.

        Uses the raw logits (before penalties, bias and temperature). ``tokens`` are the device
        token ids from :meth:`process`; prompt rows score their ``target`` instead.
        """
        want = [r.seq.params.logprobs if r.target is None else r.seq.params.prompt_logprobs
                for r in rows]
        if all(w is None for w in want):
            return None
        ops, be = self.backend.ops, self.backend
        lp = ops.log_softmax(raw_logits)
        k = max(w for w in want if w is not None)
        top = ops.topk(lp, k) if k > 0 else None
        targets = None
        if any(r.target is not None for r in rows):
            targets = be.from_host(np.array([r.target or 0 for r in rows], np.int32))
        chosen = []
        for i, (r, w) in enumerate(zip(rows, want)):
            if w is not None:
                ids = tokens[i:i + 1] if r.target is None else targets[i:i + 1]
                chosen.append(ops.embedding(ids, lp[i:i + 1].reshape(self.vocab_size, 1)))
        return want, top, chosen

    def fetch_logprobs(self, handle, rows: list[LogitsRow], tokens_host: np.ndarray):
        """Bring the queued logprobs to the host: per-row :class:`TokenLogprob` or ``None``."""
        if handle is None:
            return [None] * len(rows)
        want, top, chosen = handle
        be = self.backend
        top_vals, top_ids = (be.to_host(top[0]), be.to_host(top[1])) if top is not None else (None, None)
        chosen_iter = iter(chosen)
        out: list[TokenLogprob | None] = []
        for i, (r, w) in enumerate(zip(rows, want)):
            if w is None:
                out.append(None)
                continue
            token = int(r.target if r.target is not None else tokens_host[i])
            value = float(be.to_host(next(chosen_iter)).reshape(-1)[0])
            alts = [(int(t), float(v)) for t, v in zip(top_ids[i, :w], top_vals[i, :w])] if w else []
            out.append(TokenLogprob(token, value, alts))
        return out


def _padded(lists: list[list[int]]) -> np.ndarray:
    width = max(1, max(len(x) for x in lists))
    out = np.full((len(lists), width), -1, np.int32)
    for i, x in enumerate(lists):
        out[i, :len(x)] = x
    return out
