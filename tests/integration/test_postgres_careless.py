"""A newcomer's mistakes against a real PostgreSQL and PgBouncer: the CLI through a
pooler without ``--pg-pooled``, a node there without ``pooled=True`` (told what to do),
a holder's name too long for a wake-up, dedupe keys of four-byte characters at their
bound, and a password given as a DSN parameter."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from chongming_task import (
    CancellationToken,
    Controller,
    InvalidValue,
    StoreError,
    TaskSnapshot,
    TaskStatus,
)
from chongming_task.limits import MAX_DEDUPE_KEY
from tests.integration.pgbouncer_support import pgbouncer
from tests.integration.postgres_support import drop_schemas, made_schema, require_dsn

pytest.importorskip("psycopg", reason="the [postgres] extra is not installed")

from chongming_task.stores.postgres import PostgresTaskStore


def _noop(token: CancellationToken) -> int:
    return 1


def _sleep(token: CancellationToken) -> None:
    token.sleep(30)


def cli(dsn: str, schema: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI on ``dsn``, given in the environment: a password on the command line is
    refused, as every user of the machine could read it there."""
    return subprocess.run(
        [sys.executable, "-m", "chongming_task", "--pg-schema", schema, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "CHONGMING_DB": dsn},
    )


@pytest.fixture(scope="module")
def bouncer() -> Iterator[str]:
    with pgbouncer(require_dsn(), pool_size=4) as through:
        yield through


@pytest.fixture
def schema() -> Iterator[str]:
    direct = require_dsn()
    name = made_schema(direct)
    yield name
    drop_schemas(direct, [name])


def test_the_cli_works_through_a_pooler_without_a_flag(bouncer: str, schema: str) -> None:
    with Controller(PostgresTaskStore(require_dsn(), schema=schema), owner="direct") as node:
        task_id = node.submit(_noop).task_id
        node.wait_for(task_id, timeout=20)
    for _ in range(3):  # a statement prepared on one server connection is unknown on the next
        for args in (["ps", "--all"], ["show", task_id], ["history", task_id], ["doctor"]):
            result = cli(bouncer, schema, *args)
            assert result.returncode in (0, 3), (args, result.stderr)
            assert "prepared statement" not in result.stderr
    flagged = cli(bouncer, schema, "--pg-pooled", "ps", "--all")
    assert flagged.returncode == 0, flagged.stderr
    assert "poll commands" not in flagged.stderr  # only a node is told that


def test_a_node_through_a_pooler_without_pooled_is_told_to_pass_it(
    bouncer: str, schema: str
) -> None:
    store = PostgresTaskStore(bouncer, schema=schema)
    said = ""
    try:
        with Controller(store, owner="mistaken") as node:
            for _ in range(40):
                try:
                    node.submit(_noop).result(timeout=10)
                except StoreError as exc:
                    said = str(exc)
                    break
                # Or a write queued behind the submits met it first: the node says it.
                said = node.health().store_error or ""
                if said:
                    break
    except StoreError as exc:
        said = said or str(exc)
    finally:
        store.close()
    assert "pass pooled=True" in said and "--pg-pooled" in said, said
    assert "unreachable" not in said  # a setting to mend, not an outage


def test_a_holder_name_too_long_for_a_wake_up_never_refuses_a_command(schema: str) -> None:
    direct = require_dsn()
    store = PostgresTaskStore(direct, schema=schema)
    now = datetime.now(UTC)
    held = TaskSnapshot(
        task_id="feedface" + "0" * 24,
        name="held",
        status=TaskStatus.RUNNING,
        status_version=3,
        created_at=now,
        started_at=now,
        lease_owner="N" * 9000,  # a row written before names were bounded
        lease_until=now + timedelta(hours=1),
    )
    try:
        store.create(held)
    finally:
        store.close()
    result = cli(direct, schema, "pause", held.task_id)
    assert result.returncode == 0, result.stderr
    assert "request accepted" in result.stdout


def test_dedupe_keys_of_four_byte_characters_hold_at_their_bound(schema: str) -> None:
    key = "\U0001f600" * MAX_DEDUPE_KEY  # 2,000 bytes: within an index entry
    with Controller(PostgresTaskStore(require_dsn(), schema=schema), owner="keys") as node:
        first = node.task(_sleep).configure(dedupe_key=key).submit()
        second = node.task(_sleep).configure(dedupe_key=key).submit()
        assert second.task_id == first.task_id
        with pytest.raises(InvalidValue, match="dedupe_key"):
            node.task(_sleep).configure(dedupe_key=key + "x")
        node.cancel(first.task_id)


def test_a_password_given_as_a_parameter_is_never_printed(schema: str) -> None:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    info = conninfo_to_dict(require_dsn())
    password = str(info.pop("password", "") or "")
    host, port, dbname = info.get("host"), info.get("port", 5432), info.get("dbname")
    user = info.get("user", "postgres")
    as_parameter = f"postgresql://{user}@{host}:{port}/{dbname}?password=sekrit-{password}"
    as_words = make_conninfo(**{**info, "password": f"sekrit-{password}"})
    for dsn in (as_parameter, as_words):
        result = cli(dsn, schema, "show", "abcdef")
        assert result.returncode == 1
        assert "sekrit" not in result.stdout + result.stderr, result.stderr
        assert f"{host}:{port}/{dbname}" in result.stderr


def test_the_dashboard_answers_nul_and_reversed_ranges_with_no_500(schema: str) -> None:
    pytest.importorskip("starlette", reason="the [web] extra is not installed")
    from tests.integration.test_web import Web

    direct = require_dsn()
    with Controller(PostgresTaskStore(direct, schema=schema), owner="nul") as node:
        task_id = node.submit(_noop).task_id
        node.wait_for(task_id, timeout=20)
    web = Web(direct, "--pg-schema", schema)
    try:
        for path, code in (
            ("/tasks?status=all&name=%00", 400),
            ("/tasks?status=all&tag=a%00b", 400),
            ("/tasks?status=all&node=%00", 400),
            ("/tasks?status=all&pipeline=abc%00def", 400),
            ("/tasks/abcdef%00", 400),
            ("/pipelines/abcdef%00", 400),
            ("/tasks?status=all&name=%5Bz-a%5D*", 200),
            ("/tasks?status=all&name=%5B!z-a%5D*", 200),
        ):
            status, body = web.get(path)
            assert status == code, (path, status, body[-400:])
        # *[!z-a]noop: a negated empty set is any one character ("..._noop").
        status, body = web.get("/tasks?status=all&name=*%5B!z-a%5Dnoop")
        assert status == 200 and task_id[:12] in body
    finally:
        web.close()
    store = PostgresTaskStore(direct, schema=schema)
    try:  # the library too: NUL matches nothing, never a driver error
        from chongming_task import TaskQuery

        assert store.get("abc\x00") is None
        assert store.query(TaskQuery(name_glob="a\x00*")) == []
    finally:
        store.close()
