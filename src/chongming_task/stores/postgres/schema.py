"""The Postgres store's schema: its version, the DDL of ``schema.sql`` for one schema
name, and the advisory lock that lets nodes create it at the same time."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from importlib import resources
from typing import Any

from ...errors import StoreError
from ...model import BRIEF_MESSAGE
from .. import codec
from ..dsn import IDENTIFIER, check_schema_name
from ..sql import Dialect, Executor, encoded_tag, newer_schema, older_schema

__all__ = [
    "IDENTIFIER",
    "SCHEMA_VERSION",
    "check_schema_name",
    "dialect_in",
    "older_schema_on",
    "schema_ddl",
    "schema_lock_key",
    "statements_in",
    "stored_version",
]

SCHEMA_VERSION = 6
"""The version of the tables this release makes and reads (``schema_version``). A schema
made before that table existed holds the tables of version 1. 2: ``nodes.health`` and
``late_reports``; 3: the option columns of ``tasks`` (``run_at``, ``priority``,
``dedupe_key``, ``dedupe_window``, ``concurrency_key``); 4: ``tasks.trace_context``;
5: ``holds``; 6: ``tasks.outcome_preview``."""


_SCHEMA_LOCK_CLASS = 0x63686D74  # "chmt": the first key of chongming-task's advisory locks


def schema_lock_key(schema: str) -> tuple[int, int]:
    """The advisory lock ``create_schema`` holds for ``schema``: two int4 keys."""
    crc = zlib.crc32(schema.encode())
    return _SCHEMA_LOCK_CLASS, crc - (1 << 32) if crc >= 1 << 31 else crc


def schema_ddl(schema: str) -> bytes:
    """schema.sql for ``schema`` (a validated identifier), as one query."""
    ddl = resources.files(__package__).joinpath("schema.sql").read_text("utf-8")
    return ddl.replace("{schema}", schema).replace("{version}", str(SCHEMA_VERSION)).encode()


def stored_version(conn: Any, sql: Mapping[str, str]) -> int | None:
    """The version of the schema ``sql`` names (``statements_in``): ``None`` if it
    is not made yet (migrate makes it); 1 for tables made before the version table."""
    from psycopg import errors

    try:
        row = conn.execute(sql["schema_version"]).fetchone()
    except (errors.UndefinedTable, errors.InvalidSchemaName):
        made = conn.execute(sql["tasks_table"]).fetchone()
        return 1 if made is not None and made[0] is not None else None
    return None if row is None else int(row[0])


def older_schema_on(conn: Any, sql: Mapping[str, str], holder: str) -> StoreError | None:
    """Refuse (raise) a schema a newer release made: this one could misread its tables
    or write rows they no longer mean. The error to raise until ``migrate`` for a
    schema an older release made, else ``None``."""
    found = stored_version(conn, sql)
    if found is not None and found > SCHEMA_VERSION:
        raise newer_schema(holder, found, SCHEMA_VERSION)
    if found is not None and found < SCHEMA_VERSION:
        return older_schema(holder, found, SCHEMA_VERSION)
    return None


def statements_in(sql: Mapping[str, str], schema: str) -> dict[str, str]:
    """The named statements for ``schema`` (a validated identifier): every table is named
    with its schema, so a connection needs no ``search_path`` (no session state)."""
    return {name: text.replace("{schema}", schema) for name, text in sql.items()}


_JSON_COLUMNS = frozenset({"tags", "progress", "failure", "outcome"})
# The task columns as the codec reads them: JSONB as text.
_TASK_SELECT = ", ".join(f"{c}::text" if c in _JSON_COLUMNS else c for c in codec.TASK_COLUMNS)
# A list's columns: no result, no traceback, a progress message cut (TaskQuery.brief).
# Columns left unselected are never read from TOAST.
_MESSAGE = "progress->>'message'"
_BRIEF = {
    "outcome": "NULL::text",
    "failure": "(failure - 'traceback')::text",
    "progress": f"(CASE WHEN length({_MESSAGE}) > {BRIEF_MESSAGE} THEN jsonb_set(progress, "
    f"'{{message}}', to_jsonb(left({_MESSAGE}, {BRIEF_MESSAGE}))) ELSE progress END)::text",
}
_BRIEF_SELECT = ", ".join(
    _BRIEF.get(c, f"{c}::text" if c in _JSON_COLUMNS else c) for c in codec.TASK_COLUMNS
)


def pipelined(cur: Executor, sql: str, rows: list[list[Any]]) -> list[str]:
    """One pipelined batch for the renewals or activity of many tasks: a supervisor pass
    renewing a hundred leases was a hundred round trips."""
    cur.executemany(sql, rows, returning=True)  # type: ignore[call-arg]  # a psycopg cursor
    written: list[str] = []
    while True:
        written.extend(row[0] for row in cur.fetchall())  # type: ignore[attr-defined]
        if not cur.nextset():  # type: ignore[attr-defined]
            return written


def dialect_in(schema: str) -> Dialect:
    """How the store spells what its statements cannot say alone in ``schema`` (a
    validated identifier)."""
    return Dialect(
        select=f"SELECT {_TASK_SELECT} FROM {schema}.tasks",
        brief_select=f"SELECT {_BRIEF_SELECT} FROM {schema}.tasks",
        placeholder="%s",
        one_of=lambda column, values: (f"{column} = ANY(%s)", [values]),
        prefix=lambda column, text: (f"starts_with({column}, %s)", [text]),
        glob=lambda column, glob: (f"{column} ~ %s", [glob.regex()]),
        tag=lambda tag: ("tags @> %s::jsonb", [f"[{encoded_tag(tag)}]"]),
        insertion_order="seq",
        time="%s::timestamptz",
        micros=lambda column: f"(extract(epoch FROM {column}) * 1000000)::bigint",
        fence=True,
        tasks=f"{schema}.tasks",
        transitions=f"{schema}.transitions",
        id_list=list,  # a text[]
        nul_in_text=False,
        each_returning=pipelined,
        clock_in_sql=True,  # the server's clock, read by the statement: one for every node
    )
