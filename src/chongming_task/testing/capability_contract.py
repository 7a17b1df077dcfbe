"""The capability section of the store contract: one test per optional capability
(``chongming_task.stores.capabilities``), run only where the store declares it; for the
others the test raises ``unittest.SkipTest`` (pytest shows it as a skip naming the
capability; ``StoreContract.verify()`` leaves it out)."""

from __future__ import annotations

from dataclasses import replace

from .. import states
from ..errors import ConcurrencyConflict, TaskAlreadyExists
from ..model import (
    Failure,
    FailureKind,
    Progress,
    TaskScan,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from ..stores.capabilities import (
    BatchedWrites,
    Maintenance,
    SupportsAtomic,
)
from ._contract_base import at, raises
from ._dedupe_contract import DedupeContract
from ._fleet_contract import FleetCapabilityContract
from ._retention_contract import RetentionContract

__all__ = ["CapabilityContract"]


class CapabilityContract(FleetCapabilityContract, DedupeContract, RetentionContract):
    # -- optional capabilities: each runs only where the store declares it -----------------

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
            self._declares(store, BatchedWrites, "create_many()")
            assert isinstance(store, BatchedWrites)

            def item(task_id: str) -> tuple[TaskSnapshot, Transition]:
                return self.snapshot(task_id), self.transition(task_id, 1, TaskStatus.QUEUED)

            store.create_many([item("m1"), item("m2"), item("m3")])
            assert self._ids(store.query()) == ["m1", "m2", "m3"]
            assert all(len(store.history(t)) == 1 for t in ("m1", "m2", "m3"))
            raises(TaskAlreadyExists, lambda: store.create_many([item("n1"), item("m2")]))
            assert store.get("n1") is None and store.history("n1") == []

    def test_capability_write_transitions_is_a_compare_and_set_with_its_trail(self) -> None:
        with self._store() as store:
            self._declares(store, BatchedWrites, "write_transitions()")
            assert isinstance(store, BatchedWrites)
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
            self._declares(store, BatchedWrites, "write_transitions_together()")
            assert isinstance(store, BatchedWrites)
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
            self._declares(store, BatchedWrites, "write_transitions_behind()")
            assert isinstance(store, BatchedWrites)
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
            self._declares(store, BatchedWrites, "renew_leases()")
            assert isinstance(store, BatchedWrites)
            for task_id in ("r1", "r2", "other"):
                store.create(self.snapshot(task_id, status=TaskStatus.RUNNING, status_version=3))
            store.touch("other", lease_owner="node-b", lease_until=at(5))
            before = {t: store.get(t) for t in ("r1", "r2", "other")}
            renewed = store.renew_leases(["r1", "r2", "not-stored"], owner="node-a", until=at(60))
            assert sorted(renewed) == ["r1", "r2"]
            for task_id in ("r1", "r2"):
                got = store.get(task_id)
                assert got is not None
                assert got.lease_owner == "node-a" and got.lease_until == at(60)
                assert replace(got, lease_owner=None, lease_until=None) == before[task_id]
            assert store.get("other") == before["other"]
            assert store.get("not-stored") is None
            assert store.renew_leases([], owner="node-a", until=at(90)) == []  # nothing due

    def test_capability_renew_leases_leaves_finished_rows_and_other_owners_alone(
        self,
    ) -> None:
        with self._store() as store:
            self._declares(store, BatchedWrites, "renew_leases()")
            assert isinstance(store, BatchedWrites)
            store.create(self.snapshot("mine", status=TaskStatus.RUNNING))
            store.create(self.snapshot("lost", status=TaskStatus.LOST))
            store.create(self.snapshot("theirs", status=TaskStatus.RUNNING))
            store.touch("mine", lease_owner="node-a", lease_until=at(5))
            store.touch("theirs", lease_owner="node-b", lease_until=at(5))
            before = {t: store.get(t) for t in ("lost", "theirs")}
            renewed = store.renew_leases(["mine", "lost", "theirs"], owner="node-a", until=at(60))
            assert renewed == ["mine"]
            mine = store.get("mine")
            assert mine is not None and mine.lease_until == at(60)
            assert {t: store.get(t) for t in ("lost", "theirs")} == before

    def test_capability_write_activity_writes_only_unfinished_rows_of_the_owner(
        self,
    ) -> None:
        with self._store() as store:
            self._declares(store, BatchedWrites, "write_activity()")
            assert isinstance(store, BatchedWrites)
            store.create(self.snapshot("mine", status=TaskStatus.RUNNING))
            store.create(self.snapshot("done", status=TaskStatus.SUCCEEDED))
            store.create(self.snapshot("theirs", status=TaskStatus.RUNNING))
            store.touch("mine", lease_owner="node-a", lease_until=at(5))
            store.touch("theirs", lease_owner="node-b", lease_until=at(5))
            before = {t: store.get(t) for t in ("done", "theirs")}
            items = [
                (task_id, Progress(current=3, message="three"), at(7))
                for task_id in ("mine", "done", "theirs", "ghost")
            ]
            assert store.write_activity(items, owner="node-a") == ["mine"]
            mine = store.get("mine")
            assert mine is not None
            assert mine.progress == Progress(current=3, message="three")
            assert mine.last_heartbeat_at == at(7) and mine.lease_until == at(5)
            assert mine.status_version == 1
            # None leaves a column as it is.
            assert store.write_activity([("mine", None, at(8))], owner="node-a") == ["mine"]
            again = store.get("mine")
            assert again is not None and again.progress == mine.progress
            assert again.last_heartbeat_at == at(8)
            assert {t: store.get(t) for t in ("done", "theirs")} == before
            assert store.write_activity([], owner="node-a") == []

    def test_capability_mark_lost_marks_only_tasks_that_did_not_move(self) -> None:
        with self._store() as store:
            self._declares(store, BatchedWrites, "mark_lost()")
            assert isinstance(store, BatchedWrites)
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

    def test_capability_task_scan_counts_and_finds_inside_the_store(self) -> None:
        with self._store() as store:
            self._declares(store, Maintenance, "the task scan")
            assert isinstance(store, Maintenance)
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
            self._declares(store, Maintenance, "mark_expired_lost()")
            assert isinstance(store, Maintenance)
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
