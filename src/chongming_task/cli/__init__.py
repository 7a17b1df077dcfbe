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

from ..stores.dsn import password_of
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


def _check_secrets(args: argparse.Namespace, argv: Sequence[str]) -> None:
    """Refuse a secret given on the command line: every user of the machine can read
    it there (``ps``, ``/proc/PID/cmdline``), in this process's and in a parent's such as
    ``uv run``'s, which nothing here could scrub. Each error names where it goes."""
    for flag, name in (("--db", "db"), ("--pg-listen-dsn", "pg_listen_dsn")):
        value = getattr(args, name, None)
        if isinstance(value, str) and password_of(value) and _given(value, argv):
            raise UsageError(
                f"{flag}: a password on the command line is readable by every user of this "
                "machine: give the DSN in the environment (CHONGMING_DB, "
                "CHONGMING_PG_LISTEN_DSN) or the password in ~/.pgpass or PGPASSWORD"
            )
    token = getattr(args, "token", None)
    if token and _given(token, argv):
        raise UsageError(
            "--token: a token on the command line is readable by every user of this "
            "machine: give it in CHONGMING_WEB_TOKEN or in a file (--token-file FILE)"
        )


def _given(value: str, argv: Sequence[str]) -> bool:
    """Whether ``value`` was given as a flag's value in ``argv`` (``--flag VALUE`` or
    ``--flag=VALUE``), rather than read from the environment."""
    return any(word == value or word.endswith("=" + value) for word in argv)


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
        words = sys.argv[1:] if argv is None else list(argv)
        args = build_parser().parse_args(words)
        _check_text_arguments(args)
        _check_secrets(args, words)
        ctx = Context(args)  # bucket flags are validated here, before anything else
        try:
            code[0] = COMMANDS[args.command](ctx)
        finally:
            ctx.close()
    return code[0]


def run() -> None:
    sys.exit(main())


__all__ = ["build_parser", "main", "run"]
