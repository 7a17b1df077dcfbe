"""Several processes share one SQLite file: control, leases, reconcile, buckets.

Every "process A" here is a real subprocess (``tests.integration.node``); the test process
plays B, the other node or the operator's console.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from chongming_task import (
    CancellationToken,
    Controller,
    SqliteTaskStore,
    TaskSnapshot,
    TaskStatus,
)
from chongming_task.policies import BucketPolicy
from tests.conftest import wait_until

ROOT = Path(__file__).resolve().parents[2]
S = TaskStatus


class Node:
    """A node subprocess and the JSON lines it printed."""

    def __init__(self, db: Path | str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.node", str(db), *args],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[dict[str, Any]] = []
        while True:
            line = self._read()
            if "ready" in line:
                break
            self.lines.append(line)

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        raw = self.proc.stdout.readline()
        if not raw:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"node exited early: {err}")
        data: dict[str, Any] = json.loads(raw)
        return data

    @property
    def task_ids(self) -> list[str]:
        return [line["task_id"] for line in self.lines]

    def next_line(self) -> dict[str, Any]:
        return self._read()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def finish(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "shared.db"


@pytest.fixture
def nodes() -> Iterator[list[Node]]:
    started: list[Node] = []
    yield started
    for node in started:
        node.finish()


def console(db: Path, **kwargs: Any) -> Controller:
    return Controller(SqliteTaskStore(db), owner="console", **kwargs)


def status_of(c: Controller, task_id: str) -> TaskStatus:
    return c.get(task_id).status


def open_commands(db: Path) -> list[tuple[str, str | None, str | None]]:
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute(
            "SELECT command_id, lease_until, finished_at FROM commands WHERE finished_at IS NULL"
        ).fetchall()
        return [(r[0], r[1], r[2]) for r in rows]
    finally:
        conn.close()


def test_another_process_stops_pauses_and_resumes_a_running_task(
    db: Path, nodes: list[Node]
) -> None:
    a = Node(db, "--owner", "node-a", "--submit", "loop", "--submit", "loop")
    nodes.append(a)
    first, second = a.task_ids
    b = console(db)
    try:
        wait_until(lambda: status_of(b, first) is S.RUNNING, what="running in A")
        receipt = b.pause(first)
        assert receipt.accepted and receipt.outcome == "accepted"
        b.wait_for(first, lambda s: s.status is S.PAUSED, timeout=10)
        heartbeat = b.get(first).last_heartbeat_at
        assert b.resume(first).accepted
        b.wait_for(first, lambda s: s.status is S.RUNNING, timeout=10)
        wait_until(lambda: b.get(first).last_heartbeat_at != heartbeat, what="progress again")
        assert b.stop(first).accepted
        assert b.wait_for(first, timeout=10).status is S.STOPPED
        assert b.cancel(second).accepted
        assert b.wait_for(second, timeout=10).status is S.CANCELLED
        history = iter(t.to_status for t in b.history(first))
        expected = [S.RUNNING, S.PAUSING, S.PAUSED, S.RUNNING, S.STOPPING, S.STOPPED]
        assert all(step in history for step in expected), "transitions out of order"
        actors = {t.actor for t in b.history(first) if t.to_status is S.PAUSING}
        assert actors == {"console"}, "the requester is recorded on the transition"
        assert open_commands(db) == []
        assert b.stop(first).outcome == "already-terminal"
    finally:
        b.close()


def test_a_command_for_a_task_held_elsewhere_stays_open_for_its_holder(
    db: Path, nodes: list[Node], tmp_path: Path
) -> None:
    # A polls only when asked (nor is it woken), so B's poller looks at A's command first:
    # it claims only what it may act on (a store without that claim: it releases it).
    trigger = tmp_path / "poll-now"
    a = Node(db, "--owner", "node-a", "--poll-on", str(trigger), "--submit", "loop")
    nodes.append(a)
    (task_id,) = a.task_ids
    b = console(db, command_poll_interval=3600)
    try:
        wait_until(lambda: status_of(b, task_id) is S.RUNNING)
        receipt = b.stop(task_id)
        assert b.poll_commands_once() == 0  # B does not hold the task ...
        (command,) = open_commands(db)
        assert command == (receipt.command_id, None, None)  # ... and left it open, unleased
        trigger.touch()
        assert b.wait_for(task_id, timeout=10).status is S.STOPPED  # A got it
        assert open_commands(db) == []
        conn = sqlite3.connect(db)
        row = conn.execute(
            "SELECT issued_by, outcome FROM commands WHERE command_id = ?", (receipt.command_id,)
        ).fetchone()
        conn.close()
        assert row == ("console", "stopping")  # who asked, and what the holder did
    finally:
        b.close()


def test_a_killed_node_is_marked_lost_only_after_its_lease_expires(
    db: Path, nodes: list[Node], tmp_path: Path
) -> None:
    marker = tmp_path / "claim-now"
    a = Node(
        db,
        "--owner",
        "node-a",
        "--lease-ttl",
        "2",
        "--poll-on",  # it never polls, nor is it woken: only the claim below takes it
        str(tmp_path / "never"),
        "--claim-on",
        str(marker),
        "--submit",
        "loop",
    )
    nodes.append(a)
    (task_id,) = a.task_ids
    b = console(db)
    try:
        wait_until(lambda: status_of(b, task_id) is S.RUNNING)
        command = b.pause(task_id)
        marker.touch()
        assert a.next_line() == {"claimed": [command.command_id]}
        a.kill()
        killed_at = time.monotonic()
        lease_until = b.get(task_id).lease_until
        assert lease_until is not None
        # Before the lease expires: nothing is lost and the claim is still A's.
        report = b.reconcile()
        assert report.lost == () and status_of(b, task_id) is S.RUNNING
        assert b.store.claim_commands(now=b.clock.now(), lease_seconds=5) == []
        # After expiry: reconcile marks the task lost, never re-runs it.
        wait_until(lambda: b.clock.now() > lease_until, timeout=10, what="lease expiry")
        dry = b.reconcile(dry_run=True)
        assert dry.lost == (task_id,) and status_of(b, task_id) is S.RUNNING
        report = b.reconcile()
        assert report.lost == (task_id,)
        lost = b.get(task_id)
        assert lost.status is S.LOST
        assert lost.failure is not None and lost.failure.carrier_may_run
        assert "result unknown" in lost.failure.message
        assert time.monotonic() - killed_at >= 0.5
        assert b.history(task_id)[-1].to_status is S.LOST
        # The command A claimed and never finished is claimable again (its lease ran out).
        again = b.store.claim_commands(now=b.clock.now(), lease_seconds=5)
        assert [c.command_id for c in again] == [command.command_id]
    finally:
        b.close()


def test_a_healthy_task_that_never_checkpoints_is_never_marked_lost(
    db: Path, nodes: list[Node]
) -> None:
    """Liveness comes from the supervisor's lease, not the task's heartbeat: a task that
    computes for 3x the lease TTL without a checkpoint is alive, and stays so."""
    a = Node(db, "--owner", "node-a", "--lease-ttl", "1", "--submit", "silent:3.5")
    nodes.append(a)
    (task_id,) = a.task_ids
    b = console(db)
    try:
        wait_until(lambda: status_of(b, task_id) is S.RUNNING)
        deadline = time.monotonic() + 3.2
        while time.monotonic() < deadline:
            assert b.reconcile().lost == ()
            snap = b.get(task_id)
            assert snap.status is S.RUNNING and snap.last_heartbeat_at is None
            threading.Event().wait(0.1)
        final = b.wait_for(task_id, timeout=10)
        assert final.status is S.SUCCEEDED and final.outcome == "done"
    finally:
        b.close()


def _dead_task(store: SqliteTaskStore, bucket: int, past: Any, n: int) -> str:
    task_id = f"dead-{bucket}-{n}"
    store.create(
        TaskSnapshot(
            task_id=task_id,
            name="orphan",
            status=S.RUNNING,
            status_version=3,
            created_at=past,
            bucket=bucket,
            bucket_key=f"k{bucket}",
            lease_owner="gone",
            lease_until=past + timedelta(seconds=1),
        )
    )
    return task_id


def test_each_node_reconciles_only_its_own_buckets(db: Path) -> None:
    store = SqliteTaskStore(db)
    past = datetime.now(UTC) - timedelta(minutes=5)
    mine = [_dead_task(store, b, past, i) for i, b in enumerate([0, 5, 31])]
    theirs = [_dead_task(store, b, past, i) for i, b in enumerate([32, 40, 63])]
    # Reconciled by hand here (the nodes' own reconcile is tested apart).
    low = Controller(
        SqliteTaskStore(db), owner="low", owned_buckets=range(0, 32), reconcile_interval=None
    )
    high = Controller(
        SqliteTaskStore(db), owner="high", owned_buckets=range(32, 64), reconcile_interval=None
    )
    try:
        counts = low.bucket_counts()
        assert counts == {0: 1, 5: 1, 31: 1, 32: 1, 40: 1, 63: 1}
        assert set(low.reconcile(dry_run=True).lost) == set(mine)
        assert set(low.reconcile().lost) == set(mine)
        assert all(store.get(t).status is S.RUNNING for t in theirs)  # type: ignore[union-attr]
        assert set(high.reconcile().lost) == set(theirs)
        assert all(store.get(t).status is S.LOST for t in mine + theirs)  # type: ignore[union-attr]
    finally:
        low.close()
        high.close()
        store.close()


def test_the_same_key_maps_to_the_same_bucket_under_any_hash_seed() -> None:
    keys = ["tenant-1", "tenant-42", "ünïcode-ключ", "", "a" * 300]
    script = (
        "import json, sys; from chongming_task.policies import BucketPolicy; "
        "p = BucketPolicy(64); "
        "print(json.dumps([p.bucket_for(k) for k in json.loads(sys.argv[1])]))"
    )
    seen = set()
    for seed in ("0", "1", "12345", "random"):
        out = subprocess.run(
            [sys.executable, "-c", script, json.dumps(keys)],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        )
        seen.add(out.stdout.strip())
    assert len(seen) == 1
    assert json.loads(seen.pop()) == [BucketPolicy(64).bucket_for(k) for k in keys]


def test_a_backlog_in_one_bucket_does_not_starve_another() -> None:
    policy = BucketPolicy(64)
    key_a = "tenant-a"
    key_b = next(
        f"tenant-b{i}"
        for i in range(100)
        if policy.bucket_for(f"tenant-b{i}") != policy.bucket_for(key_a)
    )
    store = SqliteTaskStore(":memory:")
    c = Controller(store, max_workers=2, max_parallel_per_bucket=1, activity_interval=0.02)
    held = threading.Event()  # a0 holds its bucket until b has been served
    order: list[str] = []
    lock = threading.Lock()
    running = {"a": 0, "b": 0}
    peak = {"a": 0, "b": 0}

    @c.task(name="slow")
    def slow(token: CancellationToken, who: str) -> None:
        with lock:
            order.append(who)
            running[who[0]] += 1
            peak[who[0]] = max(peak[who[0]], running[who[0]])
        if who == "a0":
            held.wait(10)
        with lock:
            running[who[0]] -= 1

    try:
        # The order is pinned by the held task, not by how fast the submitter is: the
        # whole backlog is queued while a0 holds bucket a and a worker is free.
        backlog = [slow.configure(bucket_key=key_a).submit(f"a{i}") for i in range(20)]
        other = slow.configure(bucket_key=key_b).submit("b")
        other.wait(10)
        assert order == ["a0", "b"], order  # served next, not after a's 20
        held.set()
        for run in backlog:
            run.wait(10)
        running_a = [s for s in order if s.startswith("a")]
        assert running_a == [f"a{i}" for i in range(20)]  # FIFO within the bucket
        assert peak == {"a": 1, "b": 1}  # never two of one bucket at once
    finally:
        held.set()
        c.close()
        store.close()


def _terminal_task_with_a_command(db: Path) -> tuple[SqliteTaskStore, str]:
    """A stored terminal task plus an open stop command for it (as if its holder had
    finished just after an operator asked to stop it)."""
    store = SqliteTaskStore(db)
    now = datetime.now(UTC)
    store.create(
        TaskSnapshot(
            task_id="done-1", name="n", status=S.SUCCEEDED, status_version=4, created_at=now
        )
    )
    from chongming_task import Command, CommandAction

    store.submit_command(
        Command(command_id="c1", task_id="done-1", action=CommandAction.STOP, created_at=now)
    )
    return store, "c1"


@pytest.mark.parametrize("buckets", [range(0, 8), None], ids=["partitioned", "every-bucket"])
def test_every_node_polls_commands_from_construction(db: Path, buckets: range | None) -> None:
    store, command_id = _terminal_task_with_a_command(db)
    node = Controller(SqliteTaskStore(db), owned_buckets=buckets, command_poll_interval=0.02)
    try:
        wait_until(lambda: open_commands(db) == [], what="the node's first poll")
        row = (
            sqlite3.connect(db)
            .execute("SELECT outcome FROM commands WHERE command_id = ?", (command_id,))
            .fetchone()
        )
        assert row == ("already-terminal",)
    finally:
        node.close()
        store.close()


def test_a_pure_query_client_never_polls_commands(db: Path) -> None:
    store, command_id = _terminal_task_with_a_command(db)
    client = Controller(SqliteTaskStore(db), command_poll_interval=0.01, poll_commands=False)
    try:
        client.list_tasks()
        client.stats()
        threading.Event().wait(0.3)  # thirty poll intervals
        assert [c[0] for c in open_commands(db)] == [command_id]
        assert not [t for t in threading.enumerate() if t.name.startswith("chongming-commands")]
    finally:
        client.close()
        store.close()


def test_a_replacement_node_marks_the_dead_nodes_tasks_lost_on_its_own(
    db: Path, nodes: list[Node]
) -> None:
    """kill -9 a node; a replacement started with its buckets reconciles them itself once
    their leases expire. It never touches another node's buckets, nor a live node's
    tasks, and the doctor's lease alarm clears with no ``reconcile`` by hand."""
    low_key, high_key = _key_in(0, 31), _key_in(32, 63)
    ttl = "1.5"
    a = Node(db, "--owner", "node-a", "--owned", "0-31", "--lease-ttl", ttl,
             "--submit", f"loop@{low_key}", "--submit", f"loop@{low_key}")  # fmt: skip
    nodes.append(a)
    # A live node beside them, reconciling nothing itself: a dead task in its buckets
    # must stay for it to judge.
    c = Node(db, "--owner", "node-c", "--owned", "32-63", "--lease-ttl", ttl,
             "--no-reconcile", "--submit", f"loop@{high_key}")  # fmt: skip
    nodes.append(c)
    store = SqliteTaskStore(db)
    try:
        past = datetime.now(UTC) - timedelta(minutes=5)
        orphan = _dead_task(store, 40, past, 0)
        dead, live = a.task_ids, c.task_ids
        wait_until(lambda: all(store.get(t).status is S.RUNNING for t in dead + live))  # type: ignore[union-attr]
        a.kill()
        a2 = Node(db, "--owner", "node-a2", "--owned", "0-31", "--lease-ttl", ttl)
        nodes.append(a2)
        wait_until(
            lambda: all(store.get(t).status is S.LOST for t in dead),  # type: ignore[union-attr]
            timeout=20,
            what="the replacement's own reconcile",
        )
        for task_id in dead:
            lost = store.get(task_id)
            assert lost is not None and lost.failure is not None
            assert "node-a expired" in lost.failure.message
            assert store.history(task_id)[-1].actor == "node-a2"
        assert store.get(orphan).status is S.RUNNING  # type: ignore[union-attr]
        assert all(store.get(t).status is S.RUNNING for t in live)  # type: ignore[union-attr]
        doctor = subprocess.run(
            [sys.executable, "-m", "chongming_task", "--db", str(db), "--json", "doctor"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        report = json.loads(doctor.stdout)
        expired = [a for a in report["alarms"] if a["kind"] == "lease-expired"]
        assert [a["task_ids"] for a in expired] == [[orphan]], expired
    finally:
        store.close()


def _key_in(low: int, high: int) -> str:
    policy = BucketPolicy(64)
    return next(
        k for k in (f"key{i}" for i in range(10_000)) if low <= policy.bucket_for(k) <= high
    )


def test_another_process_pauses_resumes_and_stops_an_async_task(
    db: Path, nodes: list[Node]
) -> None:
    """An ``async def`` task on a node's event loop is a task like any other for the
    CLI: paused, resumed and stopped from another process."""
    a = Node(db, "--owner", "node-a", "--submit", "aloop")
    nodes.append(a)
    (task_id,) = a.task_ids
    store = SqliteTaskStore(db)

    def cli(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "chongming_task", "--db", str(db), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    try:
        wait_until(lambda: store.get(task_id).status is S.RUNNING)  # type: ignore[union-attr]
        assert "now paused" in cli("pause", task_id, "--wait", "10")
        assert "now running" in cli("resume", task_id, "--wait", "10")
        assert "now stopped" in cli("stop", task_id, "--wait", "10")
        trail = [t.to_status for t in store.history(task_id)]
        assert trail[-5:] == [S.PAUSING, S.PAUSED, S.RUNNING, S.STOPPING, S.STOPPED]
    finally:
        store.close()
