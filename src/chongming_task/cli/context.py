"""What every command needs: validated bucket flags, a lazily opened store, output."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import socket
import sys
from dataclasses import replace
from datetime import datetime
from typing import Any

from ..control import StoreControl
from ..errors import ConfigurationError
from ..lookup import find_pipeline_run, find_task, with_held
from ..lookup import holds_of as held_in
from ..model import TaskQuery, TaskSnapshot, TaskStatus
from ..node.controller import Controller
from ..policies import DEFAULT_NUM_BUCKETS, BucketPolicy, parse_buckets
from ..states import NON_TERMINAL
from ..stores import is_postgres_dsn, open_store
from ..stores.capabilities import Capabilities
from ..stores.dsn import check_schema_name, check_target, shown_dsn
from ..stores.protocol import TaskStore
from ..text import json_for_terminal, printable
from .parser import PROG, UsageError

__all__ = [
    "Context",
    "find_tasks",
    "get_task",
    "holds_of",
    "pipeline_run",
    "program_words",
    "task_queries",
]


class Context:
    """What every command needs: validated buckets and a lazily opened store."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.num_buckets_given = args.num_buckets is not None
        """Whether a bucket count was given (flag or env): else the fleet checks read the
        one the live nodes declared (``fleet.examine``)."""
        num = args.num_buckets if args.num_buckets is not None else DEFAULT_NUM_BUCKETS
        try:
            check_target(args.db)
            if args.pg_schema is not None:
                check_schema_name(args.pg_schema)
            self.policy = BucketPolicy(num)
            self.owned: frozenset[int] | None = (
                None if not args.owned_buckets else parse_buckets(args.owned_buckets, num)
            )
            for option in ("bucket",):
                values = getattr(args, option, None)
                if values:
                    self.policy.validate(values)
        except ConfigurationError as exc:
            raise UsageError(str(exc)) from None
        self._store: TaskStore | None = None

    @property
    def db(self) -> str:
        return str(self.args.db)

    @property
    def shown_db(self) -> str:
        """The --db value safe to print (a DSN's password is never echoed)."""
        return shown_dsn(self.db) if is_postgres_dsn(self.db) else self.db

    def where(self) -> str:
        """The store, as a person reads it: an absolute path or a DSN without password."""
        return self.shown_db if is_postgres_dsn(self.db) else os.path.abspath(self.db)

    def command_line(self, *args: str) -> str:
        """A command that works pasted into another terminal, in any directory: this
        program as it can be found from there, and this store by an absolute path."""
        words = [*program_words(), "--db", self.where()]
        if self.args.pg_schema:
            words += ["--pg-schema", self.args.pg_schema]
        if self.args.pg_pooled:
            words += ["--pg-pooled"]
        return shlex.join([*words, *args])

    def store(self, *, create: bool = False, **postgres: Any) -> TaskStore:
        """The store ``--db`` names, opened once; ``postgres``: ``open_store``'s
        ``pool_size`` and ``application_name`` for a command that holds the store long
        (the dashboard), taken at the first call."""
        if self._store is None:
            # Only the commands that create (migrate, and the nodes run and demo) upgrade
            # an older file: a node of the older release may still be using it.
            self._store = open_store(
                self.db,
                create=create,
                schema=self.args.pg_schema,
                pooled=self.args.pg_pooled,
                listen_dsn=self.args.pg_listen_dsn,
                upgrade=create,
                # A command says at once that nothing listens; a node (demo, web) waits.
                wait_for_server=self.args.command in ("demo", "web"),
                # A command runs a handful of statements: preparing them gains nothing,
                # and without it a pooler in transaction mode carries them unflagged.
                prepare=None if self.args.command == "demo" else False,
                durability=self.args.sqlite_durability,
                **postgres,
            )
        return self._store

    def now(self) -> datetime:
        """Now by the store's clock where it has one (ages are judged by it)."""
        return Capabilities(self.store()).now()

    @property
    def owner(self) -> str:
        """Who this command acts as: in the trail and in its commands' ``issued_by``."""
        return f"cli:{socket.gethostname()}:{os.getpid()}"

    def control(self) -> StoreControl:
        """Controls sent through the store: an operator tool is no node."""
        return StoreControl(self.store(), owner=self.owner)

    def controller(self) -> Controller:
        """A node for this command's buckets (``reconcile``): it acts for nodes and never
        takes their commands."""
        return Controller(
            self.store(),
            owner=self.owner,
            num_buckets=self.policy.num_buckets,
            owned_buckets=self.owned,
            poll_commands=False,
        )

    def close(self) -> None:
        if self._store is not None:
            self._store.close()

    def emit(self, data: Any, text: str) -> None:
        """``data`` as JSON with ``--json``, else ``text``; neither can carry a control
        character to the terminal (``_text.printable``)."""
        if self.args.json:
            print(json_for_terminal(json.dumps(data, ensure_ascii=False, indent=2)))
        else:
            print(printable(text, lines=True))


def program_words() -> list[str]:
    """How to run this program from another terminal: through ``uv run --project`` when
    it runs in a uv project's environment, by name when that name is on ``PATH``, else
    as ``python -m`` with this interpreter."""
    venv = os.environ.get("VIRTUAL_ENV")
    if os.environ.get("UV") and venv and os.path.isfile(os.path.join(venv, "..", "pyproject.toml")):
        return ["uv", "run", "--project", os.path.dirname(os.path.abspath(venv)), PROG]
    found = shutil.which(PROG)
    if found and os.path.dirname(found) == os.path.dirname(sys.executable):
        return [PROG]
    return [sys.executable, "-m", "chongming_task"]


def task_queries(ctx: Context) -> list[TaskQuery]:
    """The store queries the filter flags make: one per ``--name`` and ``--tag`` given
    (every one is taken, as ``--status``'s are: a task is selected when it matches any
    of the names and any of the tags); one query where each is given at most once."""
    a = ctx.args
    buckets: frozenset[int] | None = frozenset(a.bucket) if a.bucket else None
    if a.mine:
        if ctx.owned is None:
            raise UsageError("--mine needs --owned-buckets (or CHONGMING_OWNED_BUCKETS)")
        buckets = ctx.owned if buckets is None else buckets & ctx.owned
    statuses: frozenset[TaskStatus] | None = None
    if a.status:
        statuses = frozenset(TaskStatus(s) for s in a.status)
    elif not a.all:
        statuses = NON_TERMINAL
    tags: list[str | None] = list(dict.fromkeys(a.tag or [None]))
    if a.carrier is not None:  # a carrier's tasks carry its name as a tag
        if tags != [None] and tags != [a.carrier]:
            raise UsageError(f"--carrier {a.carrier} selects the tag {a.carrier}: not with --tag")
        tags = [a.carrier]
    base = TaskQuery(
        statuses=statuses,
        buckets=buckets,
        pipeline_run_id=pipeline_run(ctx, a.pipeline),
        owner=a.node,
        dedupe_key=a.dedupe_key,
        created_until=None if a.older_than is None else ctx.now() - a.older_than,
        limit=a.limit or None,  # --limit 0: all of them
        newest_first=True,
        brief=True,  # a list: no results, no tracebacks (show has them)
    )
    names: list[str | None] = list(dict.fromkeys(a.name or [None]))
    # An exact name is the glob without wildcards.
    return [replace(base, name_glob=name, tag=tag) for name in names for tag in tags]


def pipeline_run(ctx: Context, given: str | None) -> str | None:
    """The pipeline run ``--pipeline`` names: its id or a unique prefix of 6+ characters
    (a name that matches nothing selects nothing)."""
    if given is None:
        return None
    return find_pipeline_run(ctx.store(), given) or given


def find_tasks(ctx: Context, queries: list[TaskQuery] | None = None) -> list[TaskSnapshot]:
    """The tasks the filter flags select (``--name`` is a glob), or ``queries`` (their
    union, newest first, at most their limit); with ``paused`` among the statuses, the
    tasks a pause holds before their start too."""
    queries = task_queries(ctx) if queries is None else queries
    store = ctx.store()
    caps = Capabilities(store)
    if len(queries) == 1:
        return with_held(caps, queries[0], store.query(queries[0]))
    found: dict[str, TaskSnapshot] = {}
    for query in queries:
        for s in with_held(caps, query, store.query(query)):
            found.setdefault(s.task_id, s)
    union = sorted(found.values(), key=lambda s: s.created_at, reverse=True)
    limit = queries[0].limit
    return union if limit is None else union[:limit]


def holds_of(ctx: Context, snapshots: list[TaskSnapshot]) -> dict[str, datetime]:
    """Which of ``snapshots`` a pause holds before their start, and since when."""
    return held_in(Capabilities(ctx.store()), snapshots)


def get_task(ctx: Context, given: str) -> TaskSnapshot:
    """The task ``given`` names: a full id or a unique prefix (``find_task``)."""
    return find_task(ctx.store(), given, ctx.shown_db)
