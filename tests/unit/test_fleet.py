"""``fleet.examine`` and the node beacon, on the in-memory store with times given: each
alarm fires where it should and nowhere else."""

from __future__ import annotations

import logging
import random
import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from chongming_task import Controller, InMemoryTaskStore, SqliteTaskStore, TaskSnapshot, TaskStatus
from chongming_task.fleet import AlarmKind, FleetReport, examine
from chongming_task.model import NodeRecord, TaskScan, Transition
from chongming_task.stores.capabilities import Capabilities, ReadWhole
from chongming_task.testing import FakeClock
from tests.conftest import wait_until

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
S = TaskStatus


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def node(name: str, buckets: range | None, *, seen: float = 0, **kw: object) -> NodeRecord:
    fields: dict[str, object] = {
        "node": name,
        "buckets": None if buckets is None else frozenset(buckets),
        "num_buckets": 8,
        "ttl_seconds": 30.0,
        "started_at": at(0),
        "seen_at": at(seen),
    }
    fields.update(kw)
    return NodeRecord(**fields)  # type: ignore[arg-type]


def task(
    task_id: str,
    status: TaskStatus = S.RUNNING,
    *,
    bucket: int | None = 0,
    created: float = 0,
    lease_until: float | None = 100_000,
    version: int = 3,
) -> TaskSnapshot:
    return TaskSnapshot(
        task_id=task_id,
        name="job",
        status=status,
        status_version=version,
        created_at=at(created),
        started_at=None if status in (S.QUEUED, S.PENDING) else at(created),
        bucket=bucket,
        lease_owner="node-a",
        lease_until=None if lease_until is None else at(lease_until),
    )


def kinds(report: FleetReport) -> dict[AlarmKind, tuple[object, ...]]:
    return {a.kind: a.task_ids or a.buckets or a.nodes for a in report.alarms}


def test_a_healthy_partitioned_fleet_raises_nothing() -> None:
    store = InMemoryTaskStore()
    store.declare_node(node("node-a", range(0, 4), seen=590))
    store.declare_node(node("node-b", range(4, 8), seen=590))
    store.create(task("t1", bucket=1))
    store.create(task("t2", S.QUEUED, bucket=6, created=590))
    report = examine(store, num_buckets=8, now=at(600))
    assert report.healthy and report.alarms == ()
    assert [(n.record.node, n.live, n.active_tasks) for n in report.nodes] == [
        ("node-a", True, 1),
        ("node-b", True, 0),
    ]


def test_duplicates_gaps_and_bucket_counts() -> None:
    store = InMemoryTaskStore()
    store.declare_node(node("node-a", range(0, 4)))
    store.declare_node(node("node-b", range(3, 6)))
    store.declare_node(node("node-c", range(0, 8), num_buckets=16))
    report = examine(store, num_buckets=8, now=at(10))
    twice = [a for a in report.alarms if a.kind is AlarmKind.DUPLICATE_BUCKET]
    assert {(a.nodes, a.buckets) for a in twice} == {
        (("node-a", "node-c"), (0, 1, 2)),
        (("node-a", "node-b", "node-c"), (3,)),
        (("node-b", "node-c"), (4, 5)),
    }
    found = kinds(report)
    assert found[AlarmKind.NUM_BUCKETS_MISMATCH] == ("node-c",)
    assert AlarmKind.UNCOVERED_BUCKET not in found  # 0-7 all declared by someone live


def test_a_gap_and_its_orphans_once_the_threshold_passes() -> None:
    store = InMemoryTaskStore()
    store.declare_node(node("node-a", range(0, 4), seen=590))
    store.declare_node(node("node-b", range(4, 8)))  # seen at 0, dead by 30 (its ttl)
    store.create(task("old", bucket=5, created=0, lease_until=20))
    store.create(task("new", bucket=6, created=500, lease_until=20))
    store.create(task("fine", bucket=1, created=0))
    report = examine(store, num_buckets=8, now=at(600), orphan_after=300)
    found = kinds(report)
    assert found[AlarmKind.UNCOVERED_BUCKET] == (4, 5, 6, 7)
    assert found[AlarmKind.ORPHAN] == ("old",)  # "new" changed 100 s ago
    assert found[AlarmKind.LEASE_EXPIRED] == ("old", "new")
    assert [n.live for n in report.nodes] == [True, False]


def test_stale_queued_is_reported_whoever_covers_it() -> None:
    store = InMemoryTaskStore()
    store.declare_node(node("node-a", None, seen=3590))
    store.create(task("waits", S.QUEUED, created=0, version=1))
    store.create(task("young", S.QUEUED, created=3000, version=1))
    report = examine(store, num_buckets=8, now=at(3600), stale_after=1800)
    assert kinds(report) == {AlarmKind.STALE_QUEUED: ("waits",)}


def test_the_last_status_change_of_a_paused_task_comes_from_its_trail() -> None:
    store = InMemoryTaskStore()
    store.declare_node(node("node-a", range(0, 4), seen=1190))
    paused = task("p", S.PAUSED, bucket=6, created=0, version=5)
    store.create(paused)
    store.append(
        Transition(task_id="p", version=5, from_status=S.PAUSING, to_status=S.PAUSED, at=at(550))
    )
    assert AlarmKind.ORPHAN not in kinds(examine(store, num_buckets=8, now=at(600)))
    assert kinds(examine(store, num_buckets=8, now=at(1200)))[AlarmKind.ORPHAN] == ("p",)


def test_a_fleet_stopped_on_purpose_expects_nothing() -> None:
    store = InMemoryTaskStore()
    store.declare_node(node("node-a", range(0, 4)))
    store.retire_node("node-a", now=at(5))
    report = examine(store, num_buckets=8, now=at(10))
    assert report.healthy
    assert [(n.record.node, n.live) for n in report.nodes] == [("node-a", False)]


def test_the_beacon_declares_refreshes_warns_and_retires(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = InMemoryTaskStore()
    clock = FakeClock(T0)
    store.declare_node(node("node-x", range(2, 4), seen=0))
    with caplog.at_level(logging.WARNING, logger="chongming_task.fleet"):
        a = Controller(store, owner="node-a", owned_buckets=range(0, 3), num_buckets=8, clock=clock)
        try:
            wait_until(lambda: any(n.node == "node-a" for n in store.nodes()), what="declared")
            (mine,) = [n for n in store.nodes() if n.node == "node-a"]
            assert mine.buckets == frozenset({0, 1, 2}) and mine.num_buckets == 8
            assert mine.stopped_at is None and mine.seen_at == T0
        finally:
            a.close()
    assert "bucket 2 declared by node-a and node-x" in caplog.text
    (retired,) = [n for n in store.nodes() if n.node == "node-a"]
    assert retired.stopped_at is not None


def test_a_query_tool_never_declares_itself_and_every_node_does_from_its_start() -> None:
    store = InMemoryTaskStore()
    tool = Controller(store, owner="tool", owned_buckets=range(0, 4), poll_commands=False)
    tool.close()
    assert store.nodes() == []
    plain = Controller(store, owner="plain")  # no partition, nothing submitted
    wait_until(lambda: [n.node for n in store.nodes()] == ["plain"], timeout=30)
    plain.close()
    [retired] = store.nodes()
    assert retired.stopped_at is not None


class _StoreWithClock(InMemoryTaskStore):
    """A store whose own clock runs 300 s ahead of the node's (``SupportsStorageClock``)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock

    def storage_now(self) -> datetime:
        return self.clock.now() + timedelta(seconds=300)


def test_leases_are_written_and_judged_on_the_store_clock() -> None:
    clock = FakeClock(T0)
    store = _StoreWithClock(clock)
    node = Controller(store, owner="node-a", clock=clock, lease_ttl=30, poll_commands=False)
    try:
        gate = threading.Event()
        job = node.task(lambda token: gate.wait(10), name="hold")
        run = node.submit(job)
        stored = store.get(run.task_id)
        # Written on the store's clock (300 s ahead) plus the TTL; created on the node's.
        assert stored is not None and stored.lease_until == T0 + timedelta(seconds=330)
        assert stored.created_at == T0
        gate.set()
        run.wait(10)
    finally:
        node.close()
    # Judged on the store's clock: a lease with 100 s left by the node's clock has run
    # out by the store's (T0 + 300); one written on the store's clock has not.
    store.create(task("behind", lease_until=100))
    store.create(task("fresh", lease_until=330))
    judge = Controller(store, owner="judge", clock=clock, poll_commands=False)
    try:
        assert judge.reconcile(dry_run=True).lost == ("behind",)
    finally:
        judge.close()


def test_the_scan_fallback_answers_like_the_sql_store(tmp_path: Path) -> None:
    """A store without the scan capability (memory) gets the same answers through the
    adapter's fallback (``ReadWhole``) as SQLite gives in SQL."""
    rng = random.Random(7)
    memory, sqlite = InMemoryTaskStore(), SqliteTaskStore(tmp_path / "scan.db")
    statuses = [S.QUEUED, S.RUNNING, S.PAUSED, S.SUCCEEDED, S.FAILED]
    for i in range(300):
        status = rng.choice(statuses)
        snapshot = task(
            f"t{i:03d}",
            status,
            bucket=rng.choice([None, *range(8)]),
            created=i,
            lease_until=rng.choice([None, 50.0, 500.0]),
            version=rng.randint(1, 4),
        )
        if status in (S.SUCCEEDED, S.FAILED):
            ended = at(i) + timedelta(microseconds=rng.randint(0, 100_000_000))
            snapshot = replace(snapshot, ended_at=ended)
        trail = Transition(
            task_id=snapshot.task_id,
            version=snapshot.status_version,
            from_status=None,
            to_status=status,
            at=at(rng.randint(0, 600)),
        )
        for store in (memory, sqlite):
            store.create(snapshot)
            store.append(trail)
    try:
        fallback, native = Capabilities(memory), Capabilities(sqlite)
        active = frozenset({S.QUEUED, S.RUNNING, S.PAUSED})
        for by in ("status", "bucket", "owner", "lease_owner", "bucket_status"):
            assert fallback.count_tasks(by) == native.count_tasks(by)  # type: ignore[arg-type]
            assert fallback.count_tasks(by, statuses=active) == native.count_tasks(  # type: ignore[arg-type]
                by, statuses=active
            )
        scans = [
            TaskScan(statuses=active, lease_expired_at=at(100), limit=None),
            TaskScan(statuses=active, outside=frozenset({1, 2, 3}), limit=7),
            TaskScan(statuses=active, buckets=frozenset({0, 5}), limit=None),
            TaskScan(statuses=active, unchanged_since=at(300), limit=None),
            TaskScan(
                statuses=frozenset({S.QUEUED}),
                outside=frozenset(range(4)),
                unchanged_since=at(200),
                lease_expired_at=at(60),
                limit=3,
            ),
        ]
        for scan in scans:
            assert fallback.scan_tasks(scan) == native.scan_tasks(scan), scan
            assert fallback.scan_tasks(scan)[0] > 0, f"a scan that finds nothing: {scan}"
        # Finished tasks by when they ended: read whole, in the memory store, in SQL.
        for since, width in ((at(50), timedelta(seconds=7)), (at(0), timedelta(microseconds=333))):
            timeline = native.ended_timeline(since=since, width=width)
            assert sum(timeline.values()) > 10
            assert ReadWhole(memory).ended_timeline(since=since, width=width) == timeline
            assert fallback.ended_timeline(since=since, width=width) == timeline
    finally:
        sqlite.close()


def test_two_live_nodes_that_each_run_every_bucket_raise_one_alarm_naming_a_split() -> None:
    store = InMemoryTaskStore()
    store.declare_node(node("node-a", None, seen=590))
    store.declare_node(node("node-b", range(0, 8), seen=590))  # every bucket, declared
    store.declare_node(node("node-c", None, seen=0))  # dead: shares nothing
    report = examine(store, num_buckets=8, now=at(600))
    [shared] = [a for a in report.alarms if a.kind is AlarmKind.EVERY_BUCKET_SHARED]
    assert shared.nodes == ("node-a", "node-b")
    assert shared.message.endswith(
        "give each node its own owned_buckets (say node-a: 0-3; node-b: 4-7)"
    )
    assert not report.healthy

    alone = InMemoryTaskStore()
    alone.declare_node(node("node-a", None, seen=590))
    alone.declare_node(node("node-b", range(0, 4), seen=590))
    alone.declare_node(node("node-c", range(4, 8), seen=590))
    assert examine(alone, num_buckets=8, now=at(600)).alarms == ()
