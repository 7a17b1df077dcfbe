"""Every bound on what a user hands over, in one table: names, keys, texts, counts and
durations. A value past its bound is refused where it is handed over (``InvalidValue``
in the library, a one-line error in the CLI, a 400 in the dashboard), never on a write
path where it would cost a task. ``docs/security.md`` prints this table.

Why these numbers: PostgreSQL refuses a B-tree index entry over 2,704 bytes (the dedupe
key and the node name are indexed; a character is up to 4 bytes of UTF-8), a
``NOTIFY`` payload over 8,000 bytes (a command's wake-up carries the holder's node name),
and a channel name over 63 bytes (the schema name is part of two). The rest bound what
one request or one command line may ask of a store and of memory.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "LIMITS",
    "MAX_ACTOR",
    "MAX_BUCKETS",
    "MAX_BUCKET_KEY",
    "MAX_CONCURRENCY_KEY",
    "MAX_COUNT",
    "MAX_DEDUPE_KEY",
    "MAX_DURATION",
    "MAX_FAILURE_MESSAGE",
    "MAX_NODE_KEY",
    "MAX_OWNER",
    "MAX_PIPELINE_NAME",
    "MAX_PROGRESS_MESSAGE",
    "MAX_REASON",
    "MAX_SCHEDULE_NAME",
    "MAX_SCHEMA_NAME",
    "MAX_TAG",
    "MAX_TAGS",
    "MAX_TASK_NAME",
    "MAX_TRACEBACK",
    "MAX_TRACE_CONTEXT",
    "MIN_REMOTE_TOKEN",
    "Limit",
]


@dataclass(frozen=True, slots=True)
class Limit:
    """One bound: what it bounds, how far, in what unit, and why there."""

    what: str
    value: int
    unit: str
    why: str


MAX_TASK_NAME = 500
MAX_TAG = 250
MAX_TAGS = 64
MAX_BUCKET_KEY = 500
MAX_DEDUPE_KEY = 500
MAX_CONCURRENCY_KEY = 500
MAX_OWNER = 200
MAX_SCHEDULE_NAME = 200
MAX_PIPELINE_NAME = 200
MAX_NODE_KEY = 200
MAX_REASON = 4000
MAX_ACTOR = 200
MAX_PROGRESS_MESSAGE = 4000
MAX_FAILURE_MESSAGE = 4000
MAX_TRACEBACK = 16_000
MAX_TRACE_CONTEXT = 512
MAX_BUCKETS = 65_536
MAX_SCHEMA_NAME = 40
MAX_COUNT = 1_000_000_000
MAX_DURATION = 100 * 366 * 86_400
MIN_REMOTE_TOKEN = 16

LIMITS: tuple[Limit, ...] = (
    Limit("task name", MAX_TASK_NAME, "characters", "shown in every list"),
    Limit("tag", MAX_TAG, "characters", "a schedule's name makes one of its tags"),
    Limit("tags of one task", MAX_TAGS, "tags", "stored with every task"),
    Limit("bucket key", MAX_BUCKET_KEY, "characters", "stored with every task"),
    Limit("dedupe key", MAX_DEDUPE_KEY, "characters", "indexed: PostgreSQL's 2,704-byte entry"),
    Limit("concurrency key", MAX_CONCURRENCY_KEY, "characters", "stored with every task"),
    Limit(
        "node name (owner)",
        MAX_OWNER,
        "characters",
        "indexed, and a command's wake-up carries it (PostgreSQL: 8,000-byte payload)",
    ),
    Limit("schedule name", MAX_SCHEDULE_NAME, "characters", "a tag of every firing"),
    Limit("pipeline name", MAX_PIPELINE_NAME, "characters", "shown in lists"),
    Limit("pipeline node key", MAX_NODE_KEY, "characters", "shown in the graph"),
    Limit("reason of a control", MAX_REASON, "characters", "stored in the trail"),
    Limit("actor of a control", MAX_ACTOR, "characters", "stored in the trail"),
    Limit("progress message", MAX_PROGRESS_MESSAGE, "characters", "written at each checkpoint"),
    Limit(
        "failure message (kept)",
        MAX_FAILURE_MESSAGE,
        "characters",
        "made from an exception: cut, never refused",
    ),
    Limit("traceback (kept)", MAX_TRACEBACK, "characters", "its end is kept: where it was raised"),
    Limit("trace context (kept)", MAX_TRACE_CONTEXT, "characters", "tracestate past it is dropped"),
    Limit("number of buckets", MAX_BUCKETS, "buckets", "bucket flags expand to sets"),
    Limit(
        "PostgreSQL schema name",
        MAX_SCHEMA_NAME,
        "characters",
        "two 63-byte channel names are made of it",
    ),
    Limit("a count (--limit, --keep, ...)", MAX_COUNT, "", "a store's integer"),
    Limit("a duration (--older-than, ...)", MAX_DURATION, "seconds", "100 years: a date's range"),
    Limit(
        "dashboard token off loopback",
        MIN_REMOTE_TOKEN,
        "characters at least",
        "guessable otherwise",
    ),
)
"""The table ``docs/security.md`` shows, in this order."""
