"""The ``chongming-task`` command line: one view of every node's tasks.

Thin by design: parse, validate the bucket flags before anything else (an out-of-range
bucket is an error, never an empty result), call the library, render. One context manager
maps the library's errors to a one-line message and an exit code; no traceback reaches a
user for a user's mistake.

Exit codes: 0 ok, 1 failed (unknown task, store error, wait timed out), 2 bad usage,
130 interrupted.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence

from ..text import utf8_fault
from .commands import COMMANDS
from .context import Context
from .errors import errors_mapped
from .parser import UsageError, build_parser


def _check_text_arguments(args: argparse.Namespace) -> None:
    """Refuse an argument (or environment default) that is not UTF-8 text: Python turns
    undecodable bytes into lone surrogates that no store can hold or match."""
    for name, value in vars(args).items():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and utf8_fault(item) is not None:
                flag = name.upper() if name == "task_id" else "--" + name.replace("_", "-")
                raise UsageError(
                    f"{flag} {item!a} is not valid UTF-8 text (check the terminal's "
                    "or the environment's encoding)"
                )


def main(argv: Sequence[str] | None = None) -> int:
    # The pool logs each failed connection attempt; the one-line error says it already.
    driver_log = logging.getLogger("psycopg")
    driver_log.addHandler(logging.NullHandler())
    driver_log.propagate = False
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    code = [0]
    ctx: Context | None = None
    with errors_mapped(code):
        args = build_parser().parse_args(argv)
        _check_text_arguments(args)
        ctx = Context(args)  # bucket flags are validated here, before anything else
        try:
            code[0] = COMMANDS[args.command](ctx)
        finally:
            ctx.close()
    return code[0]


def run() -> None:
    sys.exit(main())


__all__ = ["build_parser", "main", "run"]
