"""The capability section of the store contract: one test per optional capability
(``chongming_task.stores.capabilities``), run only where the store declares it; for the
others the test raises ``unittest.SkipTest`` (pytest shows it as a skip naming the
capability; ``StoreContract.verify()`` leaves it out)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from datetime import UTC, datetime
from unittest import SkipTest

from .. import states
from ..errors import ConcurrencyConflict, TaskAlreadyExists
from ..model import (
    CommandAction,
    Failure,
    FailureKind,
    NodeRecord,
    PipelineRecord,
    ScheduleRecord,
    TaskScan,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from ..stores.capabilities import (
    SupportsAtomic,
    SupportsCommandLog,
    SupportsCommandWakeups,
    SupportsCreateMany,
    SupportsMarkExpired,
    SupportsMarkLost,
    SupportsNodeRegistry,
    SupportsPendingCommands,
    SupportsPipelineRegistry,
    SupportsRenewLeases,
    SupportsScheduleRegistry,
    SupportsStorageClock,
    SupportsTaskScan,
    SupportsTransitionWakeups,
    SupportsWriteBehind,
    SupportsWriteTogether,
    SupportsWriteTransitions,
)
from ..stores.protocol import TaskStore
from ._contract_base import ContractBase, at, raises

__all__ = ["CapabilityContract"]


class CapabilityContract(ContractBase):
    # -- optional capabilities: each runs only where the store declares it -----------------

    @staticmethod
    def _declares(store: TaskStore, capability: type, name: str) -> None:
        if not isinstance(store, capability):
            raise SkipTest(f"{type(store).__name__} does not declare {name} (optional)")

    def test_capability_atomic_commits_together_or_not_at_all(self) -> None:
        with self._store() as store:
            self._declares(store, SupportsAtomic, "atomic()")
            assert isinstance(store, SupportsAtomic)
            with store.atomic():
                store.create(self.snapshot("a1"))
                store.append(self.transition("a1", 1, TaskStatus.QUEUED))
            assert store.get("a1") is not None and len(store.history("a1")) == 1

            class Undo(Exception):
                pass

            try:
                with store.atomic():
                    store.create(self.snapshot("a2"))
                    store.append(self.transition("a2", 1, TaskStatus.QUEUED))
                    raise Undo
            except Undo:
                pass
            assert store.get("a2") is None and store.history("a2") == []

    def test_capability_create_many_is_all_or_nothing(self) -> None:
        with self._store() as store:
            self._declares(store, SupportsCreateMany, "create_many()")
            assert isinstance(store, SupportsCreateMany)

            def item(task_id: str) -> tuple[TaskSnapshot, Transition]:
                return self.snapshot(task_id), self.transition(task_id, 1, TaskStatus.QUEUED)

            store.create_many([item("m1"), item("m2"), item("m3")])
            assert self._ids(store.query()) == ["m1", "m2", "m3"]
            assert all(len(store.history(t)) == 1 for t in ("m1", "m2", "m3"))
            raises(TaskAlreadyExists, lambda: store.create_many([item("n1"), item("m2")]))
            assert store.get("n1") is None and store.history("n1") == []

    def test_capability_write_transitions_is_a_compare_and_set_with_its_trail(self) -> None:
        with self._store() as store:
            self._declares(store, SupportsWriteTransitions, "write_transitions()")
            assert isinstance(store, SupportsWriteTransitions)
            store.create(self.snapshot(tags=frozenset({"io"}), bucket=3, bucket_key="k"))
            store.touch("t1", lease_owner="node-a", lease_until=at(30))
            running = self.snapshot(
                status=TaskStatus.RUNNING,
                status_version=3,
                attempt=1,
                started_at=at(1),
                tags=frozenset({"io"}),
                bucket=3,
                bucket_key="k",
            )
            trail = [
                self.transition("t1", 2, TaskStatus.STARTING, from_status=TaskStatus.QUEUED),
                self.transition("t1", 3, TaskStatus.RUNNING, from_status=TaskStatus.STARTING),
            ]
            store.write_transitions(running, expect_version=1, transitions=trail)
            got = store.get("t1")
            assert got is not None
            assert replace(got, lease_owner=None, lease_until=None) == running
            assert got.lease_owner == "node-a" and got.lease_until == at(30)  # never the lease
            assert store.history("t1") == trail
            late = self.transition("t1", 4, TaskStatus.FAILED, from_status=TaskStatus.RUNNING)
            stale = self.snapshot(status=TaskStatus.FAILED, status_version=4)
            raises(
                ConcurrencyConflict,
                lambda: store.write_transitions(stale, expect_version=1, transitions=[late]),
            )
            assert store.get("t1") == got and store.history("t1") == trail  # nothing written

    def test_capability_write_together_lets_each_write_stand_alone(self) -> None:
        with self._store() as store:
            self._declares(store, SupportsWriteTogether, "write_transitions_together()")
            assert isinstance(store, SupportsWriteTogether)
            for task_id in ("w1", "w2", "w3"):
                store.create(self.snapshot(task_id))
                store.append(self.transition(task_id, 1, TaskStatus.QUEUED))

            def running(task_id: str) -> tuple[TaskSnapshot, list[Transition]]:
                snapshot = self.snapshot(
                    task_id, status=TaskStatus.RUNNING, status_version=2, started_at=at(1)
                )
                trail = [
                    self.transition(task_id, 2, TaskStatus.RUNNING, from_status=TaskStatus.QUEUED)
                ]
                return snapshot, trail

            (s1, t1), (s2, t2), (s3, t3) = running("w1"), running("w2"), running("w3")
            assert store.write_transitions_together([(s1, 1, t1), (s2, 1, t2)]) == [None, None]
            assert store.get("w1") == s1 and store.get("w2") == s2
            assert store.history("w2")[-1] == t2[0]
            # w1 expects a version it no longer has: its write fails alone, w3's lands.
            errors = store.write_transitions_together([(s1, 1, t1), (s3, 1, t3)])
            assert isinstance(errors[0], ConcurrencyConflict) and errors[1] is None
            assert store.get("w1") == s1 and len(store.history("w1")) == 2  # nothing more
            assert store.get("w3") == s3 and store.history("w3")[-1] == t3[0]
            if isinstance(store, SupportsAtomic):  # inside the caller's transaction too
                store.create(self.snapshot("w4"))
                s4, t4 = running("w4")
                with store.atomic():
                    errors = store.write_transitions_together([(s4, 1, t4), (s2, 1, t2)])
                assert errors[0] is None and isinstance(errors[1], ConcurrencyConflict)
                assert store.get("w4") == s4 and store.history("w4") == t4

    def test_capability_write_behind_lands_each_write_on_its_own(self) -> None:
        with self._store() as store:
            self._declares(store, SupportsWriteBehind, "write_transitions_behind()")
            assert isinstance(store, SupportsWriteBehind)
            for task_id in ("b1", "b2"):
                store.create(self.snapshot(task_id))
                store.append(self.transition(task_id, 1, TaskStatus.QUEUED))
            trails = {
                task_id: [
                    self.transition(task_id, 2, TaskStatus.RUNNING, from_status=TaskStatus.QUEUED)
                ]
                for task_id in ("b1", "b2")
            }
            s1, s2 = (
                self.snapshot(t, status=TaskStatus.RUNNING, status_version=2, started_at=at(1))
                for t in ("b1", "b2")
            )
            # b2 expects a version it does not have: its write fails alone, b1's lands.
            pending = store.write_transitions_behind([(s1, 1, trails["b1"]), (s2, 5, trails["b2"])])
            pending.wait()  # committed (or failed) once it returns, and again at once
            pending.wait()
            assert pending.settled
            first, second = pending.errors()
            assert first is None and isinstance(second, ConcurrencyConflict)
            assert store.get("b1") == s1 and store.history("b1")[-1] == trails["b1"][0]
            stored = store.get("b2")
            assert stored is not None and stored.status_version == 1
            assert len(store.history("b2")) == 1  # nothing of it written
            served = store.write_transitions_behind([(s2, 1, trails["b2"])])
            served.serve()  # the store is free: committed now (else it rides another's)
            served.wait()
            assert served.errors() == [None] and store.get("b2") == s2

    def test_capability_renew_leases_sets_only_the_lease_of_the_listed_tasks(self) -> None:
        with self._store() as store:
            self._declares(store, SupportsRenewLeases, "renew_leases()")
            assert isinstance(store, SupportsRenewLeases)
            for task_id in ("r1", "r2", "other"):
                store.create(self.snapshot(task_id, status=TaskStatus.RUNNING, status_version=3))
            store.touch("other", lease_owner="node-b", lease_until=at(5))
            before = {t: store.get(t) for t in ("r1", "r2", "other")}
            store.renew_leases(["r1", "r2", "not-stored"], owner="node-a", until=at(60))
            for task_id in ("r1", "r2"):
                got = store.get(task_id)
                assert got is not None
                assert got.lease_owner == "node-a" and got.lease_until == at(60)
                assert replace(got, lease_owner=None, lease_until=None) == before[task_id]
            assert store.get("other") == before["other"]
            assert store.get("not-stored") is None
            store.renew_leases([], owner="node-a", until=at(90))  # nothing due: no error

    def test_capability_mark_lost_marks_only_tasks_that_did_not_move(self) -> None:
        with self._store() as store:
            self._declares(store, SupportsMarkLost, "mark_lost()")
            assert isinstance(store, SupportsMarkLost)
            store.create(self.snapshot("still", status=TaskStatus.RUNNING, status_version=3))
            store.create(self.snapshot("moved", status=TaskStatus.RUNNING, status_version=5))
            failure = Failure(kind=FailureKind.LOST, message="lease expired", carrier_may_run=True)
            marks = []
            for task_id in ("still", "moved"):
                lost = self.snapshot(
                    task_id,
                    status=TaskStatus.LOST,
                    status_version=4,
                    ended_at=at(9),
                    failure=failure,
                )
                marks.append(
                    (
                        lost,
                        self.transition(
                            task_id,
                            4,
                            TaskStatus.LOST,
                            from_status=TaskStatus.RUNNING,
                            reason="lease expired",
                            actor="reconciler@node-b",
                        ),
                    )
                )
            assert store.mark_lost(marks) == {"still"}
            still = store.get("still")
            assert still is not None and still.status is TaskStatus.LOST
            assert still.status_version == 4 and still.failure == failure
            assert still.ended_at == at(9)
            assert store.history("still") == [marks[0][1]]  # the trail row, every field
            moved = store.get("moved")
            assert moved is not None and moved.status is TaskStatus.RUNNING
            assert moved.status_version == 5 and store.history("moved") == []

    def test_capability_command_wakeups_wake_a_subscriber(self) -> None:
        with self._store() as store:
            self._declares(store, SupportsCommandWakeups, "subscribe_commands()")
            assert isinstance(store, SupportsCommandWakeups)
            woke = threading.Event()
            unsubscribe = store.subscribe_commands(woke.set)
            try:
                # The subscription may take a moment to start: keep submitting a while.
                for i in range(40):
                    store.submit_command(self.command(f"wake-{i}", i))
                    if woke.wait(0.25):
                        break
                assert woke.is_set(), "no wake-up within 10 s of submitting commands"
            finally:
                unsubscribe()

    def test_capability_transition_wakeups_wake_a_subscriber(self) -> None:
        with self._store() as store:
            self._declares(store, SupportsTransitionWakeups, "subscribe_transitions()")
            assert isinstance(store, SupportsTransitionWakeups)
            woke = threading.Event()
            unsubscribe = store.subscribe_transitions(woke.set)
            try:
                # The subscription may take a moment to start: keep appending a while.
                for i in range(40):
                    store.create(self.snapshot(f"woken-{i}"))
                    store.append(self.transition(f"woken-{i}", 1, TaskStatus.QUEUED))
                    if woke.wait(0.25):
                        break
                assert woke.is_set(), "no wake-up within 10 s of appending transitions"
                time.sleep(0.5)  # wake-ups of the appends above still on their way
                woke.clear()
                # Once subscribed, a single append is enough.
                store.append(
                    self.transition(
                        "woken-0", 2, TaskStatus.STARTING, from_status=TaskStatus.QUEUED
                    )
                )
                assert woke.wait(5), "no wake-up within 5 s of one append"
            finally:
                unsubscribe()

    def test_capability_node_registry_keeps_declarations(self) -> None:
        with self._store() as store:
            self._declares(store, SupportsNodeRegistry, "the node registry")
            assert isinstance(store, SupportsNodeRegistry)
            clock = store.storage_now if isinstance(store, SupportsStorageClock) else None

            def seen_near(record: NodeRecord, given: datetime) -> bool:
                # A store with its own clock writes its time, not the caller's.
                if clock is None:
                    return record.seen_at == given
                return abs((clock() - record.seen_at).total_seconds()) < 60

            def node(name: str) -> NodeRecord:
                found = [n for n in store.nodes() if n.node == name]
                assert len(found) == 1, f"{name}: {found}"
                return found[0]

            a = NodeRecord(
                node="node-a",
                buckets=frozenset({1, 2, 3}),
                num_buckets=64,
                ttl_seconds=30.0,
                started_at=at(0),
                seen_at=at(0),
                host="host-a",
                pid=101,
            )
            store.declare_node(a)
            store.declare_node(replace(a, node="node-b", buckets=None, num_buckets=8, pid=102))
            assert sorted(n.node for n in store.nodes()) == ["node-a", "node-b"]
            got = node("node-a")
            assert got.buckets == frozenset({1, 2, 3}) and got.num_buckets == 64
            assert got.ttl_seconds == 30.0 and got.host == "host-a" and got.pid == 101
            assert got.stopped_at is None and seen_near(got, at(0))
            b = node("node-b")
            assert b.buckets is None and b.num_buckets == 8  # no partition: every bucket
            store.declare_node(replace(a, buckets=frozenset({4})))  # buckets replaced
            assert node("node-a").buckets == frozenset({4})
            assert store.refresh_node("node-a", now=at(10)) is True
            assert seen_near(node("node-a"), at(10))
            assert store.refresh_node("nobody", now=at(10)) is False
            store.retire_node("node-a", now=at(20))
            retired = node("node-a")
            assert retired.stopped_at is not None and not retired.is_live(retired.seen_at)
            assert store.refresh_node("node-a", now=at(30)) is False  # declare again
            store.declare_node(replace(a, seen_at=at(40)))
            again = node("node-a")
            assert again.stopped_at is None and again.buckets == frozenset({1, 2, 3})

    def test_capability_schedule_registry_keeps_records(self) -> None:
        with self._store() as store:
            self._declares(store, SupportsScheduleRegistry, "the schedule registry")
            assert isinstance(store, SupportsScheduleRegistry)

            def keys() -> list[tuple[str, str]]:
                return [(r.node, r.name) for r in store.schedules()]

            a = ScheduleRecord(
                node="node-a",
                name="nightly",
                task="etl.load",
                trigger="cron '0 2 * * *' (UTC)",
                updated_at=at(0),
                next_fire_at=at(100),
            )
            store.declare_schedule(a)
            store.declare_schedule(replace(a, node="node-b"))
            store.declare_schedule(replace(a, name="hourly", next_fire_at=None))
            assert keys() == [("node-a", "hourly"), ("node-a", "nightly"), ("node-b", "nightly")]
            fired = replace(
                a,
                next_fire_at=at(200),
                last_fired_at=at(100),
                last_task_id="t-1",
                fired=1,
                skipped=2,
                updated_at=at(100),
            )
            store.declare_schedule(fired)  # replaces node-a's record of that name
            assert [r for r in store.schedules() if r.name == "nightly"] == [
                fired,
                replace(a, node="node-b"),
            ]
            store.forget_schedule("node-a", "nightly")
            store.forget_schedule("node-a", "never-declared")
            assert keys() == [("node-a", "hourly"), ("node-b", "nightly")]

    def test_capability_pipeline_registry_keeps_run_shapes(self) -> None:
        with self._store() as store:
            self._declares(store, SupportsPipelineRegistry, "the pipeline registry")
            assert isinstance(store, SupportsPipelineRegistry)
            first = PipelineRecord(
                pipeline_run_id="run-1",
                name="etl",
                node="node-a",
                created_at=at(0),
                tasks={"extract": "t1", "transform": "t2", "load": "t3"},
                depends_on={"transform": ("extract",), "load": ("transform", "extract")},
            )
            second = replace(first, pipeline_run_id="run-2", name="étl ✓", created_at=at(5))
            store.record_pipeline(first)
            store.record_pipeline(second)
            got = store.pipeline_record("run-1")
            assert got is not None and got.tasks == first.tasks
            assert got.depends_on.get("load") == ("transform", "extract")
            assert got.depends_on.get("extract", ()) == ()
            assert got.created_at == at(0) and got.node == "node-a"
            assert store.pipeline_record("run-3") is None
            assert [r.pipeline_run_id for r in store.pipeline_records()] == ["run-2", "run-1"]
            assert [r.name for r in store.pipeline_records(limit=1)] == ["étl ✓"]

    def test_capability_command_log_lists_finished_commands_by_finish(self) -> None:
        with self._store() as store:
            self._declares(store, SupportsCommandLog, "a command log")
            assert isinstance(store, SupportsCommandLog)
            for name in ("c1", "c2", "c3"):
                store.submit_command(self.command(name, 0))
            store.complete_command("c2", now=at(20), outcome="paused")
            store.complete_command("c1", now=at(30), outcome="already-terminal")
            done = store.finished_commands(after=at(0))
            assert [c.command_id for c in done] == ["c2", "c1"]  # c3 is still open
            assert done[0].finished_at == at(20) and done[0].outcome == "paused"
            assert [c.command_id for c in store.finished_commands(after=at(20))] == ["c1"]
            assert [c.command_id for c in store.finished_commands(after=at(0), limit=1)] == ["c2"]

    def test_capability_pending_commands_lists_a_tasks_open_commands_in_arrival_order(
        self,
    ) -> None:
        with self._store() as store:
            self._declares(store, SupportsPendingCommands, "pending commands")
            assert isinstance(store, SupportsPendingCommands)
            assert store.pending_commands("t1") == []
            for cid, created, task in (("c2", 2, "t1"), ("x", 0, "t2"), ("c1", 1, "t1")):
                store.submit_command(self.command(cid, created, task))
            assert [c.command_id for c in store.pending_commands("t1")] == ["c2", "c1"]
            store.claim_commands(now=at(10), lease_seconds=30, limit=1)  # c2: leased
            assert [c.command_id for c in store.pending_commands("t1")] == ["c2", "c1"]
            store.complete_command("c2", now=at(11), outcome="pausing")
            pending = store.pending_commands("t1")
            assert [c.command_id for c in pending] == ["c1"]
            assert pending[0].action is CommandAction.STOP and pending[0].issued_by == "tester"

    def test_capability_storage_clock_tells_aware_forward_time(self) -> None:
        with self._store() as store:
            self._declares(store, SupportsStorageClock, "a storage clock")
            assert isinstance(store, SupportsStorageClock)
            first, second = store.storage_now(), store.storage_now()
            assert first.tzinfo is UTC and second >= first

    def test_capability_task_scan_counts_and_finds_inside_the_store(self) -> None:
        with self._store() as store:
            self._declares(store, SupportsTaskScan, "the task scan")
            assert isinstance(store, SupportsTaskScan)
            q, r = TaskStatus.QUEUED, TaskStatus.RUNNING
            store.create(self.snapshot("a", bucket=1, created_at=at(0)))  # no lease
            store.create(
                self.snapshot(
                    "b",
                    status=r,
                    status_version=3,
                    bucket=5,
                    created_at=at(1),
                    lease_owner="n1",
                    lease_until=at(100),
                )
            )
            store.create(
                self.snapshot(
                    "c",
                    status=r,
                    status_version=3,
                    created_at=at(2),
                    lease_owner="n2",
                    lease_until=at(10),
                )
            )
            store.create(self.snapshot("d", status=TaskStatus.SUCCEEDED, bucket=1))
            store.append(self.transition("b", 3, r, at=at(30)))
            store.append(self.transition("c", 3, r, at=at(40)))
            active = frozenset({q, r})
            assert store.count_tasks("bucket") == {1: 2, 5: 1, None: 1}
            assert store.count_tasks("status", statuses=active) == {q: 1, r: 2}
            assert store.count_tasks("lease_owner", statuses=frozenset({r})) == {"n1": 1, "n2": 1}
            assert store.count_tasks("owner", statuses=frozenset()) == {}
            done = TaskStatus.SUCCEEDED
            assert store.count_tasks("bucket_status") == {
                (1, q): 1,
                (1, done): 1,
                (5, r): 1,
                (None, r): 1,
            }

            def scan(**filters: object) -> tuple[int, list[str]]:
                count, found = store.scan_tasks(TaskScan(statuses=active, **filters))  # type: ignore[arg-type]
                return count, self._ids(found)

            assert scan(lease_expired_at=at(50)) == (2, ["a", "c"])  # unset, or ended by then
            assert scan(outside=frozenset({1})) == (2, ["b", "c"])  # c has no bucket
            assert scan(buckets=frozenset({5})) == (1, ["b"])
            assert scan(unchanged_since=at(20)) == (1, ["a"])  # b, c changed at 30, 40
            assert scan(unchanged_since=at(35)) == (2, ["a", "b"])
            assert scan(limit=1) == (3, ["a"])  # the count is never limited
            assert scan(limit=0) == (3, [])
            assert scan(outside=frozenset()) == (3, ["a", "b", "c"])
            assert store.scan_tasks(TaskScan(statuses=frozenset())) == (0, [])

    def test_capability_mark_expired_lost_judges_and_marks_in_the_store(self) -> None:
        with self._store() as store:
            self._declares(store, SupportsMarkExpired, "mark_expired_lost()")
            assert isinstance(store, SupportsMarkExpired)
            r = TaskStatus.RUNNING

            def running(task_id: str, bucket: int, lease: float) -> TaskSnapshot:
                return self.snapshot(
                    task_id,
                    status=r,
                    status_version=3,
                    bucket=bucket,
                    lease_owner="n1",
                    lease_until=at(lease),
                )

            store.create(running("old", 1, 10))
            store.create(running("fresh", 1, 100))
            store.create(running("mine", 1, 10))  # held by the caller
            store.create(running("elsewhere", 9, 10))  # not in the scanned buckets
            store.create(self.snapshot("nolease", bucket=2))  # queued, no lease at all
            store.create(self.snapshot("done", status=TaskStatus.SUCCEEDED, bucket=1))
            before = {t: store.get(t) for t in ("fresh", "mine", "elsewhere", "done")}

            def verdict(owner: str | None) -> tuple[Failure, str]:
                failure = Failure(kind=FailureKind.LOST, message=f"lease of {owner}")
                return failure, f"reason {owner}"

            scan = TaskScan(
                statuses=states.LOSABLE,
                buckets=frozenset({1, 2}),
                lease_expired_at=at(50),
                limit=None,
            )
            marked = store.mark_expired_lost(
                scan, exclude=frozenset({"mine"}), at=at(60), actor="survivor", verdict=verdict
            )
            assert sorted(marked) == ["nolease", "old"]
            old = store.get("old")
            assert old is not None and old.status is TaskStatus.LOST
            assert old.status_version == 4 and old.ended_at == at(60)
            assert old.failure == Failure(kind=FailureKind.LOST, message="lease of n1")
            (trail,) = store.history("old")
            assert (trail.version, trail.from_status, trail.to_status) == (4, r, TaskStatus.LOST)
            assert trail.at == at(60) and trail.reason == "reason n1"
            assert trail.actor == "survivor"
            nolease = store.get("nolease")
            assert nolease is not None and nolease.status is TaskStatus.LOST
            assert nolease.failure is not None and nolease.failure.message == "lease of None"
            assert store.history("nolease")[-1].from_status is TaskStatus.QUEUED
            assert {t: store.get(t) for t in before} == before  # the rest untouched
            again = store.mark_expired_lost(
                scan, exclude=frozenset(), at=at(70), actor="survivor", verdict=verdict
            )
            assert again == ["mine"]  # once not held, the caller's own expired task too
