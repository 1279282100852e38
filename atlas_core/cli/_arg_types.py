"""argparse ``type=`` converters (each turns a flag's text into a value or fails with one line
saying what a valid value looks like) and the ``MODEL`` / ``--model`` pair."""

from __future__ import annotations

import argparse
import json
import re


def parse_size(text: str) -> int:
    """``"32M"``, ``"1G"``, ``"1048576"`` -> bytes (K/M/G are powers of 1024)."""
    match = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)i?[bB]?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 1048576, 512K, 32M, 1G)")
    return int(match.group(1)) * 1024 ** " KMG".index(match.group(2).upper() or " ")


def parse_port(text: str) -> int:
    """A TCP port number, 0-65535 (0 picks a free port)."""
    if not text.strip().isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"not a port: {text!r} (use 1-65535, e.g. 8888)")
    return int(text)


def parse_seconds(text: str) -> float:
    """A duration in seconds, >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"not a number of seconds >= 0: {text!r}")
    return value


def parse_name(text: str) -> str:
    """A non-empty model name."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def parse_json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            'must be a JSON object, e.g. \'{"enable_thinking": true}\'')
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


class _StoreModel(argparse.Action):
    """Stores MODEL from the positional or ``--model``; giving two different models is an error."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if values is None:
            return
        current = getattr(namespace, self.dest, None)
        if current is not None and current != values:
            parser.error(f"two models given ({current!r} and {values!r}); pass MODEL or --model, "
                         "not both")
        setattr(namespace, self.dest, values)


def add_model_arguments(parser: argparse.ArgumentParser, help_text: str) -> None:
    """``MODEL`` as a positional and as ``--model MODEL`` (vLLM's spelling), one ``args.model``."""
    parser.add_argument("model", nargs="?", default=None, metavar="MODEL", action=_StoreModel,
                        help=help_text)
    parser.add_argument("--model", dest="model", default=argparse.SUPPRESS, metavar="MODEL",
                        action=_StoreModel, help="the same as MODEL (vLLM's spelling)")
