"""A late truth kept: one node cut off from Postgres (a TCP proxy, the others stay
connected) while its tasks run; its buckets' owner reconciles them ``lost``; they finish
on the cut-off node; after the heal the store keeps ``lost`` and, beside it, the node's
late report of how each ended. The node itself tells its callers the same."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import psycopg
import pytest

from chongming_task import CancellationToken, Controller, TaskDesynced, TaskStatus
from chongming_task.fleet import dead_nodes
from chongming_task.stores.capabilities import Capabilities
from chongming_task.stores.postgres import PostgresTaskStore
from chongming_task.testing.proxy import Proxy
from tests.conftest import wait_until
from tests.integration.postgres_support import pg_dsn as pg_dsn
from tests.integration.postgres_support import schema as schema

S = TaskStatus


def proxied(dsn: str) -> tuple[Proxy, str]:
    """A proxy to the server ``dsn`` names, and a DSN that goes through it."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    proxy = Proxy((str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432)))
    return proxy, psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1", port=proxy.port)


def test_a_cut_off_nodes_tasks_finish_lost_in_the_store_with_their_late_report(
    pg_dsn: str,
    schema: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    proxy, via_proxy = proxied(pg_dsn)
    a_store = PostgresTaskStore(via_proxy, schema=schema, connect_timeout=2)
    b_store = PostgresTaskStore(pg_dsn, schema=schema)
    a = Controller(a_store, owner="node-a", lease_ttl=1.5, reconcile_interval=None)
    b = Controller(b_store, owner="node-b", reconcile_interval=None)
    finish = threading.Event()

    @a.task(name="work")
    def work(token: CancellationToken, n: int) -> dict[str, int]:
        while not finish.is_set():
            token.checkpoint()
            token.sleep(0.02)
        return {"n": n}

    try:
        runs = [a.tasks["work"].submit(n) for n in range(3)]
        ids = [r.task_id for r in runs]
        wait_until(lambda: all(b.get(t).status is S.RUNNING for t in ids), what="running")
        proxy.cut()
        # The owner of the buckets, still connected, judges by the store's clock.
        wait_until(
            lambda: (
                set(b.reconcile().lost) == set(ids) or all(b.get(t).status is S.LOST for t in ids)
            ),
            timeout=20,
            what="the owner's reconcile after the leases expired",
        )
        lost = {t: b.get(t) for t in ids}
        finish.set()  # the work finishes, on the cut-off node
        for run in runs:
            wait_until(lambda run=run: run.done(), what="ended on node-a")
        proxy.heal()
        caps = Capabilities(b_store)
        wait_until(
            lambda: len(caps.late_reports(task_ids=ids)) == 3,
            timeout=30,
            what="node-a's late reports after the heal",
        )
        reports = {r.task_id: r for r in caps.late_reports(task_ids=ids)}
        for n, task_id in enumerate(ids):
            stored = b.get(task_id)
            assert stored.status is S.LOST  # final: never rewritten
            assert stored == lost[task_id], "a lease or heartbeat landed on the lost row"
            report = reports[task_id]
            assert report.status is S.SUCCEEDED and report.outcome == {"n": n}
            assert report.stored_status is S.LOST and report.reported_by == "node-a"
            assert report.ended_at is not None
        # In node-a, the callers hear the store's word and their outcome's fate.
        for run in runs:
            wait_until(lambda run=run: run.desynced, what="desynced in node-a")
            assert run.wait(timeout=5).status is S.LOST
            with pytest.raises(TaskDesynced) as told:
                run.result(timeout=5)
            assert told.value.local.status is S.SUCCEEDED
            assert "the store holds lost" in str(told.value)
        assert a.health().desynced == 3
        desync_lines = [
            r.getMessage() for r in caplog.records if "another writer" in r.getMessage()
        ]
        assert desync_lines and all("the store holds lost" in m for m in desync_lines)
        assert all("succeeded (result" in m for m in desync_lines)
        # The operator's views say it.
        cli = [sys.executable, "-m", "chongming_task", "--db", pg_dsn, "--pg-schema", schema]
        shown = subprocess.run(
            [*cli, "--json", "show", ids[0]], capture_output=True, text=True, timeout=60
        )
        assert shown.returncode == 0, shown.stderr
        data = json.loads(shown.stdout)
        assert data["status"] == "lost"
        assert data["late_report"]["status"] == "succeeded"
        assert data["late_report"]["outcome"] == {"n": 0}
        text = subprocess.run([*cli, "show", ids[0]], capture_output=True, text=True, timeout=60)
        assert "reported it succeeded" in text.stdout
        history = subprocess.run(
            [*cli, "history", ids[0]], capture_output=True, text=True, timeout=60
        )
        assert "late report" in history.stdout and "node-a" in history.stdout
        doctor = subprocess.run(
            [*cli, "--json", "doctor"], capture_output=True, text=True, timeout=60
        )
        kinds = {alarm["kind"] for alarm in json.loads(doctor.stdout)["alarms"]}
        assert {"late-report", "desynced-runs"} <= kinds, kinds
    finally:
        finish.set()
        a.close(timeout=5)
        b.close()
        a_store.close()
        b_store.close()
        proxy.close()
        time.sleep(0)


def test_a_cut_off_nodes_delayed_task_found_lost_when_it_comes_back(
    pg_dsn: str, schema: str
) -> None:
    """Dead by the fleet's rule (its declaration expired), a node's delayed task is
    marked lost by the buckets' owner long before its run time; the node was only cut
    off, comes back, runs it at its time and reports late: the store keeps lost."""
    proxy, via_proxy = proxied(pg_dsn)
    a_store = PostgresTaskStore(via_proxy, schema=schema, connect_timeout=2)
    b_store = PostgresTaskStore(pg_dsn, schema=schema)
    a = Controller(
        a_store, owner="node-a", owned_buckets=range(64), lease_ttl=1.5, reconcile_interval=None
    )
    b = Controller(
        b_store, owner="node-b", owned_buckets=range(64), lease_ttl=1.5, reconcile_interval=None
    )
    ran = threading.Event()

    @a.task(name="later")
    def later(token: CancellationToken) -> str:
        ran.set()
        return "ran late"

    try:
        run = a.tasks["later"].configure(delay=6).submit()
        caps = Capabilities(b_store)
        wait_until(lambda: any(r.node == "node-a" for r in caps.nodes()), what="declared")
        proxy.cut()
        wait_until(
            lambda: any(r.node == "node-a" for r in dead_nodes(caps.nodes(), caps.now())),
            timeout=20,
            what="node-a's declaration expired",
        )
        # node-b judges by its own reading of the store's clock, which may trail the
        # reading above by a few milliseconds at the moment of the death.
        wait_until(
            lambda: run.task_id in b.reconcile(dry_run=True).lost,
            timeout=5,
            what="node-a dead by node-b's clock too",
        )
        assert run.task_id in b.reconcile().lost  # long before its run time
        stored = b.get(run.task_id)
        assert stored.status is S.LOST and stored.failure is not None
        assert "node node-a died" in stored.failure.message
        proxy.heal()
        assert ran.wait(30), "the cut-off node never ran it at its time"
        wait_until(
            lambda: len(caps.late_reports(task_ids=[run.task_id])) == 1,
            timeout=30,
            what="node-a's late report",
        )
        (report,) = caps.late_reports(task_ids=[run.task_id])
        assert report.status is S.SUCCEEDED and report.reported_by == "node-a"
        assert b.get(run.task_id) == stored  # lost stands, never rewritten
        assert run.wait(timeout=5).status is S.LOST  # the node tells its caller the same
    finally:
        a.close(timeout=5)
        b.close()
        a_store.close()
        b_store.close()
        proxy.close()
