"""What each rank holds: the narrower config it builds, and its slice of every checkpoint tensor.

Tensor parallelism (Megatron layout): attention is split by heads (q/k/v rows, o_proj columns;
KV heads are replicated when there are fewer than ranks), dense and expert MLPs by their
intermediate size (gate/up rows, down columns), the embedding and lm_head by vocabulary rows.
Expert parallelism gives each rank ``num_experts / N`` whole experts instead. Row-parallel
biases (o_proj, down_proj) are kept by rank 0 only, so the all-reduce adds them once.

:class:`ShardedCheckpoint` presents a checkpoint as this rank sees it: the same tensor names,
each with its slice's shape, read from the safetensors mmap (a row slice touches only its rows'
pages; a column slice reads its columns of every row).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

_Q = re.compile(r"self_attn\.q_proj\.(weight|bias)$")
_KV = re.compile(r"self_attn\.[kv]_proj\.(weight|bias)$")
_O = re.compile(r"self_attn\.o_proj\.weight$")
_ROW_BIAS = re.compile(r"(self_attn\.o_proj|mlp\.down_proj)\.bias$")
_MLP_IN = re.compile(r"mlp\.(gate_proj|up_proj)\.(weight|bias)$")
_MLP_OUT = re.compile(r"mlp\.down_proj\.weight$")
_EXPERT_IN = re.compile(r"mlp\.experts\.\d+\.(gate_proj|up_proj)\.weight$")
_EXPERT_OUT = re.compile(r"mlp\.experts\.\d+\.down_proj\.weight$")
_FUSED_IN = re.compile(r"mlp\.experts\.gate_up_proj$")
_FUSED_OUT = re.compile(r"mlp\.experts\.down_proj$")
_VOCAB = re.compile(r"(embed_tokens|lm_head)\.weight$")


class ShardingError(ValueError):
    """The model cannot be split this way (sizes not divisible, an unsupported layer or format)."""


@dataclass(frozen=True)
class ShardPlan:
    """Where rank ``rank`` of ``world_size`` cuts each dimension.

    Built by :meth:`from_config` from the loader's resolved config.
    """

    rank: int
    world_size: int
    expert_parallel: bool
    head_dim: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    intermediate_size: int | None
    moe_intermediate_size: int | None
    num_experts: int

    @classmethod
    def from_config(cls, config: dict[str, Any], rank: int, world_size: int,
                    expert_parallel: bool = False) -> "ShardPlan":
        """Check every split dimension divides.

        Raises:
            ShardingError: naming the config field and the sizes that would work.
        """
        n = world_size
        heads = int(config["num_attention_heads"])
        kv = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
        if heads % n:
            raise ShardingError(f"num_attention_heads ({heads}) is not divisible by "
                                f"--tensor-parallel-size {n}; use {_divisors(heads, n)}")
        if (kv >= n and kv % n) or (kv < n and n % kv):
            raise ShardingError(f"num_key_value_heads ({kv}) and --tensor-parallel-size {n} "
                                "must divide one another (KV heads are split, or replicated "
                                "when fewer than ranks)")
        inter = config.get("intermediate_size")
        moe_inter = config.get("moe_intermediate_size")
        experts = int(config.get("num_experts") or 0)
        for name, size in (("intermediate_size", inter),
                           ("moe_intermediate_size", None if expert_parallel else moe_inter)):
            if size and int(size) % n:
                raise ShardingError(f"{name} ({size}) is not divisible by "
                                    f"--tensor-parallel-size {n}")
        if expert_parallel and experts % n:
            raise ShardingError(f"num_experts ({experts}) is not divisible by "
                                f"--tensor-parallel-size {n} (--enable-expert-parallel gives "
                                "each rank num_experts / N experts)")
        if config.get("quantization_config"):
            raise ShardingError("quantized checkpoints cannot be split across GPUs yet; load "
                                "the bf16 checkpoint, or run on one GPU")
        return cls(rank, n, expert_parallel, head_dim, heads, kv, int(config["vocab_size"]),
                   int(inter) if inter else None, int(moe_inter) if moe_inter else None, experts)

    @property
    def num_local_kv_heads(self) -> int:
        return max(1, self.num_kv_heads // self.world_size)

    def q_rows(self) -> slice:
        n = self.num_heads // self.world_size * self.head_dim
        return slice(self.rank * n, (self.rank + 1) * n)

    def kv_rows(self) -> slice:
        first = self.rank * self.num_kv_heads // self.world_size
        return slice(first * self.head_dim, (first + self.num_local_kv_heads) * self.head_dim)

    def part(self, size: int) -> slice:
        n = size // self.world_size
        return slice(self.rank * n, (self.rank + 1) * n)

    @property
    def num_local_experts(self) -> int:
        return self.num_experts // self.world_size if self.expert_parallel else self.num_experts

    @property
    def expert_start(self) -> int:
        return self.rank * self.num_local_experts if self.expert_parallel else 0

    @property
    def vocab_shard_size(self) -> int:
        """Rows of every rank's vocabulary shard (the last one padded with zero rows)."""
        return -(-self.vocab_size // self.world_size)

    @property
    def vocab_start(self) -> int:
        return self.rank * self.vocab_shard_size

    def local_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """The config this rank builds its layers from (heads and widths divided)."""
        n = self.world_size
        local = dict(config, num_attention_heads=self.num_heads // n,
                     num_key_value_heads=self.num_local_kv_heads, head_dim=self.head_dim)
        if self.intermediate_size:
            local["intermediate_size"] = self.intermediate_size // n
        if self.moe_intermediate_size and not self.expert_parallel:
            local["moe_intermediate_size"] = self.moe_intermediate_size // n
        return local

    def slicer(self, name: str) -> Callable[[np.ndarray], np.ndarray] | None:
        """How this rank cuts checkpoint tensor ``name`` (None: it holds it whole)."""
        if _Q.search(name):
            return lambda a: a[self.q_rows()]
        if _KV.search(name):
            return lambda a: a[self.kv_rows()]
        if _O.search(name):
            return lambda a: a[:, self.q_rows()]
        if _ROW_BIAS.search(name):
            return lambda a: a if self.rank == 0 else np.zeros_like(a)
        if _MLP_IN.search(name):
            return lambda a: a[self.part(a.shape[0])]
        if _MLP_OUT.search(name):
            return lambda a: a[:, self.part(a.shape[1])]
        if _VOCAB.search(name):
            return self._vocab_rows
        if self.expert_parallel:
            if _FUSED_IN.search(name) or _FUSED_OUT.search(name):
                start = self.expert_start
                return lambda a: a[start:start + self.num_local_experts]
            return None
        if _EXPERT_IN.search(name):
            return lambda a: a[self.part(a.shape[0])]
        if _EXPERT_OUT.search(name):
            return lambda a: a[:, self.part(a.shape[1])]
        if _FUSED_IN.search(name):
            return self._fused_gate_up
        if _FUSED_OUT.search(name):
            return lambda a: a[:, :, self.part(a.shape[2])]
        return None

    def _vocab_rows(self, a: np.ndarray) -> np.ndarray:
        n, start = self.vocab_shard_size, self.vocab_start
        rows = a[start:start + n]
        if rows.shape[0] == n:
            return rows
        out = np.zeros((n, *a.shape[1:]), a.dtype)
        out[:rows.shape[0]] = rows
        return out

    def _fused_gate_up(self, a: np.ndarray) -> np.ndarray:
        half = a.shape[1] // 2
        part = self.part(half)
        return np.concatenate([a[:, part], a[:, half + part.start:half + part.stop]], axis=1)


def _divisors(size: int, near: int) -> str:
    options = [d for d in range(1, size + 1) if size % d == 0 and d <= max(8, near)]
    return "--tensor-parallel-size " + " or ".join(str(d) for d in options[-4:])


class ShardedCheckpoint:
    """A :class:`~atlas_core.weights.checkpoint.Checkpoint` as rank ``plan.rank`` sees it.

    Args:
        checkpoint: the whole checkpoint (safetensors by mmap).
        plan: the rank's :class:`ShardPlan`.
    """

    def __init__(self, checkpoint: Any, plan: ShardPlan) -> None:
        self.base, self.plan = checkpoint, plan
        self._shapes: dict[str, tuple[int, ...]] = {}

    def names(self) -> list[str]:
        return self.base.names()

    def __contains__(self, name: object) -> bool:
        return name in self.base

    def __iter__(self):
        return iter(self.base)

    def __len__(self) -> int:
        return len(self.base)

    def shape(self, name: str) -> tuple[int, ...]:
        if name not in self._shapes:
            self._shapes[name] = self._sliced_shape(name, self.base.shape(name))
        return self._shapes[name]

    def _sliced_shape(self, name: str, full: tuple[int, ...]) -> tuple[int, ...]:
        plan, cut = self.plan, self.plan.slicer(name)
        if cut is None:
            return full
        if cut == plan._vocab_rows:
            return (plan.vocab_shard_size, *full[1:])
        if cut == plan._fused_gate_up:
            return (full[0], 2 * (full[1] // 2 // plan.world_size), *full[2:])
        # a zero-strided view has the slice's shape without reading or allocating anything
        probe = np.lib.stride_tricks.as_strided(np.zeros(1, np.int8), full, (0,) * len(full))
        return tuple(cut(probe).shape)

    def dtype(self, name: str) -> np.dtype:
        return self.base.dtype(name)

    def file_of(self, name: str) -> Path:
        return self.base.file_of(name)

    def get(self, name: str) -> np.ndarray:
        cut = self.plan.slicer(name)
        array = self.base.get(name)
        return array if cut is None else np.ascontiguousarray(cut(array))

    @property
    def nbytes(self) -> int:
        return self.base.nbytes // self.plan.world_size
