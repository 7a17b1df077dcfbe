"""The ``BatchedWrites`` section of the store contract: many rows in one transaction
(creates, a run's writes, leases, activity, reconcile's marks, dedupe keys). Each test
runs only where the store declares the role whole, else raises ``unittest.SkipTest``."""

from __future__ import annotations

from dataclasses import replace

from ..errors import ConcurrencyConflict, TaskAlreadyExists
from ..model import (
    Failure,
    FailureKind,
    Progress,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from ..stores.roles import (
    BatchedWrites,
    SupportsAtomic,
)
from .contract_base import ContractBase, at, raises

__all__ = ["BatchedWritesContract"]


class BatchedWritesContract(ContractBase):
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

    def test_capability_dedupe_one_unfinished_task_holds_a_key(self) -> None:
        with self._store() as store:
            self._declares(store, BatchedWrites, "create_deduped()")
            assert isinstance(store, BatchedWrites)

            def submit(task_id: str, key: str, when: float) -> str | None:
                made = self.snapshot(task_id, dedupe_key=key, created_at=at(when))
                created = self.transition(task_id, 1, TaskStatus.QUEUED)
                return store.create_deduped(made, created)

            assert submit("d1", "k", 1) is None  # created, with its first transition
            assert store.get("d1") is not None and len(store.history("d1")) == 1
            assert store.get("d1").dedupe_key == "k"  # type: ignore[union-attr]
            # A duplicate gets the holder's id and writes nothing.
            assert submit("d2", "k", 2) == "d1"
            assert store.get("d2") is None and store.history("d2") == []
            assert submit("o1", "other", 2) is None  # another key: its own task
            # Running still holds it; once the holder ends the key is free again.
            running = self.snapshot("d1", dedupe_key="k", status=TaskStatus.RUNNING)
            store.save(running.evolve(status_version=2), expect_version=1)
            assert submit("d3", "k", 3) == "d1"
            ended = running.evolve(status=TaskStatus.FAILED, status_version=3, ended_at=at(4))
            store.save(ended, expect_version=2)
            assert submit("d4", "k", 5) is None
            assert submit("d5", "k", 6) == "d4"

    def test_capability_dedupe_a_success_keeps_its_key_for_its_window(self) -> None:
        with self._store() as store:
            self._declares(store, BatchedWrites, "create_deduped()")
            assert isinstance(store, BatchedWrites)
            made = self.snapshot("w1", dedupe_key="daily", dedupe_window=60.0)
            assert store.create_deduped(made, self.transition("w1", 1, TaskStatus.QUEUED)) is None
            done = made.evolve(status=TaskStatus.SUCCEEDED, status_version=2, ended_at=at(10))
            store.save(done, expect_version=1)
            stored = store.get("w1")
            assert stored is not None and stored.dedupe_window == 60.0

            def again(task_id: str, when: float) -> str | None:
                snapshot = self.snapshot(task_id, dedupe_key="daily", created_at=at(when))
                return store.create_deduped(
                    snapshot, self.transition(task_id, 1, TaskStatus.QUEUED)
                )

            assert again("w2", 30) == "w1"  # 20 s after its success: inside the window
            assert store.get("w2") is None
            assert again("w3", 71) is None  # 61 s after: free
