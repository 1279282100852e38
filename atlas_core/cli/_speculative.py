"""``--speculative-config`` (vLLM's form) and ``--speculative [--num-drafts K]`` (the original
engine's), shared by ``atlas serve`` and ``atlas generate`` (docs/serving.md, "Speculative
decoding")."""

from __future__ import annotations

import argparse
import json
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

    ``--speculative`` picks ``mtp`` when the checkpoint's config names MTP layers
    (``mtp_num_hidden_layers`` / ``num_nextn_predict_layers``), else ``ngram``.

    Raises:
        ValueError: ``--num-drafts`` without ``--speculative``, or both forms given.
    """
    config = getattr(args, "speculative_config", None)
    drafts = getattr(args, "num_drafts", None)
    if getattr(args, "speculative", False):
        if config is not None:
            raise ValueError("give --speculative-config or --speculative, not both")
        config = {"method": "mtp" if has_mtp_layers(model_dir) else "ngram",
                  "num_speculative_tokens": 2 if drafts is None else drafts}
    elif drafts is not None:
        raise ValueError("--num-drafts needs --speculative (or use --speculative-config)")
    return config


def has_mtp_layers(model_dir: str | None) -> bool:
    """Whether a local checkpoint's config.json declares multi-token-prediction layers
    (``None``: the built-in demo model, which has an MTP head)."""
    from pathlib import Path

    from atlas_core.engine.loading import DEMO_MODEL_DIR
    path = Path(model_dir or DEMO_MODEL_DIR).expanduser() / "config.json"
    if not path.is_file():
        return False
    config = json.loads(path.read_text())
    config = config.get("text_config", config)
    return bool(config.get("mtp_num_hidden_layers") or config.get("num_nextn_predict_layers"))
