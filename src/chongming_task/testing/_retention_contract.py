"""The retention section of the store contract: finished tasks deleted by when they
ended, in batches, oldest first, with their trail, unfinished ones never, whatever their
age (``Maintenance``); and counted by when they ended, to the microsecond
(``Maintenance``)."""

from __future__ import annotations

from datetime import timedelta

from ..model import TaskStatus
from ..stores.capabilities import Maintenance
from ..stores.protocol import TaskStore
from ._contract_base import ContractBase, at, raises

__all__ = ["RetentionContract"]

S = TaskStatus


class RetentionContract(ContractBase):
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
