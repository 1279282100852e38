"""Per layer kind: which checkpoint tensors each rank cuts, and how (:class:`LayerRule`).

A rank builds its layers from its narrower config (:meth:`ShardPlan.local_config`), so every
rule reads the local sizes off the built module and the whole sizes as local x N. Cuts are keyed
by the source names a module declares (``q_proj.weight``…); tensors a rule does not name are
held whole (norms, routers, gates). Rules are found by the layer's class name along its MRO, so
the layers of model-family plugins (Gated DeltaNet, Mamba-2, Nemotron-H's MoE) are split without
this package importing them, and a subclass (``GatedAttention``, ``SharedExpertMoE``) gets its
base's rule. Where each rank then communicates: :mod:`atlas_core.parallel.parallel_ops`.
"""

from __future__ import annotations

import re
from typing import Any

from atlas_core.model.params import ParamSpec, Source
from atlas_core.parallel.cuts import Cut, ShardingError
from atlas_core.parallel.parallel_ops import (MoeParallelOps, RowParallelOps, SumParallelOps,
                                              VocabParallelOps)
from atlas_core.parallel.sharding import ShardPlan

_EXPERT = re.compile(r"^experts\.(\d+)\.")
_ROWS, _COLUMNS, _ZEROS = Cut(0), Cut(1), Cut(zeros=True)


def _row_parallel_mlp(inputs: tuple[str, ...]) -> dict[str, Cut]:
    """Column-parallel input projections, a row-parallel ``down_proj`` (its bias on rank 0)."""
    cuts = {f"{name}.{part}": _ROWS for name in inputs for part in ("weight", "bias")}
    cuts.update({"down_proj.weight": _COLUMNS, "down_proj.bias": _ZEROS})
    return cuts


class LayerRule:
    """How one layer kind is split. Subclasses override what they need.

    Attributes:
        reduced: parameters whose ``linear`` is all-reduced (the row-parallel projections).
        owns_children: the layer combines its children's partial outputs itself (a MoE block
            and its shared expert: one all-reduce for both), so they get no op table of their
            own.
    """

    reduced: tuple[str, ...] = ()
    owns_children = False

    def cuts(self, module: Any, plan: ShardPlan) -> dict[str, Cut]:
        """Source name -> cut (sources not named are held whole)."""
        return {}

    def respec(self, module: Any, plan: ShardPlan) -> None:
        """Optional. Re-declare parameters whose rank-local shape the config does not give."""

    def wrap(self, module: Any, base: Any, comm: Any, plan: ShardPlan) -> Any:
        """The op table of the loaded layer (default: :attr:`reduced` all-reduced)."""
        if not self.reduced:
            return base
        return RowParallelOps(base, comm, [module.params[name] for name in self.reduced])


class Replicated(LayerRule):
    """Every rank holds the layer whole (a decoder block's norms)."""


class WholeRule(LayerRule):
    """Every rank holds the module and everything in it whole and runs it alone, with the
    backend's ops (a vision tower: each rank encodes the step's images itself)."""

    owns_children = True


class VocabRule(LayerRule):
    """The model: embedding and lm_head rows ``vocab_start ..`` (the last shard zero-padded)."""

    def respec(self, module: Any, plan: ShardPlan) -> None:
        for name in ("model.embed_tokens.weight", "lm_head.weight"):
            if name in module.specs:
                _redeclare(module, name, 0, plan.vocab_shard_size)

    def wrap(self, module: Any, base: Any, comm: Any, plan: ShardPlan) -> Any:
        return VocabParallelOps(base, comm, plan, module.params["model.embed_tokens.weight"],
                                module.lm_head)

    def cuts(self, module: Any, plan: ShardPlan) -> dict[str, Cut]:
        n, start = plan.vocab_shard_size, plan.vocab_start
        cut = Cut(0, spans=((start, start + n),), pad_to=n)
        return {s.name: cut for name in ("model.embed_tokens.weight", "lm_head.weight")
                if name in module.specs for group in module.specs[name].sources for s in group}


class MTPRule(LayerRule):
    """A multi-token-prediction head (``mtp.*``): its decoder block is split by that block's
    own rules (attention heads, MLP or MoE, like the body's); ``fc`` and the norms are held
    whole (``fc`` maps the whole ``[embedding; hidden]`` to the whole hidden state the block
    reads on every rank; splitting it would only add a gather), and the embedding it shares
    with the model is this rank's vocabulary shard, so its lookup is all-reduced as the
    body's."""

    def wrap(self, module: Any, base: Any, comm: Any, plan: ShardPlan) -> Any:
        return VocabParallelOps(base, comm, plan, module.embed_tokens(), None)


class AttentionRule(LayerRule):
    """Query heads / N (gated attention's per-head gate rows with them), KV heads / N or
    replicated when fewer than ranks; ``o_proj`` row-parallel."""

    reduced = ("o_proj.weight",)

    def cuts(self, module: Any, plan: ShardPlan) -> dict[str, Cut]:
        rows = plan.kv_rows()
        kv = Cut(0, spans=((rows.start, rows.stop),))
        return {"q_proj.weight": _ROWS, "q_proj.bias": _ROWS, "k_proj.weight": kv,
                "k_proj.bias": kv, "v_proj.weight": kv, "v_proj.bias": kv,
                "o_proj.weight": _COLUMNS, "o_proj.bias": _ZEROS}


class MLARule(LayerRule):
    """Multi-head latent attention (DeepSeek-V3, Mistral-4) by heads: each rank's rows of
    ``q_proj`` / ``q_b_proj`` and ``kv_b_proj`` (whole heads), ``o_proj`` row-parallel; the
    latent projections ``q_a_proj`` / ``kv_a_proj_with_mqa`` and their norms replicated, so
    every rank writes the same latent cache."""

    reduced = ("o_proj.weight",)

    def cuts(self, module: Any, plan: ShardPlan) -> dict[str, Cut]:
        return {"q_proj.weight": _ROWS, "q_b_proj.weight": _ROWS, "kv_b_proj.weight": _ROWS,
                "o_proj.weight": _COLUMNS, "o_proj.bias": _ZEROS}


class GatedMLPRule(LayerRule):
    """Gate/up rows and down columns (a dense MLP or a MoE's shared expert)."""

    reduced = ("down_proj.weight",)

    def cuts(self, module: Any, plan: ShardPlan) -> dict[str, Cut]:
        return _row_parallel_mlp(("gate_proj", "up_proj"))


class ReLU2MLPRule(LayerRule):
    """Up rows and down columns (Nemotron-H's squared-ReLU MLP and shared expert)."""

    reduced = ("down_proj.weight",)

    def cuts(self, module: Any, plan: ShardPlan) -> dict[str, Cut]:
        return _row_parallel_mlp(("up_proj",))


class MoERule(LayerRule):
    """Routed experts: a slice of every expert (tensor parallel) or whole experts
    ``expert_start ..`` (expert parallel); the shared expert (a child) split like a dense MLP
    either way; routers and gates replicated.

    Attributes:
        stacked: ``(input param, output param)`` of the stacked expert weights.
        gated: the input param stacks gate then up rows per expert.
    """

    owns_children = True
    stacked = ("experts.gate_up_proj", "experts.down_proj")
    gated = True

    def wrap(self, module: Any, base: Any, comm: Any, plan: ShardPlan) -> Any:
        return MoeParallelOps(base, comm, plan)

    def respec(self, module: Any, plan: ShardPlan) -> None:
        if not plan.expert_parallel:
            return
        for name in self.stacked:
            _keep_experts(module, name, plan.expert_start, plan.num_local_experts)

    def cuts(self, module: Any, plan: ShardPlan) -> dict[str, Cut]:
        first, second = self.stacked
        if plan.expert_parallel:
            start, count = plan.expert_start, plan.num_local_experts
            spans = Cut(0, spans=((start, start + count),))
            return {_fused_name(module, first): spans, _fused_name(module, second): spans}
        inner = module.specs[second].shape[-1] * plan.world_size
        cuts = {_fused_name(module, first): Cut(1, blocks=(inner, inner) if self.gated else None),
                _fused_name(module, second): Cut(2)}
        for group in module.specs[first].sources + module.specs[second].sources:
            for s in group:
                if _EXPERT.match(s.name):
                    cuts[s.name] = _COLUMNS if s.name.endswith("down_proj.weight") else _ROWS
        return cuts


class NemotronMoERule(MoERule):
    """Nemotron-H's MoE: non-gated experts (``experts.up_proj`` / ``experts.down_proj``); the
    latent down-projection's bias is added by rank 0 only (its input is a partial sum). The
    block's output is ``add(routed, shared)``, or ``nemotron_h_moe_experts`` itself when the
    shared expert runs inside it (``fused_shared``): that op is all-reduced."""

    stacked = ("experts.up_proj", "experts.down_proj")
    gated = False

    def wrap(self, module: Any, base: Any, comm: Any, plan: ShardPlan) -> Any:
        fused = getattr(module, "fused_shared", False)
        return SumParallelOps(base, comm, plan, "nemotron_h_moe_experts" if fused else "add")

    def cuts(self, module: Any, plan: ShardPlan) -> dict[str, Cut]:
        return {**super().cuts(module, plan), "fc2_latent_proj.bias": _ZEROS}


class DeepseekMoERule(MoERule):
    """DeepSeek-V3 / Mistral-4's MoE: routed experts as :class:`MoERule`, the shared experts
    (``num_shared_experts`` wide) split by their intermediate size under expert parallelism
    too; the block's output, ``add(routed, shared)`` (or the routed experts alone), is
    all-reduced once."""

    def respec(self, module: Any, plan: ShardPlan) -> None:
        super().respec(module, plan)
        shared = getattr(module, "shared_experts", None)
        if plan.expert_parallel and shared is not None:
            for name, axis in (("gate_up_proj.weight", 0), ("gate_up_proj.bias", 0),
                               ("down_proj.weight", 1)):
                if name in shared.specs:
                    _divide(shared, name, axis, plan.world_size)

    def wrap(self, module: Any, base: Any, comm: Any, plan: ShardPlan) -> Any:
        reduced = "add" if getattr(module, "shared_experts", None) is not None else "moe_experts"
        return SumParallelOps(base, comm, plan, reduced)


class GatedDeltaNetRule(LayerRule):
    """Gated DeltaNet heads / N: whole key-head groups per rank (their value heads follow),
    their rows of the q/k/v/z/b/a projections and conv channels, their ``A_log`` /
    ``dt_bias``; ``out_proj`` row-parallel. Qwen3-Next's grouped ``in_proj_qkvz`` / ``in_proj_ba``
    hold one block per key head, so an even row split keeps groups whole there too."""

    reduced = ("out_proj.weight",)

    def cuts(self, module: Any, plan: ShardPlan) -> dict[str, Cut]:
        n = plan.world_size
        key, value = module.key_dim * n, module.value_dim * n
        qkv = Cut(0, blocks=(key, key, value))
        cuts = {name: _ROWS for name in ("in_proj_z.weight", "in_proj_b.weight",
                                         "in_proj_a.weight", "in_proj_qkvz.weight",
                                         "in_proj_ba.weight", "A_log", "dt_bias")}
        cuts.update({"in_proj_qkv.weight": qkv, "conv1d.weight": qkv,
                     "out_proj.weight": _COLUMNS})
        return cuts


class Mamba2Rule(LayerRule):
    """Mamba-2 heads / N with their B/C groups (``n_groups / N`` per rank): rows of ``z``,
    ``x``, ``B``, ``C`` and ``dt`` in ``in_proj``, conv channels, ``A_log`` / ``D`` /
    ``dt_bias`` and the grouped norm; ``out_proj`` row-parallel (its bias on rank 0)."""

    reduced = ("out_proj.weight",)

    def cuts(self, module: Any, plan: ShardPlan) -> dict[str, Cut]:
        n = plan.world_size
        inner, groups = module.inner * n, module.n_groups * module.state_size * n
        xbc = Cut(0, blocks=(inner, groups, groups))
        project = Cut(0, blocks=(inner, inner, groups, groups, module.num_heads * n))
        return {"in_proj.weight": project, "in_proj.bias": project, "conv1d.weight": xbc,
                "conv1d.bias": xbc, "A_log": _ROWS, "D": _ROWS, "dt_bias": _ROWS,
                "norm.weight": _ROWS, "out_proj.weight": _COLUMNS, "out_proj.bias": _ZEROS}


#: Layer class name -> its rule (looked up along the MRO, nearest class first).
RULES: dict[str, LayerRule] = {
    "CausalLM": VocabRule(), "DecoderLayer": Replicated(), "Attention": AttentionRule(),
    "GatedMLP": GatedMLPRule(), "SparseMoE": MoERule(), "GatedDeltaNet": GatedDeltaNetRule(),
    "Mamba2Mixer": Mamba2Rule(), "ReLU2MLP": ReLU2MLPRule(), "NemotronHMoE": NemotronMoERule(),
    "MLAttention": MLARule(), "DeepseekMoE": DeepseekMoERule(), "VisionTower": WholeRule(),
    "MTPHead": MTPRule(),
}


def rule_for(module: Any) -> LayerRule | None:
    """The rule of ``module``'s class or its nearest base with one (None: not splittable)."""
    return next((RULES[c.__name__] for c in type(module).__mro__ if c.__name__ in RULES), None)


def held_whole(model: Any) -> set[int]:
    """Ids of the modules inside a module every rank holds whole (:class:`WholeRule`)."""
    inside: set[int] = set()
    for module in model.modules():
        if id(module) not in inside and isinstance(rule_for(module), WholeRule):
            inside.update(id(m) for m in module.modules() if m is not module)
    return inside


def split_modules(model: Any) -> list[Any]:
    """The modules of ``model`` a rule cuts (those inside a whole-held module left out)."""
    inside = held_whole(model)
    return [m for m in model.modules() if id(m) not in inside]


def check_supported(model: Any) -> None:
    """Every module of ``model`` is one the transform knows how to split.

    Raises:
        ShardingError: naming the first module that is not.
    """
    for module in split_modules(model):
        if rule_for(module) is None:
            raise ShardingError(f"{type(module).__name__} layers cannot be split across GPUs "
                                "yet: tensor parallelism covers attention, latent attention "
                                "(MLA), Gated DeltaNet, Mamba-2, dense MLP, sparse MoE and "
                                "shared-expert layers")


def reshard_specs(model: Any, plan: ShardPlan) -> None:
    """Declare what the local config does not give: vocabulary rows, a rank's experts."""
    for module in split_modules(model):
        rule_for(module).respec(module, plan)


def checkpoint_cuts(model: Any, plan: ShardPlan) -> dict[str, Cut]:
    """Checkpoint tensor name -> this rank's cut, for every tensor the model reads that is cut."""
    out: dict[str, Cut] = {}
    inside = held_whole(model)
    for full, module, local, spec in model.named_specs():
        if id(module) in inside:
            continue
        prefix = full[: len(full) - len(local)]
        cuts = rule_for(module).cuts(module, plan)
        for group in spec.sources:
            out.update({prefix + s.name: cuts[s.name] for s in group if s.name in cuts})
    return out


def _fused_name(module: Any, param: str) -> str:
    """The name of the already-stacked checkpoint tensor of expert ``param``."""
    for group in module.specs[param].sources:
        if len(group) == 1 and not _EXPERT.match(group[0].name):
            return group[0].name
    return param


def _redeclare(module: Any, name: str, axis: int, size: int) -> None:
    """Re-declare parameter ``name`` (and every source) with ``size`` along ``axis``."""
    spec = module.specs[name]

    def resized(shape: tuple[int, ...]) -> tuple[int, ...]:
        return (*shape[:axis], size, *shape[axis + 1:])

    groups = tuple(tuple(Source(s.name, resized(s.shape)) for s in g) for g in spec.sources)
    module.specs[name] = ParamSpec(resized(spec.shape), groups, spec.dtype, spec.quantizable)


def _divide(module: Any, name: str, axis: int, n: int) -> None:
    """Re-declare parameter ``name`` (and every source) with ``1 / n`` of ``axis``."""
    spec = module.specs[name]

    def divided(shape: tuple[int, ...]) -> tuple[int, ...]:
        if shape[axis] % n:
            raise ShardingError(f"{name}: {shape[axis]} rows/columns do not split over {n} GPUs")
        return (*shape[:axis], shape[axis] // n, *shape[axis + 1:])

    groups = tuple(tuple(Source(s.name, divided(s.shape)) for s in g) for g in spec.sources)
    module.specs[name] = ParamSpec(divided(spec.shape), groups, spec.dtype, spec.quantizable)


def _keep_experts(module: Any, name: str, start: int, count: int) -> None:
    """Re-declare stacked expert parameter ``name`` with experts ``start .. start + count``."""
    spec = module.specs[name]
    groups = []
    for group in spec.sources:
        kept = tuple(s for s in group if not _EXPERT.match(s.name)
                     or start <= int(_EXPERT.match(s.name).group(1)) < start + count)
        groups.append(tuple(Source(s.name, (count, *s.shape[1:])) if not _EXPERT.match(s.name)
                            else s for s in kept))
    if any(not g for g in groups):
        raise ShardingError(f"{name}: no experts left for this rank")
    module.specs[name] = ParamSpec((count, *spec.shape[1:]), tuple(groups), spec.dtype,
                                   spec.quantizable)
