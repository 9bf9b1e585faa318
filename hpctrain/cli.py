"""The ``hpctrain`` command line: one argparse parser, one module per subcommand in hpctrain/commands/.

Subcommand modules import only what their parser needs at top level; heavy imports (torch, numpy, mpi4py)
happen inside the runtime commands' handlers, so ``hpctrain render`` on a laptop starts fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from collections.abc import Sequence
from typing import TextIO

from hpctrain import __version__
from hpctrain.errors import HpctrainError
from hpctrain.text import printable_lines

# Order is the order of `hpctrain --help`.
COMMAND_MODULES = (
    "sites",
    "jobs",
    "render",
    "schema",
    "run",
    "submit",
    "status",
    "logs",
    "cancel",
    "resume",
    "runs",
    "plan",
    "report",
    "ffn",
    "demo",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hpctrain",
        description="Take a data-parallel training job from a laptop to a supercomputer and back.",
    )
    parser.add_argument("--version", action="version", version=f"hpctrain {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"hpctrain.commands.{name}")
        module.register(subparsers)
    return parser


_python_showwarning = warnings.showwarning


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: TextIO | None = None, line: str | None = None) -> None:
    """hpctrain's own warnings (e.g. the preflight's) as one plain line; others as Python shows them."""
    if category.__module__.startswith("hpctrain"):
        print(f"hpctrain: warning: {printable_lines(str(message))}", file=sys.stderr)
    else:
        _python_showwarning(message, category, filename, lineno, file, line)


def main(argv: Sequence[str] | None = None) -> int:
    warnings.showwarning = _show_warning
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except HpctrainError as exc:
        print(f"hpctrain: error: {printable_lines(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("hpctrain: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
