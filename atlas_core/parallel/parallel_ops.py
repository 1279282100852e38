"""The op tables a split layer runs on: the backend's, plus the collective behind each
row-parallel result (all in place on the backend's stream, so decode graphs capture them).

The layer still calls ``ops.linear`` / ``ops.moe_block``; the wrapper adds the collective (gpt-fast
applies TP the same way, after the model is built). One collective per block: after ``o_proj``,
``out_proj`` (Gated DeltaNet, Mamba-2) and ``down_proj`` (all-reduce of the partial sums); after
the MoE block, routed experts and shared expert together (tensor parallel: every rank's slice of
each; expert parallel: every rank holds all tokens, as attention stays tensor parallel, so
dispatch needs no traffic and the combine is one all-reduce of each rank's experts plus its
slice of the shared expert); after the embedding (all-reduce of the vocabulary shards' rows) and
after the lm_head (all-gather of the vocabulary shards' logits).
"""

from __future__ import annotations

from typing import Any

from atlas_core.ops.moe import compose_moe_block
from atlas_core.parallel.sharding import ShardPlan


class _WrappedOps:
    """An op table that forwards every op to ``base`` except those a subclass defines."""

    def __init__(self, base: Any, comm: Any) -> None:
        self._base, self._comm = base, comm

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._base, name)
        setattr(self, name, value)
        return value

    def __contains__(self, name: str) -> bool:
        return name in self._base


class RowParallelOps(_WrappedOps):
    """``linear`` by one of ``weights`` (a row-parallel projection) is all-reduced."""

    def __init__(self, base: Any, comm: Any, weights: list[Any]) -> None:
        super().__init__(base, comm)
        self._reduced = {id(w) for w in weights}

    def linear(self, x: Any, weight: Any, bias: Any = None) -> Any:
        out = self._base.linear(x, weight, bias)
        return self._comm.all_reduce(out) if id(weight) in self._reduced else out


class _LocalExperts(_WrappedOps):
    """``moe_route`` (and Nemotron-H's ``nemotron_h_moe_route``) routed to this rank's experts:
    choices of other ranks' experts get weight 0 (expert parallel)."""

    def __init__(self, base: Any, comm: Any, plan: ShardPlan) -> None:
        super().__init__(base, comm)
        self._start, self._num_local = plan.expert_start, plan.num_local_experts

    def moe_route(self, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        weights, ids = self._base.moe_route(*args, **kwargs)
        return self._base.moe_remap_ids(weights, ids, self._start, self._num_local)

    def nemotron_h_moe_route(self, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        weights, ids = self._base.nemotron_h_moe_route(*args, **kwargs)
        return self._base.moe_remap_ids(weights, ids, self._start, self._num_local)

    def moe_route_grouped(self, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        weights, ids = self._base.moe_route_grouped(*args, **kwargs)
        return self._base.moe_remap_ids(weights, ids, self._start, self._num_local)


class MoeParallelOps(_WrappedOps):
    """The MoE block over this rank's share: a slice of every expert (tensor parallel) or
    whole experts ``expert_start ..`` (expert parallel), plus its slice of the shared expert;
    the partial outputs are all-reduced once."""

    def __init__(self, base: Any, comm: Any, plan: ShardPlan) -> None:
        super().__init__(base, comm)
        self._local = _LocalExperts(base, comm, plan) if plan.expert_parallel else None

    def moe_block(self, x: Any, *moe_args: Any, **moe_kwargs: Any) -> Any:
        if self._local is None:
            return self._comm.all_reduce(self._base.moe_block(x, *moe_args, **moe_kwargs))
        return self._comm.all_reduce(compose_moe_block(self._local, x, *moe_args, **moe_kwargs))

    def rms_norm_moe_block(self, x: Any, residual: Any, norm_weight: Any, eps: float,
                           zero_centered: bool, *moe_args: Any, **moe_kwargs: Any
                           ) -> tuple[Any, Any]:
        ops = self._base
        if self._local is None:
            out, r = ops.rms_norm_moe_block(x, residual, norm_weight, eps, zero_centered,
                                            *moe_args, **moe_kwargs)
            return self._comm.all_reduce(out), r
        if residual is None:
            h, r = ops.rms_norm(x, norm_weight, eps, zero_centered=zero_centered), x
        else:
            h, r = ops.rms_norm(x, norm_weight, eps, residual, zero_centered=zero_centered)
        return self.moe_block(h, *moe_args, **moe_kwargs), r


class SumParallelOps(_WrappedOps):
    """A MoE block whose last op sums partial results (Nemotron-H's and DeepSeek's
    ``add(routed, shared)``, or ``moe_experts`` with no shared expert): that op, ``reduced``, is
    all-reduced; with expert parallelism its router keeps this rank's experts."""

    def __init__(self, base: Any, comm: Any, plan: ShardPlan, reduced: str = "add") -> None:
        super().__init__(base, comm)
        op = getattr(base, reduced)
        setattr(self, reduced, lambda *args, **kwargs: comm.all_reduce(op(*args, **kwargs)))
        if plan.expert_parallel:
            local = _LocalExperts(base, comm, plan)
            self.nemotron_h_moe_route = local.nemotron_h_moe_route
            self.moe_route_grouped = local.moe_route_grouped


class VocabParallelOps(_WrappedOps):
    """The model's embedding and lm_head over this rank's vocabulary rows."""

    def __init__(self, base: Any, comm: Any, plan: ShardPlan, embed: Any, head: Any) -> None:
        super().__init__(base, comm)
        self._embed, self._head = embed, head
        self._start, self._vocab = plan.vocab_start, plan.vocab_size

    def embedding(self, ids: Any, table: Any) -> Any:
        if table is not self._embed:
            return self._base.embedding(ids, table)
        return self._comm.all_reduce(self._base.embedding_shard(ids, table, self._start))

    def linear(self, x: Any, weight: Any, bias: Any = None) -> Any:
        out = self._base.linear(x, weight, bias)
        if weight is not self._head:
            return out
        # out: [rows, shard]; gathered: [world_size * rows, shard]
        gathered = self._comm.all_gather(out)
        shards = gathered.reshape(self._comm.world_size, out.shape[0], out.shape[1])
        return self._base.gather_vocab_shards(shards, self._vocab)
