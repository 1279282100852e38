"""Tensor / expert parallelism applied to a built model, the model code unaware.

Each rank builds the model from its narrower config (:meth:`ShardPlan.local_config`), loads its
slices, then every module that must talk to the other ranks gets an op table of its own that
wraps the backend's (``module.ops``): the layer still calls ``ops.linear`` / ``ops.moe_block``,
and the wrapper adds the collective behind the row-parallel projection (gpt-fast applies TP the
same way, after the model is built).

Where each rank communicates (all in place on the backend's stream, so decode graphs capture
them): after ``o_proj`` and ``down_proj`` (all-reduce of the partial sums), after the MoE block
(tensor parallel: all-reduce of the partial sums; expert parallel: every rank holds all tokens,
as attention is tensor parallel, so dispatch needs no traffic and the combine is an all-reduce
of each rank's experts' contributions), after the embedding (all-reduce of the vocabulary
shards' rows) and after the lm_head (all-gather of the vocabulary shards' logits).
"""

from __future__ import annotations

import logging
from typing import Any

from atlas_core.model.decoder_loader import model_dtype
from atlas_core.model.layers.attention import Attention
from atlas_core.model.layers.decoder import DecoderLayer
from atlas_core.model.layers.mlp import GatedMLP
from atlas_core.model.layers.moe import SparseMoE
from atlas_core.model.model import CausalLM
from atlas_core.model.quantized_loading import quantized_formats
from atlas_core.model.weight_loading import (check_size, load_weights, parameter_count,
                                             plan_weights)
from atlas_core.parallel.sharding import ShardedCheckpoint, ShardingError, ShardPlan

log = logging.getLogger(__name__)

_SUPPORTED = (CausalLM, DecoderLayer, Attention, GatedMLP, SparseMoE)


class _WrappedOps:
    """An op table that forwards every op to ``base`` except those a subclass defines."""

    def __init__(self, base: Any, comm: Any) -> None:
        self._base, self._comm = base, comm

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._base, name)
        setattr(self, name, value)
        return value


class RowParallelOps(_WrappedOps):
    """``linear`` by one of ``weights`` (a row-parallel projection) is all-reduced."""

    def __init__(self, base: Any, comm: Any, weights: list[Any]) -> None:
        super().__init__(base, comm)
        self._reduced = {id(w) for w in weights}

    def linear(self, x: Any, weight: Any, bias: Any = None) -> Any:
        out = self._base.linear(x, weight, bias)
        return self._comm.all_reduce(out) if id(weight) in self._reduced else out


class MoeParallelOps(_WrappedOps):
    """The MoE block over this rank's share: a slice of every expert (tensor parallel) or
    whole experts ``expert_start ..`` (expert parallel); the partial outputs are all-reduced."""

    def __init__(self, base: Any, comm: Any, plan: ShardPlan) -> None:
        super().__init__(base, comm)
        self._ep = plan.expert_parallel
        self._start, self._num_local = plan.expert_start, plan.num_local_experts

    def moe_block(self, x, router_weight, w_gate_up, w_down, top_k, renormalize,
                  scoring="softmax", activation="silu", **shared):
        if any(v is not None for v in shared.values()):
            raise ShardingError("a shared expert cannot be split across GPUs yet")
        ops = self._base
        if not self._ep:
            out = ops.moe_block(x, router_weight, w_gate_up, w_down, top_k, renormalize,
                                scoring, activation)
            return self._comm.all_reduce(out)
        weights, ids = ops.moe_route(ops.linear(x, router_weight), top_k, renormalize, scoring)
        weights, ids = ops.moe_remap_ids(weights, ids, self._start, self._num_local)
        return self._comm.all_reduce(ops.moe_experts(x, w_gate_up, w_down, weights, ids,
                                                     activation))

    def rms_norm_moe_block(self, x, residual, norm_weight, eps, zero_centered, *moe_args,
                           **moe_kwargs):
        ops = self._base
        if residual is None:
            h, r = ops.rms_norm(x, norm_weight, eps, zero_centered=zero_centered), x
        else:
            h, r = ops.rms_norm(x, norm_weight, eps, residual, zero_centered=zero_centered)
        return self.moe_block(h, *moe_args, **moe_kwargs), r


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


def check_supported(model: Any) -> None:
    """Every module of ``model`` is one the transform knows how to split.

    Raises:
        ShardingError: naming the first module that is not.
    """
    for module in model.modules():
        if not isinstance(module, _SUPPORTED):
            raise ShardingError(f"{type(module).__name__} layers cannot be split across GPUs "
                                "yet: tensor parallelism covers attention, dense MLP and "
                                "sparse MoE decoders (Qwen3, Qwen3-MoE, Llama, Mistral)")


def reshard_specs(model: CausalLM, plan: ShardPlan) -> None:
    """Declare the vocabulary rows and (expert parallel) the experts this rank holds."""
    hidden = model.hidden_size
    rows = plan.vocab_shard_size
    model.declare("model.embed_tokens.weight", (rows, hidden))
    if not model.tie_word_embeddings:
        model.declare("lm_head.weight", (rows, hidden))
    if not plan.expert_parallel:
        return
    local = range(plan.expert_start, plan.expert_start + plan.num_local_experts)
    for module in model.modules():
        if isinstance(module, SparseMoE):
            e = len(local)
            _, two_i, h = module.specs["experts.gate_up_proj"].shape
            i = two_i // 2
            gate_up = [src for x in local for src in ((f"experts.{x}.gate_proj.weight", (i, h)),
                                                      (f"experts.{x}.up_proj.weight", (i, h)))]
            module.declare("experts.gate_up_proj", (e, two_i, h),
                           [gate_up, [("experts.gate_up_proj", (e, two_i, h))]])
            module.declare("experts.down_proj", (e, h, i),
                           [[(f"experts.{x}.down_proj.weight", (h, i)) for x in local],
                            [("experts.down_proj", (e, h, i))]])


def apply_parallel(model: CausalLM, comm: Any, plan: ShardPlan) -> None:
    """Give every module that communicates its wrapping op table (after loading)."""
    for module in model.modules():
        base = module.ops
        if isinstance(module, CausalLM):
            module.ops = VocabParallelOps(base, comm, plan, module.params[
                "model.embed_tokens.weight"], module.lm_head)
        elif isinstance(module, Attention):
            module.ops = RowParallelOps(base, comm, [module.params["o_proj.weight"]])
        elif isinstance(module, GatedMLP):
            module.ops = RowParallelOps(base, comm, [module.params["down_proj.weight"]])
        elif isinstance(module, SparseMoE):
            module.ops = MoeParallelOps(base, comm, plan)


def load_shard(loader: Any, config: dict[str, Any], checkpoint: Any, backend: Any, comm: Any,
               expert_parallel: bool = False, dtype: Any = None) -> CausalLM:
    """Build, load and transform rank ``comm.rank``'s part of the model.

    Args:
        loader: the architecture's :class:`~atlas_core.model.decoder_loader.DecoderOnlyLoader`.
        config: config.json.
        checkpoint: the whole checkpoint (only this rank's slices are read).
        backend: this rank's GpuBackend.
        comm: this rank's CommBackend.
        expert_parallel: whole experts per rank.
        dtype: model dtype override.

    Raises:
        ShardingError: the model cannot be split this way (the message says why).
    """
    if not hasattr(loader, "build") or not hasattr(loader, "resolve_config"):
        raise ShardingError(f"{type(loader).__name__} builds no generic decoder; this model "
                            "family cannot be split across GPUs yet")
    resolved = loader.resolve_config(config)
    plan = ShardPlan.from_config(resolved, comm.rank, comm.world_size, expert_parallel)
    if expert_parallel and not plan.num_experts:
        raise ShardingError("--enable-expert-parallel needs a mixture-of-experts model "
                            "(config.json has no num_experts)")
    ckpt = ShardedCheckpoint(checkpoint, plan)
    embed = "model.embed_tokens.weight"
    np_dtype = model_dtype(resolved, dtype, checkpoint.dtype(embed) if embed in checkpoint else None)
    model = loader.build(plan.local_config(resolved))
    check_supported(model)
    reshard_specs(model, plan)
    check_size(parameter_count(model), np_dtype, ckpt, backend)
    weights = plan_weights(model, ckpt, resolved, quantized_formats(backend))
    model.materialize(backend, np_dtype, weights.allocate)
    load_weights(model, ckpt, resolved, weights)
    apply_parallel(model, comm, plan)
    log.info("rank %d/%d: %d of %d heads, %d KV heads, vocabulary rows %d.., %d of %d experts",
             comm.rank, comm.world_size, plan.num_heads // plan.world_size, plan.num_heads,
             plan.num_local_kv_heads, plan.vocab_start, plan.num_local_experts, plan.num_experts)
    return model
