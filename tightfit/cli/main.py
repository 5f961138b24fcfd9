"""The `tightfit` command: a thin shell that dispatches to one module per subcommand.

Each subcommand module defines `register(subparsers) -> None`, which adds its parser and sets
`func=run`. Modules must not import torch at import time, so that `--help` stays fast.
User errors (TightfitError) print one line, no traceback, and exit with status 2.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from tightfit import __version__
from tightfit.errors import TightfitError

# Subcommand name -> module under tightfit.cli. Add a line here to add a subcommand.
SUBCOMMANDS: dict[str, str] = {
    "generate": "generate",
    "chat": "chat",
    "serve": "serve",
    "bench": "bench",
    "eval": "eval",
    "quantize": "quantize",
    "predict": "predict",
    "check": "check",
    "predictor": "predictor",
    "calibrate": "calibrate",
    "plan": "plan",
    "study": "study",
    "data": "data",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tightfit",
        description="Serve LLMs in tight memory, measure them, and predict how they will perform.",
    )
    parser.add_argument("--version", action="version", version=f"tightfit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in SUBCOMMANDS.items():
        try:
            mod = importlib.import_module(f"tightfit.cli.{module}")
        except ModuleNotFoundError as exc:
            if exc.name == f"tightfit.cli.{module}":
                continue  # subcommand not built yet
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except TightfitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (`tightfit check ... | head`): stop quietly, as Unix tools do;
        # stdout is pointed at /dev/null so that the interpreter's final flush cannot fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
