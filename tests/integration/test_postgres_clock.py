"""Lease decisions on the store's clock (docs/design.md, "Clocks"), against the real
server: a node whose clock is five minutes off neither loses its live tasks to another
node's reconcile (slow clock) nor keeps a dead node's leases alive (fast clock)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from chongming_task import Controller, TaskStatus
from chongming_task.stores.postgres import PostgresTaskStore
from tests.conftest import wait_until
from tests.integration.postgres_support import pg_dsn, schema
from tests.integration.test_cross_process import Node

__all__ = ["pg_dsn", "schema"]
S = TaskStatus
SKEW = 300.0  # five minutes
TTL = 1.5


@pytest.fixture
def console(pg_dsn: str, schema: str) -> Iterator[Controller]:
    """The other node: a correct clock, reconciling every bucket."""
    store = PostgresTaskStore(pg_dsn, schema=schema)
    node = Controller(store, owner="console", poll_commands=False)
    yield node
    node.close()
    store.close()


def skewed_node(dsn: str, schema: str, owner: str, skew: float, task: str) -> Node:
    """A node process whose clock is ``skew`` seconds off, running ``task``."""
    return Node(
        dsn,
        *("--schema", schema, "--owner", owner, "--lease-ttl", str(TTL)),
        *("--clock-offset", str(skew), "--submit", task),
    )


def lease_left(console: Controller, task_id: str) -> float:
    """Seconds the task's stored lease has left, by the server's clock."""
    snapshot = console.get(task_id)
    assert snapshot.lease_until is not None
    now = console.capabilities.storage_now()
    return (snapshot.lease_until - now).total_seconds()


def test_a_node_five_minutes_slow_keeps_its_tasks(
    pg_dsn: str, schema: str, console: Controller
) -> None:
    slow = skewed_node(pg_dsn, schema, "slow", -SKEW, "loop")
    try:
        (task_id,) = slow.task_ids
        wait_until(lambda: console.get(task_id).status is S.RUNNING, what="running")
        # Its own clock would write a lease that expired five minutes ago.
        assert 0 < lease_left(console, task_id) <= TTL + 1
        deadline = time.monotonic() + 3 * TTL
        while time.monotonic() < deadline:
            report = console.reconcile()
            assert report.lost == (), "a live node's task was marked lost"
            time.sleep(0.2)
        assert console.get(task_id).status is S.RUNNING
        assert console.get(task_id).started_at is not None
        # Business times stay on the node's clock: its started_at is five minutes back.
        started = console.get(task_id).started_at
        assert started is not None
        assert console.capabilities.storage_now() - started > timedelta(seconds=SKEW - 30)
    finally:
        slow.finish()


def test_a_dead_node_five_minutes_fast_does_not_keep_its_leases(
    pg_dsn: str, schema: str, console: Controller
) -> None:
    fast = skewed_node(pg_dsn, schema, "fast", SKEW, "silent:60")
    (task_id,) = fast.task_ids
    try:
        wait_until(lambda: console.get(task_id).status is S.RUNNING, what="running")
        # Its own clock would write a lease five minutes into the future.
        assert lease_left(console, task_id) <= TTL + 1
        fast.kill()
        killed = time.monotonic()

        def marked_lost() -> bool:
            return task_id in console.reconcile().lost

        wait_until(marked_lost, timeout=TTL + 10, what="lost after the lease")
        assert time.monotonic() - killed < TTL + 10  # seconds, not five minutes
        assert console.get(task_id).status is S.LOST
    finally:
        fast.finish()
