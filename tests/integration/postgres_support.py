"""Finding the test server: skip visibly without a DSN on a user's machine, fail in CI."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest

ENV = "CHONGMING_TEST_POSTGRES"


NO_SERVER_REASON: str | None = None
"""Why this test run has no PostgreSQL (set by tests/conftest.py when it could not start a
throwaway cluster)."""


def password_to_environment() -> None:
    """Move a password out of the test DSN into ``PGPASSWORD`` (libpq reads it there),
    once a session: the CLI refuses a password on its command line, which every user of
    the machine can read, and the tests run the CLI as users do."""
    dsn = os.environ.get(ENV)
    if not dsn or dsn == "none":
        return
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    info = conninfo_to_dict(dsn)
    password = info.pop("password", None)
    if not password:
        return
    os.environ["PGPASSWORD"] = str(password)
    parts = urlsplit(dsn)
    if parts.scheme in ("postgresql", "postgres") and parts.password is not None:
        netloc = parts.netloc.rsplit("@", 1)[1]
        user = f"{parts.username}@" if parts.username else ""
        os.environ[ENV] = urlunsplit(parts._replace(netloc=user + netloc))
    else:
        os.environ[ENV] = make_conninfo(**{k: str(v) for k, v in info.items()})


def require_dsn() -> str:
    dsn = os.environ.get(ENV)
    if not dsn or dsn == "none":
        if os.environ.get("CI"):
            pytest.fail(f"CI must provide {ENV}: Postgres tests may not be skipped there")
        why = f"{NO_SERVER_REASON}; " if NO_SERVER_REASON else ""
        pytest.skip(f"{why}set {ENV}=postgresql://user@host:5432/db to run the Postgres tests")
    try:
        import psycopg

        with psycopg.connect(dsn, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:  # a DSN that was given but does not work is a failure
        pytest.fail(f"{ENV} is set but the server is unreachable: {exc}")
    return dsn


def new_schema() -> str:
    return f"chongming_test_{secrets.token_hex(4)}"


def drop_schemas(dsn: str, schemas: list[str]) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        for schema in schemas:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # generated names only


@pytest.fixture(scope="module")
def pg_dsn() -> str:
    return require_dsn()


@pytest.fixture
def schemas(pg_dsn: str) -> Iterator[list[str]]:
    """Schemas a test creates; all dropped afterwards."""
    made: list[str] = []
    yield made
    drop_schemas(pg_dsn, made)


def made_schema(dsn: str) -> str:
    """A new schema with chongming-task's tables in it (drop it with ``drop_schemas``)."""
    from chongming_task.stores.postgres import PostgresTaskStore

    name = new_schema()
    store = PostgresTaskStore(dsn, schema=name)
    store.create_schema()
    store.close()
    return name


@pytest.fixture
def schema(pg_dsn: str) -> Iterator[str]:
    """One ready schema for the test, dropped afterwards."""
    name = made_schema(pg_dsn)
    yield name
    drop_schemas(pg_dsn, [name])


def listening(dsn: str, application_name: str) -> bool:
    """Whether a connection under ``application_name`` has run its ``LISTEN`` (the last
    statement a listening connection ran, seen by the server)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
            " AND query LIKE 'LISTEN %%'",
            [application_name],
        ).fetchone()
    assert row is not None
    return int(row[0]) > 0


def server_connections(dsn: str, application_name: str) -> int:
    """How many connections the server holds under ``application_name`` now."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
            [application_name],
        ).fetchone()
    assert row is not None
    return int(row[0])
