"""What the two SQL stores share: named statements loaded from ``.sql`` files, and the
one ``TaskQuery`` to ``SELECT`` builder, written once over a small dialect."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ..model import TaskQuery
from . import codec

__all__ = ["Dialect", "load_named", "query_sql"]

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$")


def load_named(filename: str) -> dict[str, str]:
    """The ``-- name: NAME`` blocks of ``filename`` (beside this module), in file order;
    comment lines are dropped, so a block is exactly one statement."""
    text = resources.files(__package__).joinpath(filename).read_text("utf-8")
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
    return blocks


Fragment = tuple[str, list[Any]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Dialect:
    """How one SQL store spells the parts of a task query."""

    select: str
    """``SELECT <task columns> FROM tasks``."""
    placeholder: str
    one_of: Callable[[str, list[Any]], Fragment]
    """``column`` is one of the values."""
    prefix: Callable[[str], Fragment]
    """``name`` starts with the text."""
    tag: Callable[[str], Fragment]
    """The tags hold exactly this tag."""
    insertion_order: str
    """The column that orders ties by insertion."""


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
    if query.name is not None:
        add((f"name = {p}", [query.name]))
    if query.name_prefix is not None:
        add(dialect.prefix(query.name_prefix))
    if query.tag is not None:
        add(dialect.tag(query.tag))
    if query.buckets is not None:
        add(dialect.one_of("bucket", sorted(query.buckets)))
    if query.pipeline_run_id is not None:
        add((f"pipeline_run_id = {p}", [query.pipeline_run_id]))
    sql = dialect.select
    if where:
        sql += " WHERE " + " AND ".join(where)
    tie = dialect.insertion_order
    sql += (
        f" ORDER BY created_at DESC, {tie} DESC"
        if query.newest_first
        else f" ORDER BY created_at, {tie}"
    )
    if query.limit is not None:
        sql += f" LIMIT {p}"
        params.append(query.limit)
    return sql, params


def encoded_tag(tag: str) -> str:
    """A tag as it stands, quoted, in the JSON array ``codec.encode_tags`` writes."""
    return codec.encode_tags([tag])[1:-1]
