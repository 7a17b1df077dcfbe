"""Nodes sharing one PostgreSQL store end to end: control across processes, reconcile by
bucket, the CLI on a DSN. (Server outages: test_postgres_outage.py, on a throwaway
cluster: a test never stops the server it was given.)"""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from chongming_task import Controller, TaskSnapshot, TaskStatus
from chongming_task.policies import BucketPolicy
from chongming_task.stores.postgres import PostgresTaskStore
from tests.conftest import wait_until
from tests.integration.postgres_support import (
    drop_schemas,
    new_schema,
    pg_dsn,
    schema,
    server_connections,
)
from tests.integration.test_cross_process import Node

__all__ = ["pg_dsn", "schema"]
S = TaskStatus
POLICY = BucketPolicy(64)


def key_in(low: int, high: int, salt: str = "") -> str:
    return next(
        k for k in (f"{salt}k{i}" for i in range(10_000)) if low <= POLICY.bucket_for(k) <= high
    )


def test_two_nodes_on_postgres_control_each_other_and_reconcile_their_own_buckets(
    pg_dsn: str, schema: str
) -> None:
    a = Node(
        pg_dsn,
        "--schema",
        schema,
        "--owner",
        "node-a",
        "--owned",
        "0-31",
        "--submit",
        f"loop@{key_in(0, 31)}",
    )
    b = Node(
        pg_dsn,
        "--schema",
        schema,
        "--owner",
        "node-b",
        "--owned",
        "32-63",
        "--submit",
        f"loop@{key_in(32, 63)}",
    )
    try:
        (task_a,), (task_b,) = a.task_ids, b.task_ids
        # Node B, in its own process, controls node A's task through the store.
        console = Controller(PostgresTaskStore(pg_dsn, schema=schema), owner="console")
        wait_until(lambda: console.get(task_a).status is S.RUNNING)
        wait_until(lambda: console.get(task_b).status is S.RUNNING)
        assert console.pause(task_a).accepted
        console.wait_for(task_a, lambda s: s.status is S.PAUSED, timeout=10)
        assert console.resume(task_a).accepted
        console.wait_for(task_a, lambda s: s.status is S.RUNNING, timeout=10)
        assert console.stop(task_a).accepted
        assert console.wait_for(task_a, timeout=10).status is S.STOPPED
        # Orphans in both halves; each half's reconcile touches only its own.
        store = console.store
        past = datetime.now(UTC) - timedelta(minutes=5)
        orphans = {}
        for low, high in ((0, 31), (32, 63)):
            key = key_in(low, high, salt="orphan")
            orphans[low] = f"orphan-{low}"
            store.create(
                TaskSnapshot(
                    task_id=orphans[low],
                    name="orphan",
                    status=S.RUNNING,
                    status_version=3,
                    created_at=past,
                    bucket=POLICY.bucket_for(key),
                    bucket_key=key,
                    lease_owner="gone",
                    lease_until=past,
                )
            )
        low_node = Controller(store, owned_buckets=range(0, 32), poll_commands=False)
        high_node = Controller(store, owned_buckets=range(32, 64), poll_commands=False)
        assert low_node.reconcile().lost == (orphans[0],)
        assert store.get(orphans[32]).status is S.RUNNING  # type: ignore[union-attr]
        assert high_node.reconcile().lost == (orphans[32],)
        assert console.get(task_b).status is S.RUNNING  # a live task is never reconciled
        low_node.close()
        high_node.close()
        console.close()
        store.close()
    finally:
        a.finish()
        b.finish()


def test_the_cli_works_on_a_dsn(pg_dsn: str) -> None:
    schema = new_schema()
    cli = [sys.executable, "-m", "chongming_task", "--db", pg_dsn, "--pg-schema", schema]
    try:
        missing = subprocess.run([*cli, "ps"], capture_output=True, text=True, timeout=60)
        assert missing.returncode == 1 and "migrate" in missing.stderr
        assert missing.stderr.count("\n") == 1
        migrated = subprocess.run([*cli, "migrate"], capture_output=True, text=True, timeout=60)
        assert migrated.returncode == 0 and f"schema {schema}" in migrated.stdout
        with Controller(PostgresTaskStore(pg_dsn, schema=schema)) as node:
            run = node.submit(node.task(lambda token: 7, name="seven"))
            run.wait(10)
        shown = subprocess.run(
            [*cli, "--json", "show", run.task_id], capture_output=True, text=True, timeout=60
        )
        assert shown.returncode == 0 and '"outcome": 7' in shown.stdout
        stats = subprocess.run([*cli, "stats"], capture_output=True, text=True, timeout=60)
        assert "succeeded  1" in stats.stdout
    finally:
        drop_schemas(pg_dsn, [schema])


def test_notify_wakes_a_slow_poller_and_polling_still_delivers(pg_dsn: str, schema: str) -> None:
    """A node polling only every 30 s still obeys a stop within a second: LISTEN/NOTIFY
    wakes its poller. The command itself is still claimed from the table."""
    a = Node(pg_dsn, "--schema", schema, "--owner", "node-a", "--poll", "30", "--submit", "loop")
    console = Controller(PostgresTaskStore(pg_dsn, schema=schema), owner="console")
    try:
        (task_id,) = a.task_ids
        wait_until(lambda: console.get(task_id).status is S.RUNNING)
        started = time.monotonic()
        assert console.stop(task_id).accepted
        assert console.wait_for(task_id, timeout=20).status is S.STOPPED
        assert time.monotonic() - started < 5, "the poller was not woken early"
    finally:
        console.close()
        console.store.close()
        a.finish()


def test_a_lost_listen_connection_wakes_the_poller_once_it_is_back(
    pg_dsn: str, schema: str
) -> None:
    """The command poll is a slow safety net where the store wakes the poller: a
    notification sent while the LISTEN connection was gone is made up for by one
    wake-up as soon as it is back, and notifications wake it again after that."""
    import psycopg

    from chongming_task.model import Command, CommandAction

    store = PostgresTaskStore(pg_dsn, schema=schema)
    wakes: list[float] = []
    unsubscribe = store.subscribe_commands(lambda: wakes.append(time.monotonic()))
    assert unsubscribe is not None
    try:
        wait_until(lambda: len(wakes) == 1, 10, "the wake-up on connecting")
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            killed = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = %s",
                [f"LISTEN chongming_commands_{schema}"],
            ).fetchall()
        assert killed and all(row[0] for row in killed), "no listening backend was found"
        wait_until(lambda: len(wakes) == 2, 15, "the wake-up after reconnecting")
        now = datetime.now(UTC)
        store.submit_command(
            Command(command_id="c1", task_id="t", action=CommandAction.STOP, created_at=now)
        )
        wait_until(lambda: len(wakes) == 3, 10, "the wake-up of a command")
    finally:
        unsubscribe()
        store.close()


def test_a_node_polls_rarely_where_the_store_wakes_it(
    pg_dsn: str, schema: str, tmp_path: Path
) -> None:
    """By default a node polls commands every 60 s where the store wakes its poller and
    its beacon looks at the queue (Postgres, SQLite: the beacon is the safety net), every
    10 s with the wake-ups alone, every 0.5 s with neither, and as told when told."""
    from chongming_task import InMemoryTaskStore, SqliteTaskStore

    store = PostgresTaskStore(pg_dsn, schema=schema)
    cases = [
        (store, None, 60.0),
        (SqliteTaskStore(tmp_path / "wakes.db"), None, 60.0),
        (InMemoryTaskStore(), None, 0.5),
        (store, 2.0, 2.0),
    ]
    try:
        for target, given, expected in cases:
            with Controller(target, owned_buckets=[0], command_poll_interval=given) as node:
                assert node.command_poll_interval == expected, (target, given)
    finally:
        store.close()


def test_the_beacon_is_the_safety_net_for_a_command_nobody_announced(
    pg_dsn: str, schema: str
) -> None:
    """A command written without a NOTIFY (as by a writer of its own) reaches a node
    whose poller would not poll for an hour: its beacon's pulse finds it waiting."""
    import psycopg

    a = Node(
        pg_dsn,
        *("--schema", schema, "--owner", "node-a", "--poll", "3600"),
        *("--lease-ttl", "3", "--submit", "loop"),
    )
    store = PostgresTaskStore(pg_dsn, schema=schema)
    try:
        (task_id,) = a.task_ids
        wait_until(lambda: store.get(task_id).status is S.RUNNING)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(
                f"INSERT INTO {schema}.commands (command_id, task_id, action, issued_by, "
                "created_at) VALUES ('quiet', %s, 'stop', 'raw', now())",
                [task_id],
            )
        # The beacon pulses every second (a third of the 3 s TTL).
        wait_until(lambda: store.get(task_id).status is S.STOPPED, 15, "stopped by a pulse")
    finally:
        store.close()
        a.finish()


def test_nodes_shows_the_connections_each_node_holds(pg_dsn: str, schema: str) -> None:
    """A node says in its health how many server connections its store holds (pool and
    LISTEN), and ``nodes`` shows it: the server counts the same, and at most 4."""
    import json

    name = f"conns-{schema[-8:]}"
    store = PostgresTaskStore(pg_dsn, schema=schema, application_name=name)
    cli = [sys.executable, "-m", "chongming_task", "--db", pg_dsn, "--pg-schema", schema]

    def said() -> int | None:
        out = subprocess.run([*cli, "--json", "nodes"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        (node,) = json.loads(out.stdout)
        return node["connections"]  # type: ignore[no-any-return]

    def held() -> int:
        return server_connections(pg_dsn, name)

    try:
        with Controller(store, owner="counted", owned_buckets=range(64), lease_ttl=3):
            wait_until(lambda: said() == held(), 20, "the node's count to match the server's")
            assert 2 <= held() <= 4  # the pool's first connection and the LISTEN one
            table = subprocess.run([*cli, "nodes"], capture_output=True, text=True, timeout=60)
            assert "CONNS" in table.stdout.splitlines()[0]
    finally:
        store.close()
