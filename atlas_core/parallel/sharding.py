"""What each rank holds: the narrower config it builds, and the checkpoint as it sees it.

Tensor parallelism (Megatron layout): attention is split by heads (KV heads replicated when
there are fewer than ranks), Gated DeltaNet and Mamba-2 mixers by heads (whole key-head /
B-C groups per rank), dense MLPs, shared experts and routed experts by their intermediate size,
the embedding and lm_head by vocabulary rows. Expert parallelism gives each rank
``num_experts / N`` whole experts instead (the rest stays tensor parallel). Which tensor is cut
how is decided per layer by :mod:`atlas_core.parallel.layer_rules`.

:class:`ShardedCheckpoint` presents a checkpoint as this rank sees it: the same tensor names,
each with its slice's shape, read from the safetensors mmap (a row slice touches only its rows'
pages; a column slice reads its columns of every row). A quantized weight's scales are cut with
it (:mod:`atlas_core.parallel.cuts`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from atlas_core.model.weight_loading import WRAPPER_PREFIXES
from atlas_core.parallel.cuts import Cut, ShardingError, packed_cut, scale_cut
from atlas_core.weights.quant_tensors import fp8_scale_kind, scan_checkpoint

__all__ = ["Cut", "ShardedCheckpoint", "ShardingError", "ShardPlan", "SPLIT_FIELDS"]

#: config.json fields every rank holds ``1 / N`` of (where present), beyond the attention heads.
SPLIT_FIELDS = ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size",
                "moe_shared_expert_intermediate_size", "linear_num_key_heads",
                "linear_num_value_heads", "mamba_num_heads", "n_groups")

#: Why a field must divide, for the error.
_WHY = {"linear_num_key_heads": "each GPU holds whole Gated DeltaNet key-head groups",
        "linear_num_value_heads": "each GPU holds whole Gated DeltaNet key-head groups",
        "mamba_num_heads": "each GPU holds whole Mamba-2 heads",
        "n_groups": "each GPU holds whole Mamba-2 B/C groups with their heads"}


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
    num_experts: int
    split: tuple[tuple[str, int], ...] = ()

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
        split = []
        for name in SPLIT_FIELDS:
            size = config.get(name)
            if not isinstance(size, int) or size <= 0:
                continue
            if name == "moe_intermediate_size" and expert_parallel:
                continue
            if size % n:
                why = f" ({_WHY[name]})" if name in _WHY else ""
                raise ShardingError(f"{name} ({size}) is not divisible by --tensor-parallel-size "
                                    f"{n}{why}; use {_divisors(size, n)}")
            split.append((name, size))
        experts = int(config.get("num_experts") or 0)
        if expert_parallel and experts % n:
            raise ShardingError(f"num_experts ({experts}) is not divisible by "
                                f"--tensor-parallel-size {n} (--enable-expert-parallel gives "
                                "each rank num_experts / N experts)")
        return cls(rank, n, expert_parallel, head_dim, heads, kv, int(config["vocab_size"]),
                   experts, tuple(split))

    @property
    def num_local_kv_heads(self) -> int:
        return max(1, self.num_kv_heads // self.world_size)

    def kv_rows(self) -> slice:
        first = self.rank * self.num_kv_heads // self.world_size
        return slice(first * self.head_dim, (first + self.num_local_kv_heads) * self.head_dim)

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
        local.update({name: size // n for name, size in self.split})
        return local


def _divisors(size: int, near: int) -> str:
    options = [d for d in range(1, size + 1) if size % d == 0 and d <= max(8, near)]
    return "--tensor-parallel-size " + " or ".join(str(d) for d in options[-4:])


class ShardedCheckpoint:
    """A :class:`~atlas_core.weights.checkpoint.Checkpoint` as rank ``plan.rank`` sees it.

    Args:
        checkpoint: the whole checkpoint (safetensors by mmap).
        plan: the rank's :class:`ShardPlan`.
        cuts: checkpoint tensor name -> its :class:`Cut` (tensors not named are held whole),
            from :func:`atlas_core.parallel.layer_rules.checkpoint_cuts`.
        block_size: the FP8 block shape of a quantized checkpoint.

    Raises:
        ShardingError: a quantized weight's cut does not fall on its scales' blocks.
    """

    def __init__(self, checkpoint: Any, plan: ShardPlan, cuts: dict[str, Cut],
                 block_size: tuple[int, int] = (128, 128)) -> None:
        self.base, self.plan = checkpoint, plan
        self.cuts = dict(cuts)
        for name in checkpoint.names():
            for old, new in WRAPPER_PREFIXES:
                if name.startswith(old) and new + name[len(old):] in cuts:
                    self.cuts.setdefault(name, cuts[new + name[len(old):]])
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._add_quantized(tuple(block_size))

    def _add_quantized(self, block_size: tuple[int, int]) -> None:
        """Cut every quantized weight's data and scales as its logical weight is cut."""
        rank, n = self.plan.rank, self.plan.world_size
        tensors, _ = scan_checkpoint(self.base)
        for qt in tensors.values():
            cut = self.cuts.get(qt.key)
            if cut is None:
                continue
            if qt.kind == "nvfp4":
                self.cuts[qt.name] = packed_cut(cut, qt.shape, rank, n, qt.name)
                kinds = {qt.scale: "nvfp4"}
            else:
                kind = fp8_scale_kind(tuple(self.base.shape(qt.scale)), qt.shape, block_size)
                if not kind:
                    continue  # the loader names the scale that fits no layout
                kinds = {qt.scale: kind}
            kinds.update({c: "replicated" for c in qt.companions if c not in kinds})
            for companion, scale_kind in kinds.items():
                own = scale_cut(cut, scale_kind, qt.shape, tuple(self.base.shape(companion)),
                                block_size, rank, n, qt.name)
                if own is not None:
                    self.cuts[companion] = own

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
            full = tuple(self.base.shape(name))
            cut = self.cuts.get(name)
            self._shapes[name] = (full if cut is None else
                                  cut.shape(full, self.plan.rank, self.plan.world_size))
        return self._shapes[name]

    def dtype(self, name: str) -> np.dtype:
        return self.base.dtype(name)

    def file_of(self, name: str) -> Path:
        return self.base.file_of(name)

    def get(self, name: str) -> np.ndarray:
        cut = self.cuts.get(name)
        array = self.base.get(name)
        if cut is None:
            return array
        return np.ascontiguousarray(cut.take(array, self.plan.rank, self.plan.world_size))

    @property
    def nbytes(self) -> int:
        return self.base.nbytes // self.plan.world_size
