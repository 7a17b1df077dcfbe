"""How the Postgres store tells the driver's errors apart and words them: an outage
from a statement's fault, a refusal from a passing one. Reached only with the driver
installed (``postgres.py`` imports it with psycopg)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import PoolTimeout

from ...errors import StoreError, StoreUnavailable

__all__ = ["TRANSIENT", "first_line", "is_outage", "server_reason", "translated"]

TRANSIENT = re.compile(r"starting up|shutting down|too many (clients|connections)|recovery")
"""Refusals that pass: wait for them like an outage."""
POOLED = re.compile(r'prepared statement "_pg3_\w*" (already exists|does not exist|requires)')
"""psycopg's prepared statements meeting a transaction pooler, which hands each
transaction to any server connection: a statement prepared on one is unknown (or already
known, under another statement's name) on the next."""
POOLER_HINT = (
    "this looks like a pooler in transaction mode (PgBouncer): pass pooled=True "
    "(CLI --pg-pooled, env CHONGMING_PG_POOLED=1)"
)


_HINTS = (
    (
        re.compile(r"no password supplied"),
        "the server asks for a password and none was given: put it in the DSN "
        "(postgresql://user:PASSWORD@host/db), in PGPASSWORD, or in ~/.pgpass",
    ),
    (
        re.compile(r"password authentication failed"),
        "the password was refused: check the DSN's, PGPASSWORD or ~/.pgpass",
    ),
    (
        re.compile(r"Connection refused"),
        "nothing listens there (connection refused): is the server running, on this host and port?",
    ),
    (
        re.compile(r"could not translate host name|Name or service not known"),
        "no such host: check the DSN's host name",
    ),
)


def refusal(exc: BaseException, *, away_passes: bool) -> str | None:
    """What is wrong, in words a user acts on, for a first connection that fails in a
    way waiting will not mend (a missing or wrong password, no such host, and nothing
    listening unless ``away_passes``: a server restarting); ``None`` for the rest (a
    timeout, a server starting up)."""
    text = str(exc)
    for pattern, hint in _HINTS:
        if pattern.search(text):
            return None if away_passes and "Connection refused" in text else hint
    if "FATAL:" in text and not TRANSIENT.search(text):  # the server answering: a refusal
        return f"the server refused the connection: {server_reason(exc)}"
    return None


def server_reason(exc: BaseException) -> str:
    """The reason in a connection error, without libpq's "connection to server at ...
    failed:" preamble: ``role "nobody" does not exist``, ``Connection refused``."""
    text = " ".join(str(exc).split())
    for marker in ("FATAL: ", "failed: "):
        if marker in text:
            text = text.rsplit(marker, 1)[1]
    return text.split(" Is the server running", 1)[0].strip()


def is_outage(exc: BaseException) -> bool:
    """A fault of the connection, not of the statement: no connection from the pool, a
    client-side connection error (no SQLSTATE), a connection exception (class 08) or
    the server shutting down or starting (57P01-57P03). A cancelled query is not one."""
    if isinstance(exc, PoolTimeout):
        return True
    sqlstate = getattr(exc, "sqlstate", None)
    return sqlstate is None or sqlstate.startswith(("08", "57P"))


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextlib.contextmanager
def translated(what: str, where: str, schema: str, went_down: Callable[[], None]) -> Iterator[None]:
    """The driver's errors as the store's: a missing schema says how to make it, an
    outage (``went_down()`` is told) is ``StoreUnavailable``, prepared statements meeting
    a transaction pooler say to pass ``pooled=True``, text that is not UTF-8 says nothing
    was written, anything else is a ``StoreError`` naming ``what`` failed."""
    try:
        yield
    except (pg_errors.UndefinedTable, pg_errors.InvalidSchemaName):
        raise StoreError(
            f"no chongming-task schema {schema!r} at {where}: create it once "
            f"with `chongming-task --db DSN migrate` (a role with DDL rights)"
        ) from None
    except (psycopg.Error, PoolTimeout) as exc:
        if POOLED.search(str(exc)):  # a setting to mend, not an outage to wait out
            raise StoreError(
                f"PostgreSQL {what} failed at {where}: {first_line(exc)}: {POOLER_HINT}"
            ) from exc
        if isinstance(exc, psycopg.OperationalError | PoolTimeout) and is_outage(exc):
            went_down()
            raise StoreUnavailable(
                f"PostgreSQL at {where} unreachable during {what}: {first_line(exc)}"
            ) from exc
        raise StoreError(f"PostgreSQL {what} failed at {where}: {first_line(exc)}") from exc
    except UnicodeEncodeError as exc:
        raise StoreError(
            f"PostgreSQL {what} at {where}: a value is not valid UTF-8 text "
            f"({exc.object[exc.start : exc.end]!r}); nothing was written"
        ) from exc
