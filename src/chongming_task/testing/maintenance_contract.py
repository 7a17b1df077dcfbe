"""The ``Maintenance`` section of the store contract: work over many tasks in the store
(counts, scans, reconcile in one step, retention, late reports). Each test runs only
where the store declares the role whole, else raises ``unittest.SkipTest``."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from .. import states
from ..late import LateReport
from ..model import (
    Failure,
    FailureKind,
    TaskScan,
    TaskSnapshot,
    TaskStatus,
)
from ..stores.protocol import TaskStore
from ..stores.roles import (
    Maintenance,
)
from .contract_base import ContractBase, at, raises

__all__ = ["MaintenanceContract"]

S = TaskStatus


class MaintenanceContract(ContractBase):
    def _filled(self, store: TaskStore) -> None:
        """Tasks created at 0..9 s: finished ones ended at created + 100 s (so ``o*``
        ended at 100-104 s), one ended late (``late``: at 500 s), unfinished ones."""
        rows = [
            ("o0", S.SUCCEEDED, 0, 0),
            ("o1", S.FAILED, 1, 1),
            ("o2", S.STOPPED, 2, 0),
            ("o3", S.CANCELLED, 3, 1),
            ("o4", S.LOST, 4, None),
            ("late", S.SUCCEEDED, 5, 0),
            ("run", S.RUNNING, 6, 0),
            ("wait", S.QUEUED, 7, 1),
            ("held", S.PAUSED, 8, None),
        ]
        for task_id, status, created, bucket in rows:
            finished = status in (S.SUCCEEDED, S.FAILED, S.STOPPED, S.CANCELLED, S.LOST)
            ended = None if not finished else at(500 if task_id == "late" else created + 100)
            snapshot = self.snapshot(
                task_id, status=status, created_at=at(created), ended_at=ended, bucket=bucket
            )
            store.create(snapshot)
            store.append(self.transition(task_id, 1, status))

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

    def test_capability_late_reports_are_kept_beside_the_task_and_pruned_with_it(
        self,
    ) -> None:
        with self._store() as store:
            self._declares(store, Maintenance, "late reports")
            assert isinstance(store, Maintenance)
            failure = Failure(kind=FailureKind.EXCEPTION, message="ValueError: no")
            for task_id in ("done", "broke"):
                store.create(self.snapshot(task_id, status=TaskStatus.LOST, created_at=at(0)))
            assert store.late_reports() == [] and store.count_late_reports() == 0
            done = LateReport(
                task_id="done",
                reported_by="node-a",
                reported_at=at(10),
                status=TaskStatus.SUCCEEDED,
                stored_status=TaskStatus.LOST,
                ended_at=at(9),
                outcome={"rows": 3, "name": "é ✓"},
            )
            broke = LateReport(
                task_id="broke",
                reported_by="node-a",
                reported_at=at(20),
                status=TaskStatus.FAILED,
                stored_status=TaskStatus.LOST,
                ended_at=at(19),
                failure=failure,
            )
            store.record_late_report(done)
            store.record_late_report(broke)
            assert store.late_reports() == [broke, done]  # newest first
            assert store.late_reports(task_ids=["done", "ghost"]) == [done]
            assert store.late_reports(task_ids=[]) == []
            assert store.late_reports(limit=1) == [broke]
            assert store.count_late_reports() == 2
            again = replace(done, reported_at=at(30), outcome=[1, 2])
            store.record_late_report(again)  # one per task: replaced
            assert store.late_reports(task_ids=["done"]) == [again]
            kept = store.get("done")
            assert kept is not None and kept.status is TaskStatus.LOST  # never a change
            assert store.prune(keep_terminal=0) == 2
            assert store.late_reports() == [] and store.count_late_reports() == 0

    def test_capability_prune_by_age_deletes_finished_tasks_that_ended_before(self) -> None:
        with self._store() as store:
            self._declares(store, Maintenance, "prune_ended()")
            assert isinstance(store, Maintenance)
            self._filled(store)
            cutoff = at(1000)  # every task is older; only finished ones go
            assert store.count_ended(before=at(103)) == 3  # o0, o1, o2 ended before it
            assert store.count_ended(before=cutoff) == 6
            assert store.count_ended(before=cutoff, statuses=frozenset({S.SUCCEEDED})) == 2
            assert store.count_ended(before=cutoff, buckets=frozenset({1})) == 2
            # Oldest first, in batches: fewer than the limit means none is left.
            assert store.prune_ended(before=at(103), limit=2) == 2
            assert self._ids(store.query()) == ["o2", "o3", "o4", "late", "run", "wait", "held"]
            assert store.history("o0") == [] and store.history("o1") == []
            assert store.prune_ended(before=at(103), limit=2) == 1  # o2; o3 ended at 103
            assert store.prune_ended(before=at(103), limit=2) == 0
            # Narrowed by status and bucket.
            assert store.prune_ended(before=cutoff, statuses=frozenset({S.LOST})) == 1
            assert store.prune_ended(before=cutoff, buckets=frozenset({0})) == 1  # late
            assert self._ids(store.query()) == ["o3", "run", "wait", "held"]
            assert store.prune_ended(before=cutoff) == 1
            assert self._ids(store.query()) == ["run", "wait", "held"]  # never unfinished
            assert len(store.history("run")) == 1
            assert store.count_ended(before=cutoff) == 0

    def test_capability_prune_by_age_refuses_what_it_cannot_mean(self) -> None:
        with self._store() as store:
            self._declares(store, Maintenance, "prune_ended()")
            assert isinstance(store, Maintenance)
            self._filled(store)
            naive = at(1000).replace(tzinfo=None)
            for call in (
                lambda: store.prune_ended(before=naive),
                lambda: store.prune_ended(before=at(1000), limit=0),
                lambda: store.prune_ended(before=at(1000), statuses=frozenset({S.RUNNING})),
                lambda: store.count_ended(before=at(1000), statuses=frozenset({S.QUEUED})),
            ):
                raises(ValueError, call)
            assert len(store.query()) == 9  # nothing deleted

    def test_capability_ended_timeline_counts_finished_tasks_per_slot(self) -> None:
        with self._store() as store:
            self._declares(store, Maintenance, "ended_timeline()")
            assert isinstance(store, Maintenance)
            self._filled(store)  # o0-o4 ended at 100-104 s, late at 500 s
            two = timedelta(seconds=2)
            assert store.ended_timeline(since=at(100), width=two) == {
                (0, S.SUCCEEDED): 1,  # o0
                (0, S.FAILED): 1,  # o1
                (1, S.STOPPED): 1,  # o2: 102 s starts slot 1
                (1, S.CANCELLED): 1,
                (2, S.LOST): 1,
                (200, S.SUCCEEDED): 1,  # late
            }
            # A slot's edges hold to the microsecond: o1 (101 s) is in, o0 is not, and o3
            # (103 s) opens slot 1 exactly.
            assert store.ended_timeline(since=at(101), width=two) == {
                (0, S.FAILED): 1,
                (0, S.STOPPED): 1,
                (1, S.CANCELLED): 1,
                (1, S.LOST): 1,
                (199, S.SUCCEEDED): 1,
            }
            tick = timedelta(microseconds=1)
            assert store.ended_timeline(since=at(103) - tick, width=tick) == {
                (1, S.CANCELLED): 1,
                (1_000_001, S.LOST): 1,
                (397_000_001, S.SUCCEEDED): 1,
            }
            assert store.ended_timeline(since=at(501), width=two) == {}
            for call in (
                lambda: store.ended_timeline(since=at(0).replace(tzinfo=None), width=two),
                lambda: store.ended_timeline(since=at(0), width=timedelta(0)),
            ):
                raises(ValueError, call)

    def test_capability_prune_by_age_deletes_finished_commands_oldest_first(self) -> None:
        with self._store() as store:
            self._declares(store, Maintenance, "prune_ended()")
            assert isinstance(store, Maintenance)
            for i in range(4):
                store.submit_command(self.command(f"c{i}", i, task_id=f"t{i}"))
            for i, finished in ((2, 30), (0, 10), (1, 20)):  # c3 stays open
                store.complete_command(f"c{i}", now=at(finished), outcome="stopping")
            assert store.count_finished_commands(before=at(25)) == 2
            assert store.prune_finished_commands(before=at(25), limit=1) == 1  # c0
            assert store.count_finished_commands(before=at(1000)) == 2
            assert store.prune_finished_commands(before=at(25)) == 1  # c1
            assert store.prune_finished_commands(before=at(25)) == 0
            assert store.prune_finished_commands(before=at(1000)) == 1  # c2
            # The open command is never deleted, however old.
            claimed = store.claim_commands(now=at(2000), lease_seconds=60)
            assert [c.command_id for c in claimed] == ["c3"]
            for call in (
                lambda: store.prune_finished_commands(before=at(0).replace(tzinfo=None)),
                lambda: store.prune_finished_commands(before=at(0), limit=0),
            ):
                raises(ValueError, call)
