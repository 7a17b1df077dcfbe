"""PostgreSQL outages, on a throwaway cluster of the test's own (never the server the
suite was given): nothing is lost across a restart, the store is usable within about a
second of the server's return, calls fail fast while it is away, and a node renews its
leases before anything else when it comes back."""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import pytest

from chongming_task import (
    CancellationToken,
    Controller,
    FailureKind,
    StoreError,
    StoreUnavailable,
    TaskSnapshot,
    TaskStatus,
)
from chongming_task.stores.postgres import PostgresTaskStore
from tests.conftest import wait_until
from tests.integration.pg_cluster import ThrowawayCluster, throwaway_cluster

__all__ = ["throwaway_cluster"]
S = TaskStatus


def _store(cluster: ThrowawayCluster) -> PostgresTaskStore:
    store = PostgresTaskStore(cluster.dsn, connect_timeout=2)
    store.create_schema()
    return store


def _safe_get(store: PostgresTaskStore, task_id: str) -> TaskSnapshot | None:
    try:
        return store.get(task_id)
    except StoreError:
        return None  # still coming back


def test_a_server_restart_mid_run_loses_nothing(throwaway_cluster: ThrowawayCluster) -> None:
    """The server goes away while a task runs and finishes; its transitions wait in the
    write-through buffer and land once the server is back."""
    store = _store(throwaway_cluster)
    node = Controller(store, activity_interval=0.1)
    finish = threading.Event()

    @node.task(name="through-restart")
    def work(token: CancellationToken) -> str:
        token.checkpoint()
        finish.wait(60)
        return "done"

    run = node.submit(work)
    wait_until(lambda: store.get(run.task_id).status is S.RUNNING)  # type: ignore[union-attr]
    throwaway_cluster.stop()
    finish.set()
    assert run.result(30) == "done"  # the process knows at once ...
    assert run in node.held()  # ... the store does not: the run is held until written
    throwaway_cluster.start()
    wait_until(
        lambda: (s := _safe_get(store, run.task_id)) is not None and s.status is S.SUCCEEDED,
        timeout=30,
        what="catch-up after the restart",
    )
    final = store.get(run.task_id)
    assert final is not None and final.outcome == "done" and final.status_version == 4
    assert [t.to_status for t in store.history(run.task_id)] == [
        S.QUEUED,
        S.STARTING,
        S.RUNNING,
        S.SUCCEEDED,
    ]
    assert node.desynced_tasks == frozenset()
    node.close()
    store.close()


def test_calls_fail_fast_during_an_outage_and_work_within_a_second_of_the_return(
    throwaway_cluster: ThrowawayCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """After an outage of 12 s the pool's own reconnect back-off once kept the store
    unusable for 8 s more; during the outage every call waited the pool timeout. The
    pool's complaints meanwhile are one line each."""
    store = _store(throwaway_cluster)
    caplog.set_level(logging.WARNING, logger="psycopg.pool")
    try:
        assert store.get("nothing") is None
        throwaway_cluster.stop()
        outage_ends = time.monotonic() + 12
        slow_calls = []
        calls = 0
        while time.monotonic() < outage_ends:
            started = time.monotonic()
            with contextlib.suppress(StoreError):
                store.get("nothing")
            calls += 1
            if calls > 1:  # the first call finds the outage (bounded by connect_timeout)
                slow_calls.append(time.monotonic() - started)
            time.sleep(0.05)
        assert calls > 20
        # Against the pool's timeout (2 s) that every call waited before.
        assert max(slow_calls) < 1.0, f"a call during the outage took {max(slow_calls):.2f}s"
        throwaway_cluster.start()
        back = time.monotonic()
        while True:
            try:
                assert store.get("nothing") is None
                break
            except StoreUnavailable:
                assert time.monotonic() - back < 10, "the store never came back"
                time.sleep(0.02)
        dead = time.monotonic() - back
        # Against the pool's own reconnect back-off, which kept it unusable for 8 s more.
        assert dead < 5, f"the store stayed unusable {dead:.2f}s after the server returned"
        said = [r.getMessage() for r in caplog.records if r.name == "psycopg.pool"]
        assert any("error connecting" in line for line in said), said
        assert all("\n" not in line for line in said), said
    finally:
        store.close()


def test_a_node_keeps_its_truth_through_an_outage_longer_than_the_lease(
    throwaway_cluster: ThrowawayCluster,
) -> None:
    """During an outage of twice the lease TTL, timeouts still fire in the node (the
    supervisor's pass is bounded); when the server returns, the node renews its leases
    first, so a reconcile run right after finds no live task to mark lost."""
    store = _store(throwaway_cluster)
    node = Controller(store, lease_ttl=2.0, activity_interval=0.1)
    other_store = PostgresTaskStore(throwaway_cluster.dsn, connect_timeout=2)
    release = threading.Event()
    try:

        @node.task(name="quiet")
        def quiet(token: CancellationToken) -> str:
            release.wait(60)  # healthy, never checkpoints
            return "ok"

        @node.task(name="slow", timeout=1.0, timeout_grace=5)
        def slow(token: CancellationToken) -> None:
            while True:
                token.checkpoint()
                token.sleep(0.05)

        healthy = node.submit(quiet)
        wait_until(lambda: store.get(healthy.task_id).status is S.RUNNING)  # type: ignore[union-attr]
        throwaway_cluster.stop()
        down = time.monotonic()
        time.sleep(4.0)  # twice the lease TTL
        throwaway_cluster.start()
        back = time.monotonic()
        assert back - down >= 4.0
        wait_until(
            lambda: (
                (s := _safe_get(store, healthy.task_id)) is not None
                and s.lease_until is not None
                and s.lease_until.timestamp() > time.time() + 1.0
            ),
            timeout=5,
            what="the lease renewed after the return",
        )
        renewed_after = time.monotonic() - back
        assert renewed_after < 2.0, f"leases renewed {renewed_after:.2f}s after the return"
        other = Controller(other_store, poll_commands=False)
        try:
            assert other.reconcile().lost == ()
        finally:
            other.close()
        release.set()
        assert healthy.result(10) == "ok"
        wait_until(lambda: store.get(healthy.task_id).status is S.SUCCEEDED)  # type: ignore[union-attr]
        # A timeout during an outage: checked and carried out while the store is away.
        started = node.submit(slow)
        wait_until(lambda: store.get(started.task_id).status is S.RUNNING)  # type: ignore[union-attr]
        throwaway_cluster.stop()
        final = started.wait(10)
        assert final.status is S.FAILED and final.failure is not None
        assert final.failure.kind is FailureKind.TIMEOUT
        throwaway_cluster.start()
        wait_until(
            lambda: (s := _safe_get(store, started.task_id)) is not None and s.status is S.FAILED,
            timeout=15,
            what="the timeout caught up in the store",
        )
    finally:
        release.set()
        node.close()
        store.close()
        other_store.close()


def test_a_store_opened_while_the_server_returns_still_refuses_a_newer_schema(
    throwaway_cluster: ThrowawayCluster,
) -> None:
    # The server is away when the store opens and back within its connect_timeout: the
    # store's first, direct connection fails, its pool then connects. The schema's
    # version is still read, and a newer release's schema still refused.
    import psycopg

    from chongming_task.stores.postgres import SCHEMA_VERSION

    _store(throwaway_cluster).close()
    with psycopg.connect(throwaway_cluster.dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE chongming.schema_version SET version = {SCHEMA_VERSION + 1}")
    throwaway_cluster.stop()
    returns = threading.Timer(1.0, throwaway_cluster.start)
    returns.start()
    try:
        began = time.monotonic()
        with pytest.raises(StoreError, match="made by a newer release"):
            PostgresTaskStore(throwaway_cluster.dsn, connect_timeout=20)
        assert time.monotonic() - began >= 0.9  # it did wait for the server's return
    finally:
        returns.join()
