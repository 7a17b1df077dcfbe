"""The SQL both SQL stores speak: named statements loaded from their ``queries.sql``,
the ``Dialect`` that spells what a statement cannot say alone, and the statements built
from a ``TaskQuery``, a ``TaskScan`` or a retention cut over it. ``SqlStore``
(``sql_store``) runs them."""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from types import MappingProxyType
from typing import Any, Protocol

from .. import states
from ..errors import StoreError
from ..globs import Glob
from ..globs import parse as parse_glob
from ..model import Failure, TaskQuery, TaskScan, TaskStatus
from . import codec

__all__ = [
    "Dialect",
    "Executor",
    "count_sql",
    "ended_where",
    "json_id_list",
    "load_named",
    "newer_schema",
    "older_schema",
    "one_by_one",
    "query_sql",
    "scan_sql",
    "scan_where",
    "verdicts_of_expired",
]

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$")


def newer_schema(holder: str, found: int, understood: int) -> StoreError:
    """The refusal of a schema a newer release made (``found`` past ``understood``): this
    release could misread its tables or write rows they no longer mean. One wording for
    every store; ``holder`` names the file or the schema."""
    return StoreError(
        f"{holder} has schema version {found}, made by a newer release; this chongming-task "
        f"reads version {understood}: upgrade chongming-task"
    )


def older_schema(holder: str, found: int, understood: int) -> StoreError:
    """The refusal of a schema an older release made (``found`` before ``understood``):
    its tables lack what this release writes, until it is migrated."""
    return StoreError(
        f"{holder} has schema version {found}, made by an older release; this "
        f"chongming-task reads version {understood}: run `chongming-task migrate` (DDL "
        "rights, once)"
    )


def json_id_list(task_ids: Sequence[str]) -> object:
    """A list of task ids as one parameter: JSON text (SQLite's ``json_each``)."""
    return json.dumps(list(task_ids))


@functools.cache  # read once a process: the store and its group commit both use them
def load_named(package: str, filename: str = "queries.sql") -> Mapping[str, str]:
    """The ``-- name: NAME`` blocks of ``filename`` in ``package``, in file order;
    comment lines are dropped, so a block is exactly one statement. Read-only: every
    caller shares the one mapping."""
    text = resources.files(package).joinpath(filename).read_text("utf-8")
    blocks: dict[str, str] = {}
    name: str | None = None
    body: list[str] = []

    def close() -> None:
        if name is not None:
            if name in blocks:
                raise ValueError(f"{filename}: statement {name!r} is named twice")
            blocks[name] = "\n".join(body).strip()

    for line in text.splitlines():
        found = _NAME.match(line)
        if found:
            close()
            name, body = found.group(1), []
        elif name is not None and not line.lstrip().startswith("--"):
            body.append(line)
    close()
    return MappingProxyType(blocks)


Fragment = tuple[str, list[Any]]


class Executor(Protocol):
    """What ``sqlite3.Connection`` and a psycopg cursor both offer."""

    def execute(self, sql: Any, params: Any = ..., /) -> Any: ...

    def executemany(self, sql: Any, params: Any, /) -> Any: ...


def one_by_one(cur: Executor, sql: str, rows: list[list[Any]]) -> list[str]:
    """Run ``sql`` once for each of ``rows``; the first column of what they return."""
    written: list[str] = []
    for row in rows:
        written.extend(r[0] for r in cur.execute(sql, row).fetchall())
    return written


@dataclass(frozen=True, slots=True, kw_only=True)
class Dialect:
    """How one SQL store spells what its statements in ``queries.sql`` cannot say alone:
    the parts of a task query, a list of ids as one parameter, a statement run for many
    rows, and whose clock a node's times are."""

    select: str
    """``SELECT <task columns> FROM tasks``."""
    brief_select: str
    """The same columns for a ``brief`` query: no result, no traceback, a progress
    message of at most ``model.BRIEF_MESSAGE`` characters."""
    placeholder: str
    one_of: Callable[[str, list[Any]], Fragment]
    """``column`` is one of the values."""
    prefix: Callable[[str, str], Fragment]
    """``column`` starts with the text."""
    tag: Callable[[str], Fragment]
    """The tags hold exactly this tag."""
    glob: Callable[[str, Glob], Fragment]
    """``column`` matches the glob (one with a wildcard)."""
    insertion_order: str
    """The column that orders ties by insertion."""
    time: str
    """A time parameter (bound as ``codec.encode_dt`` text)."""
    micros: Callable[[str], str]
    """A time column as whole microseconds since 1970 (an exact integer)."""
    unindexed: Callable[[str], str] = lambda column: column
    """``column`` spelled so that the planner leaves its index alone (SQLite: ``+column``)."""
    fence: bool = False
    """Filter before ordering in a scan's rows query (a subquery the planner keeps): else
    PostgreSQL walks the ``created_at`` index through every row to find a rare few."""
    tasks: str = "tasks"
    """The tasks table, as statements name it (Postgres: qualified by its schema)."""
    transitions: str = "transitions"
    """The trail's table, likewise."""
    trail_of_task: str = "tr.task_id = tasks.task_id"
    """Which rows of the trail (``transitions tr``) are the task's, by its key (SQLite
    keys the trail by ``seq * 16777216 + version``: the task's row of its current
    version, the one a scan reads)."""
    id_list: Callable[[Sequence[str]], object] = json_id_list
    """A list of task ids as one parameter (SQLite: JSON text its ``json_each`` reads;
    PostgreSQL: a ``text[]``)."""
    each_returning: Callable[[Executor, str, list[list[Any]]], list[str]] = one_by_one
    """Run one statement for each of many rows; the first column of what they return
    (PostgreSQL: one pipelined batch, not a round trip a row)."""
    nul_in_text: bool = True
    """Whether text sent to the server may hold NUL (PostgreSQL: no; none is stored
    either, so a filter holding one matches nothing)."""
    clock_in_sql: bool = False
    """Whether the statements write the store's own clock for a node's times (PostgreSQL:
    one clock for every node); else the node's time given is written."""


def query_sql(query: TaskQuery, dialect: Dialect) -> Fragment:
    """The SELECT for a ``TaskQuery``: fixed fragments, values always bound as parameters.
    Every filter is pushed into SQL; an empty status or bucket set matches nothing."""
    where: list[str] = []
    params: list[Any] = []
    p = dialect.placeholder

    def add(fragment: Fragment) -> None:
        where.append(fragment[0])
        params.extend(fragment[1])

    if query.statuses is not None:
        add(dialect.one_of("status", sorted(s.value for s in query.statuses)))
    if query.id_prefix is not None:
        # The range lets the primary key index find the candidates; the prefix test is exact.
        text = query.id_prefix
        if text and ord(text[-1]) < sys.maxunicode:
            add((f"task_id >= {p} AND task_id < {p}", [text, text[:-1] + chr(ord(text[-1]) + 1)]))
        else:  # ends with the last code point: no next one bounds the range
            add((f"task_id >= {p}", [text]))
        add(dialect.prefix("task_id", text))
    if query.name is not None:
        add((f"name = {p}", [query.name]))
    if query.name_prefix is not None:
        add(dialect.prefix("name", query.name_prefix))
    if query.name_glob is not None:
        glob = parse_glob(query.name_glob)
        if glob.exact:
            add((f"name = {p}", [query.name_glob]))
        else:
            if glob.head:
                add(dialect.prefix("name", glob.head))
            add(dialect.glob("name", glob))
    if query.tag is not None:
        add(dialect.tag(query.tag))
    if query.buckets is not None:
        add(dialect.one_of("bucket", sorted(query.buckets)))
    if query.pipeline_run_id is not None:
        add((f"pipeline_run_id = {p}", [query.pipeline_run_id]))
    if query.pipeline_prefix is not None:
        add(dialect.prefix("pipeline_run_id", query.pipeline_prefix))
    if query.dedupe_key is not None:  # SQLite: idx_tasks_dedupe; Postgres scans (schema.sql)
        add((f"dedupe_key = {p}", [query.dedupe_key]))
    if query.owner is not None:
        # Unfinished tasks are few: their status index finds a node's at once, where the
        # owner index would walk every task the node ever ran (SQLite's planner has no
        # statistics to tell; PostgreSQL's does).
        unfinished = query.statuses is not None and query.statuses <= states.NON_TERMINAL
        column = dialect.unindexed("owner") if unfinished else "owner"
        add((f"{column} = {p}", [query.owner]))
    if query.created_until is not None:
        add((f"created_at <= {dialect.time}", [codec.encode_dt(query.created_until)]))
    if query.after is not None:
        at, task_id = query.after
        past = "<" if query.newest_first else ">"
        add((f"(created_at, task_id) {past} ({dialect.time}, {p})", [codec.encode_dt(at), task_id]))
    sql = dialect.brief_select if query.brief else dialect.select
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += (
        " ORDER BY created_at DESC, task_id DESC"
        if query.newest_first
        else " ORDER BY created_at, task_id"
    )
    if query.limit is not None:
        sql += f" LIMIT {p}"
        params.append(query.limit)
    return sql, params


def encoded_tag(tag: str) -> str:
    """A tag as it stands, quoted, in the JSON array ``codec.encode_tags`` writes."""
    return codec.encode_tags([tag])[1:-1]


_COUNT_BY = {
    "status": "status",
    "bucket": "bucket",
    "owner": "owner",
    "lease_owner": "lease_owner",
    "bucket_status": "bucket, status",
}


def count_sql(by: str, statuses: frozenset[TaskStatus] | None, dialect: Dialect) -> Fragment:
    """``SELECT <by>, COUNT(*) ... GROUP BY <by>`` (``by`` one of a fixed set of columns)."""
    columns = _COUNT_BY.get(by)
    if columns is None:
        raise ValueError(f"cannot count tasks by {by!r}")
    sql = f"SELECT {columns}, COUNT(*) FROM {dialect.tasks}"
    params: list[Any] = []
    if statuses is not None:
        where, params = dialect.one_of("status", sorted(s.value for s in statuses))
        sql += f" WHERE {where}"
    return f"{sql} GROUP BY {columns}", params


def scan_where(scan: TaskScan, dialect: Dialect) -> Fragment:
    """The ``WHERE`` condition (without the keyword) of a ``TaskScan`` over ``tasks``."""
    where: list[str] = []
    params: list[Any] = []
    t = dialect.time

    def add(fragment: Fragment) -> None:
        where.append(fragment[0])
        params.extend(fragment[1])

    add(dialect.one_of("status", sorted(s.value for s in scan.statuses)))
    if scan.buckets is not None:
        add(dialect.one_of("bucket", sorted(scan.buckets)))
    if scan.outside is not None:
        inside, values = dialect.one_of("bucket", sorted(scan.outside))
        add((f"(bucket IS NULL OR NOT ({inside}))", values))
    if scan.lease_expired_at is not None:
        expired = codec.encode_dt(scan.lease_expired_at)
        add((f"(lease_until IS NULL OR lease_until <= {t})", [expired]))
    if scan.unchanged_since is not None:
        cut = codec.encode_dt(scan.unchanged_since)
        # created_at first (indexed, and never after the last change), then the trail's
        # row for the current version: a primary-key lookup per remaining task.
        add(
            (
                f"created_at <= {t} AND COALESCE((SELECT tr.at FROM {dialect.transitions} tr "
                f"WHERE {dialect.trail_of_task} AND tr.version = tasks.status_version), "
                f"created_at) <= {t}",
                [cut, cut],
            )
        )
    return " AND ".join(where), params


def scan_sql(scan: TaskScan, dialect: Dialect) -> tuple[Fragment, Fragment]:
    """The ``COUNT`` and the ``SELECT`` (oldest first, limited) of a ``TaskScan``."""
    where, params = scan_where(scan, dialect)
    count = (f"SELECT COUNT(*) FROM {dialect.tasks} WHERE {where}", list(params))
    order = f"ORDER BY created_at, {dialect.insertion_order}"
    if dialect.fence:
        # The subquery is named tasks, so the dialect's column list applies unchanged.
        fenced = f"(SELECT * FROM {dialect.tasks} WHERE {where} OFFSET 0) AS tasks"
        rows_sql = f"{dialect.select.replace(' FROM ' + dialect.tasks, ' FROM ' + fenced)} {order}"
    else:
        rows_sql = f"{dialect.select} WHERE {where} {order}"
    rows_params = list(params)
    if scan.limit is not None:
        rows_sql += f" LIMIT {dialect.placeholder}"
        rows_params.append(scan.limit)
    return count, (rows_sql, rows_params)


def ended_where(
    dialect: Dialect,
    before: datetime,
    statuses: frozenset[TaskStatus],
    buckets: frozenset[int] | None,
) -> Fragment:
    """The condition of the finished tasks in ``statuses`` (and ``buckets``) that ended
    before ``before``."""
    at = codec.encode_dt(before)
    # The status index would give every finished task, to be sorted by age (SQLite took
    # 0.29 s a batch at a million tasks): the created_at range is the way in.
    in_status, params = dialect.one_of(
        dialect.unindexed("status"), sorted(s.value for s in statuses)
    )
    where = [f"created_at < {dialect.time}", f"ended_at < {dialect.time}", in_status]
    params = [at, at, *params]
    if buckets is not None:
        in_bucket, more = dialect.one_of("bucket", sorted(buckets))
        where.append(in_bucket)
        params += more
    return " AND ".join(where), params


def verdicts_of_expired(
    c: Executor,
    scan: TaskScan,
    dialect: Dialect,
    owners_sql: str,
    verdict: Callable[[str | None], tuple[Failure, str]],
) -> tuple[Fragment, list[tuple[str, str | None, str]]]:
    """What both SQL stores' ``mark_expired_lost`` do first: check the scan asks only
    for moves the state table allows, build its condition, and give each lease owner of
    the expired tasks its verdict as a row (owner, '' for none; failure JSON; reason)."""
    if scan.statuses - states.LOSABLE:
        raise ValueError("reconcile marks lost only what the state table allows")
    where, params = scan_where(scan, dialect)
    owners = [owner for (owner,) in c.execute(owners_sql.replace("{scan}", where), params)]
    rows = []
    for owner in owners:
        failure, reason = verdict(owner)
        rows.append((owner or "", codec.encode_failure(failure), reason))
    return (where, params), rows
