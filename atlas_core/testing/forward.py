"""Run a CausalLM over prompts without the engine: KV pools, contiguous blocks, StepMetadata.

For model tests only (the engine's ``ModelRunner`` is the production path)::

    runner = ForwardRunner(model, backend)
    logits = runner.step([[1, 2, 3], [4, 5]], all_logits=True)   # mixed prefill
    tokens = runner.greedy([[1, 2, 3]], num_tokens=8)

Logit-parity helpers over a runner: :func:`greedy_logits` (a batched prefill then greedy decode
steps, every position's logits), :func:`prefill_in_chunks`; and for comparing logits,
:func:`logprobs` and :func:`assert_logits_close`.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from atlas_core.interfaces.layer import KVCacheSpec, RecurrentStateSpec
from atlas_core.interfaces.metadata import StepMetadata


class ForwardRunner:
    """Owns KV pools for ``max_seqs`` sequences and steps the model over them.

    Sequence ``b`` owns blocks ``b * blocks_per_seq ... (b + 1) * blocks_per_seq - 1`` and, for
    recurrent layers (:class:`RecurrentStateSpec`), slot ``b`` of each state pool (bound as a dict
    name -> ``[max_seqs, *shape]``).

    Args:
        model: a loaded :class:`~atlas_core.model.model.CausalLM`.
        backend: the backend it lives on.
        max_seqs: sequences that can be live at once.
        max_seq_len: tokens per sequence.
        block_size: tokens per KV block.
        kv_dtype: cache dtype (default: the model dtype).
    """

    def __init__(self, model: Any, backend: Any, *, max_seqs: int = 4, max_seq_len: int = 128,
                 block_size: int = 16, kv_dtype: Any = None) -> None:
        self.model, self.backend, self.block_size = model, backend, block_size
        self.blocks_per_seq = -(-max_seq_len // block_size)
        self.max_seqs = max_seqs
        num_blocks = max_seqs * self.blocks_per_seq
        caches = []
        for spec in model.kv_cache_specs():
            if spec is None:
                caches.append(None)
            elif isinstance(spec, KVCacheSpec):
                shape = (num_blocks, block_size, spec.num_kv_heads, spec.head_dim)
                dtype = kv_dtype or model.dtype
                caches.append(tuple(backend.zeros(shape, dtype) for _ in range(spec.num_pools)))
            elif isinstance(spec, RecurrentStateSpec):
                # one slot per sequence: sequence b owns slot b (meta.state_indices)
                caches.append({name: backend.zeros((max_seqs, *shape), spec.dtype)
                               for name, shape in spec.shapes.items()})
            else:
                raise NotImplementedError(f"ForwardRunner has no state for {spec!r}")
        model.bind_kv_caches(caches)
        self.seq_lens = [0] * max_seqs

    def reset(self) -> None:
        """Forget every sequence (the pools are reused)."""
        self.seq_lens = [0] * self.max_seqs

    def metadata(self, seq_ids: Sequence[int], num_new: Sequence[int], all_logits: bool) -> StepMetadata:
        """StepMetadata for appending ``num_new[i]`` tokens to sequence ``seq_ids[i]``."""
        positions, slots, cu, seq_lens, logits_rows = [], [], [0], [], []
        for seq, n in zip(seq_ids, num_new):
            start = self.seq_lens[seq]
            if start + n > self.blocks_per_seq * self.block_size:
                raise ValueError(f"sequence {seq} would exceed max_seq_len")
            pos = np.arange(start, start + n)
            positions.append(pos)
            slots.append(seq * self.blocks_per_seq * self.block_size + pos)
            rows = np.arange(cu[-1], cu[-1] + n)
            logits_rows.append(rows if all_logits else rows[-1:])
            cu.append(cu[-1] + n)
            seq_lens.append(start + n)
        tables = np.array([np.arange(s * self.blocks_per_seq, (s + 1) * self.blocks_per_seq)
                           for s in seq_ids], dtype=np.int32)
        host = {
            "positions": np.concatenate(positions).astype(np.int32),
            "slot_mapping": np.concatenate(slots).astype(np.int32),
            "cu_seqlens_q": np.array(cu, dtype=np.int32),
            "seq_lens": np.array(seq_lens, dtype=np.int32),
            "block_tables": tables,
            "logits_indices": np.concatenate(logits_rows).astype(np.int32),
            "state_indices": np.array(seq_ids, dtype=np.int32),
        }
        device = {k: self.backend.from_host(v) for k, v in host.items()}
        return StepMetadata(num_tokens=cu[-1], num_seqs=len(seq_ids), max_seqlen_q=max(num_new),
                            max_seq_len=max(seq_lens), block_size=self.block_size,
                            is_decode=all(n == 1 for n in num_new), host=host, **device)

    def step(self, new_tokens: Sequence[Sequence[int]], seq_ids: Sequence[int] | None = None, *,
             all_logits: bool = False) -> list[np.ndarray]:
        """Append tokens to sequences (prefill chunks and decode rows mixed) and run the model.

        Args:
            new_tokens: per sequence, the token ids to append (at least one each).
            seq_ids: which sequences (default ``0..len(new_tokens)-1``).
            all_logits: return logits for every new token, not just the last.

        Returns:
            Per sequence, host float32 logits ``[num_rows, vocab]``.
        """
        seq_ids = list(seq_ids) if seq_ids is not None else list(range(len(new_tokens)))
        num_new = [len(t) for t in new_tokens]
        meta = self.metadata(seq_ids, num_new, all_logits)
        self.backend.reset_workspace()
        ids = self.backend.from_host(np.concatenate([np.asarray(t, np.int32) for t in new_tokens]))
        hidden = self.model.forward(ids, meta)
        logits = self.backend.to_host(self.model.compute_logits(hidden, meta.logits_indices))
        for seq, n in zip(seq_ids, num_new):
            self.seq_lens[seq] += n
        counts = num_new if all_logits else [1] * len(num_new)
        return np.split(logits, np.cumsum(counts)[:-1])

    def greedy(self, prompts: Sequence[Sequence[int]], num_tokens: int) -> list[list[int]]:
        """Prefill ``prompts`` together, then decode ``num_tokens`` greedy tokens for each."""
        self.reset()
        last = self.step(prompts)
        out: list[list[int]] = [[] for _ in prompts]
        for i in range(num_tokens):
            tokens = [int(np.argmax(rows[-1])) for rows in last]
            for seq_out, token in zip(out, tokens):
                seq_out.append(token)
            if i + 1 < num_tokens:
                last = self.step([[t] for t in tokens])
        return out


def greedy_logits(runner: ForwardRunner, prompts: Sequence[Sequence[int]],
                  decode_steps: int) -> tuple[list[list[int]], list[np.ndarray]]:
    """Prefill ``prompts`` together (sequences ``0..``), then run ``decode_steps`` batched
    greedy decode steps.

    Returns:
        Per sequence, its token ids (prompt, then the greedy tokens) and the logits of every one
        of them, ``[len(ids), vocab]``: what one forward of a reference model over the ids gives.
    """
    runner.reset()
    logits = runner.step(prompts, all_logits=True)
    rows: list[list[np.ndarray]] = [[r] for r in logits]
    sequences = [list(p) for p in prompts]
    for _ in range(decode_steps):
        tokens = [int(np.argmax(r[-1])) for r in logits]
        for seq, token in zip(sequences, tokens):
            seq.append(token)
        logits = runner.step([[t] for t in tokens])
        for out, r in zip(rows, logits):
            out.append(r)
    return sequences, [np.concatenate(out) for out in rows]


def prefill_in_chunks(runner: ForwardRunner, ids: Sequence[int], cuts: Sequence[int]) -> np.ndarray:
    """Prefill ``ids`` as sequence 0 of a reset runner in chunks split at ``cuts`` (e.g.
    ``(7, 16, 17)``: four chunks); the logits of every position, ``[len(ids), vocab]``."""
    runner.reset()
    bounds = [0, *cuts, len(ids)]
    return np.concatenate([runner.step([list(ids[a:b])], all_logits=True)[0]
                           for a, b in zip(bounds, bounds[1:])])


def logprobs(logits: np.ndarray) -> np.ndarray:
    """Log-softmax over the last axis (compares runs whose logits may differ by a constant)."""
    x = logits - logits.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def assert_logits_close(ours: np.ndarray, ref: np.ndarray, rtol: float = 2e-5) -> None:
    """``max |ours - ref| <= rtol * max(1, max |ref|)`` over every logit."""
    err, scale = np.abs(ours - ref).max(), max(1.0, float(np.abs(ref).max()))
    assert err <= rtol * scale, f"max abs error {err:.3g} over logits of scale {scale:.3g}"
