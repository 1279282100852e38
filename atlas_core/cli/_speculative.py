"""``--speculative-config`` (vLLM's form) and ``--speculative [--num-drafts K]`` (the original
engine's), shared by ``atlas serve`` and ``atlas generate`` (docs/serving.md, "Speculative
decoding")."""

from __future__ import annotations

import argparse
from typing import Any

from atlas_core.cli._arg_types import parse_json_object


def add_speculative_arguments(p: argparse.ArgumentParser) -> None:
    """Add the speculative-decoding flags to ``p``."""
    g = p.add_argument_group("speculative decoding")
    g.add_argument("--speculative-config", type=parse_json_object, default=None, metavar="JSON",
                   help='vLLM\'s form, e.g. \'{"method": "ngram", "num_speculative_tokens": 3}\' '
                   'or \'{"method": "mtp", "num_speculative_tokens": 2}\' (default: off)')
    g.add_argument("--speculative", action="store_true",
                   help="speculative decoding with the model's MTP head when it has one, else "
                   "n-gram (prompt lookup) drafts (default: off)")
    g.add_argument("--num-drafts", type=int, default=None, metavar="K",
                   help="with --speculative: tokens drafted per step (default 2)")


def speculative_config(args: argparse.Namespace, model_dir: str | None = None) -> Any:
    """The ``EngineArgs.speculative_config`` of these flags (``None``: off).

    ``--speculative`` picks ``mtp`` when the checkpoint has an MTP head Atlas loads
    (:func:`has_mtp_layers`), else ``ngram``.

    Raises:
        ValueError: ``--num-drafts`` without ``--speculative``, or both forms given.
    """
    config = getattr(args, "speculative_config", None)
    drafts = getattr(args, "num_drafts", None)
    if getattr(args, "speculative", False):
        if config is not None:
            raise ValueError("give --speculative-config or --speculative, not both")
        has_head = has_mtp_layers(model_dir, getattr(args, "cache_dir", None),
                                  getattr(args, "revision", None))
        config = {"method": "mtp" if has_head else "ngram",
                  "num_speculative_tokens": 2 if drafts is None else drafts}
    elif drafts is not None:
        raise ValueError("--num-drafts needs --speculative (or use --speculative-config)")
    return config


def has_mtp_layers(model_dir: str | None, cache_dir: str | None = None,
                   revision: str | None = None) -> bool:
    """Whether the checkpoint has a multi-token-prediction head Atlas loads (``None``: the
    built-in demo model, which has one): a Hugging Face repo id is resolved as the server will
    (its hub cache, else a download), and its family's loader checks config.json and the
    tensors (``has_mtp_head``: DeepSeek-V3's ``num_nextn_predict_layers`` names MTP layers its
    loader skips, so n-gram drafts). With no loader for the architecture: whether config.json
    declares MTP layers (``mtp_num_hidden_layers`` / ``num_nextn_predict_layers``; the load
    then names the missing plugin). False when the model cannot be found here (the load then
    says why)."""
    from atlas_core.engine.loading import DEMO_MODEL_DIR
    from atlas_core.model.loader import architecture, create_loader, read_config
    from atlas_core.plugins import Registry
    from atlas_core.weights.checkpoint import Checkpoint
    from atlas_core.weights.resolve import resolve_model
    try:
        path = resolve_model(model_dir or DEMO_MODEL_DIR, cache_dir=cache_dir,
                             revision=revision)
        config = read_config(path)
    except (OSError, ValueError):
        return False
    text = config.get("text_config", config)
    declared = bool(text.get("mtp_num_hidden_layers") or text.get("num_nextn_predict_layers"))
    try:
        loader = create_loader(Registry(), architecture(config))
    except (KeyError, ValueError, RuntimeError):
        return declared
    has_head = getattr(loader, "has_mtp_head", None)
    if has_head is None:  # the family attaches no MTP head (DeepSeek-V3, MiniMax-M2 skip theirs)
        return False
    try:
        return bool(has_head(config, Checkpoint.open(path)))
    except (OSError, ValueError, KeyError):
        return False
