"""Nodes sharing one PostgreSQL store end to end: control across processes, reconcile by
bucket, the CLI on a DSN. (Server outages: test_postgres_outage.py, on a throwaway
cluster: a test never stops the server it was given.)"""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

from chongming_task import Controller, TaskSnapshot, TaskStatus
from chongming_task.policies import BucketPolicy
from chongming_task.stores.postgres import PostgresTaskStore
from tests.conftest import wait_until
from tests.integration.postgres_support import drop_schemas, new_schema, pg_dsn, schema
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
