"""The command line's grammar: flags, subcommands, and the one environment-default
helper every global flag uses."""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Callable
from datetime import timedelta
from importlib import metadata
from typing import Any, NoReturn, TypeVar

from ..errors import ChongmingTaskError
from ..fleet import DEFAULT_ORPHAN_AFTER, DEFAULT_STALE_AFTER
from ..limits import MAX_COUNT, MAX_DURATION, MIN_REMOTE_TOKEN
from ..model import CommandAction, TaskStatus
from ..policies import DEFAULT_NUM_BUCKETS
from ..states import TERMINAL
from ..stores import DEFAULT_DATABASE
from ..stores.sqlite.store import DEFAULT_DURABILITY, DURABILITIES, Durability

__all__ = ["PROG", "UsageError", "age", "build_parser", "env"]

PROG = "chongming-task"


class UsageError(ChongmingTaskError):
    """Bad flags or arguments: exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


T = TypeVar("T")


def env(name: str, default: T, parse: Callable[[str], T]) -> T:
    """The one way a flag gets its environment default: ``$name`` parsed, else
    ``default``. A value that does not parse is a usage error naming the variable."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return parse(raw)
    except ValueError as exc:
        raise UsageError(f"{name}={raw!r} is {exc}") from None


def _durability(raw: str) -> Durability:
    if raw == "full":
        return "full"
    if raw == "normal":
        return "normal"
    raise ValueError(f"not one of {', '.join(DURABILITIES)}")


def _whole_number(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError("not a whole number") from None


_AGE = re.compile(r"(\d{1,12}(?:\.\d{1,9})?)([smhdw]?)")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def age(raw: str) -> timedelta:
    """A duration as people write it: ``90s``, ``15m``, ``2h``, ``7d``, ``2w`` (a bare
    number is seconds), of at most ``MAX_DURATION`` (a century)."""
    found = _AGE.fullmatch(raw.strip())
    if found is None:
        raise argparse.ArgumentTypeError(f"{raw!r} is no duration (write 90s, 15m, 2h, 7d, 2w)")
    seconds = float(found[1]) * _UNIT[found[2]]
    if seconds > MAX_DURATION:
        raise argparse.ArgumentTypeError(f"{raw!r} is longer than a century")
    return timedelta(seconds=seconds)


def count(raw: str) -> int:
    """A whole number from 0 to ``MAX_COUNT``."""
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a whole number") from None
    if not 0 <= value <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"{raw} is not a whole number from 0 to {MAX_COUNT:,}")
    return value


def seconds(raw: str) -> float:
    """A finite number of seconds from 0 to ``MAX_DURATION`` (never NaN or infinity)."""
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number of seconds") from None
    if not (math.isfinite(value) and 0 <= value <= MAX_DURATION):
        raise argparse.ArgumentTypeError(
            f"{raw!r} is not a number of seconds from 0 to {MAX_DURATION:,}"
        )
    return value


def _switch(raw: str) -> bool:
    return raw not in ("", "0")


def _text(raw: str) -> str:
    return raw


def _listed(variable: str) -> list[str]:
    """An environment variable's comma-separated items (none where it is unset)."""
    return [item for item in os.environ.get(variable, "").split(",") if item]


def _global_flags(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """The flags every command takes, before the command or after it. Given after it,
    the subcommand's parser sets them; its defaults are left out (``SUPPRESS``), so the
    main parser's stand when they are not given there."""

    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--db",
        default=default(env("CHONGMING_DB", DEFAULT_DATABASE, _text)),
        help=f"SQLite file or postgresql:// DSN (env CHONGMING_DB, default {DEFAULT_DATABASE})",
    )
    parser.add_argument(
        "--num-buckets",
        type=int,
        default=default(env("CHONGMING_NUM_BUCKETS", None, _whole_number)),
        help=f"deployment-wide bucket count (env CHONGMING_NUM_BUCKETS; default: what the "
        f"live nodes declared for doctor and the dashboard, else "
        f"{DEFAULT_NUM_BUCKETS})",
    )
    parser.add_argument(
        "--owned-buckets",
        default=default(env("CHONGMING_OWNED_BUCKETS", None, _text)),
        help="this node's buckets, e.g. 0-15,20 (env CHONGMING_OWNED_BUCKETS)",
    )
    parser.add_argument(
        "--pg-schema",
        default=default(env("CHONGMING_PG_SCHEMA", None, _text)),
        help="PostgreSQL schema (env CHONGMING_PG_SCHEMA, default chongming)",
    )
    parser.add_argument(
        "--pg-pooled",
        action="store_true",
        default=default(env("CHONGMING_PG_POOLED", False, _switch)),
        help="the DSN reaches PostgreSQL through a pooler in transaction mode, such as "
        "PgBouncer (env CHONGMING_PG_POOLED=1)",
    )
    parser.add_argument(
        "--pg-listen-dsn",
        default=default(env("CHONGMING_PG_LISTEN_DSN", None, _text)),
        help="a direct DSN for LISTEN wake-ups when --pg-pooled (env CHONGMING_PG_LISTEN_DSN)",
    )
    parser.add_argument(
        "--sqlite-durability",
        choices=tuple(DURABILITIES),
        default=default(env("CHONGMING_SQLITE_DURABILITY", DEFAULT_DURABILITY, _durability)),
        help="what a SQLite commit survives: full (a power cut too) or normal (a process "
        f"crash) (env CHONGMING_SQLITE_DURABILITY, default {DEFAULT_DURABILITY})",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=default(env("CHONGMING_JSON", False, _switch)),
        help="machine-readable output (env CHONGMING_JSON=1)",
    )


def _version() -> str:
    try:
        return f"{PROG} {metadata.version(PROG)}"
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return f"{PROG} (version unknown: not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="See and control chongming-task tasks.")
    parser.add_argument("--version", action="version", version=_version())
    _global_flags(parser, defaults=True)
    common = _Parser(add_help=False)
    _global_flags(common, defaults=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def command(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], **kwargs)

    sub.required = True

    def filters(p: argparse.ArgumentParser) -> None:
        p.add_argument("--all", action="store_true", help="include finished tasks")
        p.add_argument("--mine", action="store_true", help="only this node's buckets")
        p.add_argument("--status", action="append", choices=[s.value for s in TaskStatus])
        p.add_argument(
            "--name", action="append", help="a name or a glob ('etl.*'); repeat for any of several"
        )
        p.add_argument("--tag", action="append", help="a tag; repeat for any of several")
        p.add_argument(
            "--carrier",
            choices=["process", "async"],
            help="only the tasks run in worker processes, or as async def (their tag)",
        )
        p.add_argument("--bucket", action="append", type=count)
        p.add_argument("--pipeline")
        p.add_argument("--node", help="only the tasks of this node (their owner)")
        p.add_argument("--dedupe-key", help="only the tasks submitted with this dedupe key")
        p.add_argument(
            "--older-than",
            type=age,
            metavar="AGE",
            help="only the tasks created more than AGE ago: 90s, 15m, 2h, 7d, 2w",
        )
        p.add_argument(
            "--limit", type=count, help="at most N tasks, newest first (ps: 100; 0: all)"
        )

    p = command("ps", help="list tasks (active ones unless --all)")
    filters(p)
    p = command("show", help="one task: snapshot, progress, failure")
    p.add_argument("task_id")
    p = command("history", help="one task's transitions")
    p.add_argument("task_id")
    p.add_argument("--since", type=count, default=0, metavar="VERSION")
    p = command("watch", help="follow changes live")
    filters(p)
    p.add_argument("--interval", type=seconds, default=1.0)
    p.add_argument("--count", type=count, default=None, help="stop after N refreshes")
    command("stats", help="tasks per status")
    p = command("buckets", help="tasks per bucket; * marks owned buckets")
    p.add_argument("--all", action="store_true", help="list empty buckets too")
    for action in CommandAction:
        p = command(
            action.value,
            help=f"{action.value} a task, or every task a selection (as ps's) picks",
        )
        p.add_argument("task_id", nargs="?", help="one task (else the selection flags)")
        filters(p)
        p.add_argument("--dry-run", action="store_true", help="list the selection; send nothing")
        p.add_argument("--yes", action="store_true", help="no question for a selection")
        p.add_argument("--reason")
        p.add_argument(
            "--wait",
            nargs="?",
            type=seconds,
            const=30.0,
            default=None,
            metavar="SECONDS",
            help="wait for the outcome (default 30 s)",
        )
    p = command("reconcile", help="mark tasks of dead nodes lost (owned buckets)")
    p.add_argument("--dry-run", action="store_true")
    command("nodes", help="every declared node: buckets, last seen, live or not")
    command(
        "schedules",
        help="each schedule once: the nodes that define it, trigger, next slot, last firing "
        "and who fired it, state",
    )
    p = command(
        "doctor",
        help="fleet alarms: duplicate and uncovered buckets, orphans, stale queued tasks, "
        "expired leases (exit 3 if any)",
    )
    p.add_argument(
        "--orphan-after",
        type=seconds,
        default=DEFAULT_ORPHAN_AFTER,
        metavar="SECONDS",
        help=f"unchanged this long in an uncovered bucket (default {DEFAULT_ORPHAN_AFTER:g})",
    )
    p.add_argument(
        "--stale-after",
        type=seconds,
        default=DEFAULT_STALE_AFTER,
        metavar="SECONDS",
        help=f"queued and unchanged this long (default {DEFAULT_STALE_AFTER:g})",
    )
    p.add_argument("--limit", type=count, default=20, help="task ids listed per alarm")
    p = command(
        "prune",
        help="delete finished tasks: those that ended more than --older-than AGE ago, or "
        "the oldest beyond the newest --keep N",
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--older-than", type=age, metavar="AGE", help="90s, 15m, 2h, 7d, 2w")
    which.add_argument("--keep", type=count, metavar="N")
    p.add_argument(
        "--status",
        action="append",
        choices=[s.value for s in TaskStatus if s in TERMINAL],
        help="only these finished statuses (with --older-than; repeatable)",
    )
    p.add_argument("--dry-run", action="store_true", help="say how many, delete nothing")
    p.add_argument(
        "--compact",
        action="store_true",
        help="SQLite: give the freed space back to the disk (writers wait while it runs)",
    )
    command("migrate", help="create the store's schema (needs DDL rights once)")
    p = command("web", help="the web dashboard and /metrics (the [web] extra)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8484)
    p.add_argument("--read-only", action="store_true", help="no controls")
    p.add_argument(
        "--token",
        default=os.environ.get("CHONGMING_WEB_TOKEN"),
        help="access token: give it in the environment (CHONGMING_WEB_TOKEN) or a file "
        "(--token-file), never on the command line, which every user of the machine can "
        f"read; required off loopback and behind a proxy, of {MIN_REMOTE_TOKEN}+ characters",
    )
    p.add_argument(
        "--token-file",
        metavar="FILE",
        default=os.environ.get("CHONGMING_WEB_TOKEN_FILE"),
        help="read the access token from FILE (its first line; env CHONGMING_WEB_TOKEN_FILE)",
    )
    p.add_argument(
        "--trusted-proxy",
        action="append",
        default=_listed("CHONGMING_WEB_TRUSTED_PROXIES"),
        metavar="ADDRESS",
        help="a proxy in front of the dashboard whose X-Forwarded-For and X-Forwarded-Proto "
        "are believed: an address or a network (127.0.0.1, 10.0.0.0/8); repeatable (env "
        "CHONGMING_WEB_TRUSTED_PROXIES, comma-separated). Nobody else's are",
    )
    p.add_argument(
        "--allowed-host",
        action="append",
        default=_listed("CHONGMING_WEB_ALLOWED_HOSTS"),
        metavar="NAME",
        help="a host name the dashboard answers to besides its address and localhost: "
        "dash.example.com, .example.com (a domain), * (any); repeatable "
        "(env CHONGMING_WEB_ALLOWED_HOSTS, comma-separated)",
    )
    p = command("demo", help="run a demo node with sample tasks until Ctrl-C")
    p.add_argument(
        "--duration", type=seconds, default=None, help="stop after S seconds (default: Ctrl-C)"
    )
    return parser
