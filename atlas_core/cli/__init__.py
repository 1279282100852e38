"""The ``atlas`` command. Every module in this package not starting with ``_`` is a subcommand
exposing ``add_parser(subparsers)`` and ``run(args) -> int``."""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

from atlas_core import __version__, env


def _subcommand_modules():
    import atlas_core.cli as pkg
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        if not info.name.startswith("_"):
            yield importlib.import_module(f"atlas_core.cli.{info.name}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="atlas", description="Atlas LLM inference server")
    parser.add_argument("--version", action="version", version=f"atlas {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _subcommand_modules():
        sub = module.add_parser(subparsers)
        sub.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=env.log_level(), format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


class UserError(Exception):
    """An error caused by the user's input; printed as one line, no traceback."""


if __name__ == "__main__":
    sys.exit(main())
