"""Building the engine's :class:`~atlas_core.engine.spec.Speculator` from its settings."""

from __future__ import annotations

from typing import Any, Callable

from atlas_core.engine.spec.config import SpeculativeConfig
from atlas_core.interfaces.layer import RecurrentStateSpec
from atlas_core.engine.spec.draft_graphs import DraftGraphs
from atlas_core.engine.spec.mtp import MTPProposer
from atlas_core.engine.spec.speculator import Speculator


def prepare_model(model: Any, config: SpeculativeConfig | None) -> None:
    """Before the KV cache is planned: ``mtp`` gives the model's MTP head its KV pool.

    Raises:
        ValueError: ``mtp`` for a model without a multi-token-prediction head; any method for
            a model with a recurrent layer that cannot roll a rejected draft back
            (``RecurrentStateSpec.spec_verify``).
    """
    if config is None:
        return
    for layer in getattr(model, "layers", ()):
        spec = layer.state_spec() if hasattr(layer, "state_spec") else None
        if isinstance(spec, RecurrentStateSpec) and not spec.spec_verify:
            raise ValueError(
                f"speculative decoding: the {type(layer).__name__} layers of this model keep a "
                "recurrent state that cannot roll a rejected draft back, so its output would "
                "change; serve it without --speculative / speculative_config")
    if config.method != "mtp":
        return
    enable = getattr(model, "enable_mtp", None)
    if enable is None or not enable():
        raise no_mtp_head(getattr(model, "config", None))


def no_mtp_head(config: dict | None) -> ValueError:
    """The error for ``mtp`` speculation on a model (of config.json ``config``) without a
    head Atlas loads."""
    arch = ((config or {}).get("architectures") or ["this model"])[0]
    return ValueError(f"speculative method 'mtp' needs a checkpoint with an MTP head "
                      f"(mtp.* tensors) that Atlas loads; {arch} has none here. Use "
                      '{"method": "ngram"} instead')


def create_speculator(config: SpeculativeConfig | None, model: Any, runner: Any,
                      block_manager: Any, max_seq_len: int, is_blocked: Callable,
                      num_unforced: Callable | None = None) -> Speculator | None:
    """The speculator for ``config`` (``None`` when speculation is off).

    Args:
        config: the engine's ``speculative_config``.
        model: the loaded CausalLM (:func:`prepare_model` ran for it).
        runner: the engine's :class:`~atlas_core.engine.model_runner.ModelRunner` (its
            backend, KV plan, state-row copies and the last step's hidden states), or a
            tensor-parallel executor, whose ``mtp_proposer`` drafts on its workers
            (:mod:`atlas_core.parallel.spec`).
        block_manager: the engine's KV blocks.
        max_seq_len: the engine's context limit.
        is_blocked: ``seq ->`` the token ids masked for ``seq`` this step (``min_tokens``).
        num_unforced: ``seq ->`` tokens taken as sampled before the engine forces others
            (thinking budgets; ``None``: no limit).
    """
    if config is None:
        return None
    proposer = None
    remote = getattr(runner, "mtp_proposer", None)
    if config.method == "mtp" and remote is not None:
        proposer = remote(block_manager, config.num_speculative_tokens)
    elif config.method == "mtp":
        graphs = None
        if config.draft_graphs and getattr(runner, "use_graphs", False):
            graphs = DraftGraphs(model, model.mtp, runner.backend, block_manager.block_size,
                                 runner.buckets, runner.max_blocks_per_seq, runner.max_seq_len)
        proposer = MTPProposer(model, model.mtp, runner.backend, block_manager,
                               config.num_speculative_tokens, lambda: runner.last_hidden,
                               graphs=graphs)
    if config.verify_graphs and hasattr(runner, "enable_verify_graphs"):
        runner.enable_verify_graphs(config.num_speculative_tokens + 1,
                                    config.disable_by_batch_size)
    kv = runner.kv
    state_rows = kv.num_state_rows - kv.num_spec_state_rows if kv.num_state_slots else None
    return Speculator(config, block_manager, max_seq_len, proposer=proposer,
                      state_rows=state_rows, copy_state_rows=runner.copy_state_rows,
                      is_blocked=is_blocked, num_unforced=num_unforced)
