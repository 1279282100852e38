"""Tensor / expert parallelism applied to a built model, the model code unaware.

Each rank builds the model from its narrower config (:meth:`ShardPlan.local_config`), declares
what that config does not give (its vocabulary rows, its experts), reads its slices of the
checkpoint (:class:`ShardedCheckpoint`, cut per layer by :mod:`.layer_rules`), then every module
that must talk to the other ranks gets an op table of its own that wraps the backend's
(``module.ops``, :mod:`.parallel_ops`).
"""

from __future__ import annotations

import logging
from typing import Any

from atlas_core.model.decoder_loader import model_dtype
from atlas_core.model.model import CausalLM
from atlas_core.model.quantized_loading import quantized_formats
from atlas_core.model.weight_loading import (check_size, fp8_block_size, load_weights,
                                             parameter_count, plan_weights)
from atlas_core.parallel.layer_rules import (check_supported, checkpoint_cuts, reshard_specs,
                                             rule_for)
from atlas_core.parallel.sharding import ShardedCheckpoint, ShardingError, ShardPlan

__all__ = ["apply_parallel", "build_random_shard", "check_supported", "load_shard",
           "reshard_specs"]

log = logging.getLogger(__name__)


def apply_parallel(model: CausalLM, comm: Any, plan: ShardPlan) -> None:
    """Give every module that communicates its wrapping op table (after loading); the children
    of a layer that combines them itself (a MoE block's shared expert) keep the backend's."""
    owned: set[int] = set()
    for module in model.modules():
        if id(module) in owned:
            continue
        rule = rule_for(module)
        if rule.owns_children:
            owned.update(id(m) for m in module.modules() if m is not module)
        module.ops = rule.wrap(module, module.ops, comm, plan)


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
    _check_generic(loader)
    loader.inspect_checkpoint(config, checkpoint)
    resolved, plan = _plan(loader, config, comm, expert_parallel)
    local = plan.local_config(resolved)
    model = loader.build(local)
    if hasattr(loader, "has_mtp_head") and loader.has_mtp_head(config, checkpoint):
        # as the single-GPU load: the head rides along whenever the checkpoint has one, built
        # from the same narrower config, so its block is split by the body's rules
        model.mtp = model.add("mtp", loader.build_mtp(local, model))
    check_supported(model)
    reshard_specs(model, plan)
    ckpt = ShardedCheckpoint(checkpoint, plan, checkpoint_cuts(model, plan),
                             fp8_block_size(resolved))
    embed = model.specs["model.embed_tokens.weight"].sources[0][0].name
    fallback = checkpoint.dtype(embed) if embed in checkpoint else None
    np_dtype = model_dtype(resolved, dtype, fallback)
    check_size(parameter_count(model), np_dtype, ckpt, backend)
    weights = plan_weights(model, ckpt, resolved, quantized_formats(backend))
    model.materialize(backend, np_dtype, weights.allocate)
    load_weights(model, ckpt, resolved, weights)
    apply_parallel(model, comm, plan)
    _log_shard(comm, plan)
    return model


def build_random_shard(loader: Any, config: dict[str, Any], backend: Any, comm: Any,
                       expert_parallel: bool = False, dtype: Any = None,
                       seed: int = 0) -> CausalLM:
    """Rank ``comm.rank``'s part of the model with random weights (``--load-format dummy``):
    built and split as :func:`load_shard` does, then only this rank's (local) parameters are
    allocated and filled on its device; no checkpoint is read and no MTP head is built.

    Every rank fills parameter ``i`` from the same seed, so what is replicated (norms, routers,
    replicated KV heads) is the same on every rank, as with a real checkpoint; the split parts
    repeat one another, which is as meaningless as any random value.
    """
    from atlas_core.bench.random_model import (check_random_fits, fill_random_params,
                                               quantized_allocator)
    _check_generic(loader)
    resolved, plan = _plan(loader, config, comm, expert_parallel)
    model = loader.build(plan.local_config(resolved))
    check_supported(model)
    reshard_specs(model, plan)
    check_random_fits(model, resolved, backend, model_dtype(resolved, dtype))
    allocate = quantized_allocator(resolved, backend)
    model.materialize(backend, model_dtype(resolved, dtype), allocate)
    nbytes = fill_random_params(model, backend, seed)
    backend.synchronize()
    apply_parallel(model, comm, plan)
    log.info("rank %d/%d: %.2f GB of random weights (--load-format dummy)", comm.rank,
             comm.world_size, nbytes / 1e9)
    _log_shard(comm, plan)
    return model


def _check_generic(loader: Any) -> None:
    if not hasattr(loader, "build") or not hasattr(loader, "resolve_config"):
        raise ShardingError(f"{type(loader).__name__} builds no generic decoder; this model "
                            "family cannot be split across GPUs yet")


def _plan(loader: Any, config: dict[str, Any], comm: Any,
          expert_parallel: bool) -> tuple[dict[str, Any], ShardPlan]:
    """``(resolved config, this rank's ShardPlan)``, refusing expert parallelism without
    experts."""
    resolved = loader.resolve_config(config)
    plan = ShardPlan.from_config(resolved, comm.rank, comm.world_size, expert_parallel)
    if expert_parallel and not plan.num_experts:
        raise ShardingError("--enable-expert-parallel needs a mixture-of-experts model "
                            "(config.json has no num_experts)")
    return resolved, plan


def _log_shard(comm: Any, plan: ShardPlan) -> None:
    log.info("rank %d/%d: %d of %d heads, %d KV heads, vocabulary rows %d.., %d of %d experts",
             comm.rank, comm.world_size, plan.num_heads // plan.world_size, plan.num_heads,
             plan.num_local_kv_heads, plan.vocab_start, plan.num_local_experts, plan.num_experts)
