"""The ``atlas`` command. Every module in this package not starting with ``_`` is a subcommand
exposing ``add_parser(subparsers)`` and ``run(args) -> int``."""

from __future__ import annotations

import argparse
import difflib
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


class ArgumentParser(argparse.ArgumentParser):
    """argparse without prefix matching: ``--model X`` must never be taken as ``--model-name X``
    (every flag is spelled out; an unknown one is reported with close matches instead)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="atlas", description="Atlas LLM inference server")
    parser.add_argument("--version", action="version", version=f"atlas {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND",
                                       parser_class=ArgumentParser)
    for module in _subcommand_modules():
        sub = module.add_parser(subparsers)
        sub.set_defaults(_run=module.run, _parser=sub)
    return parser


def _reject_unknown(parser: argparse.ArgumentParser, args, extra: list[str]) -> None:
    """Exit 2 naming the unknown flags, with the subcommand's usage and close matches."""
    sub = getattr(args, "_parser", parser)
    known = [o for a in sub._actions for o in a.option_strings]
    hints = []
    for flag in (e.split("=")[0] for e in extra if e.startswith("-")):
        match = difflib.get_close_matches(flag, known, n=1, cutoff=0.75)
        if match:
            hints.append(f"{flag} -> {match[0]}?")
    hint = f" (did you mean: {', '.join(hints)})" if hints else ""
    sub.error(f"unrecognized arguments: {' '.join(extra)}{hint}; see `{sub.prog} --help`")


def error_message(exc: BaseException) -> str:
    """One line for an exception (``KeyError`` without the quotes ``str()`` adds)."""
    if isinstance(exc, KeyError) and len(exc.args) == 1 and isinstance(exc.args[0], str):
        return exc.args[0]
    return " ".join(str(exc).split()) or type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=env.log_level(), format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        _reject_unknown(parser, args, extra)
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
    except (ValueError, KeyError, FileNotFoundError) as exc:
        logging.getLogger("atlas").debug("bad input", exc_info=exc)
        print(f"error: {error_message(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - one line for users; DEBUG shows the traceback
        logging.getLogger("atlas").debug("command failed", exc_info=exc)
        print(f"error: {type(exc).__name__}: {error_message(exc)} (ATLAS_LOG_LEVEL=DEBUG shows "
              "the traceback)", file=sys.stderr)
        return 1


class UserError(Exception):
    """An error caused by the user's input; printed as one line, no traceback."""


if __name__ == "__main__":
    sys.exit(main())
