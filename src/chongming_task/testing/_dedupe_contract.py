"""The dedupe section of the store contract (``BatchedWrites``): a key identifies at
most one unfinished task in the store; it is free again once that task ends, or, after a
success with a ``dedupe_window``, once the window has passed."""

from __future__ import annotations

from ..model import TaskStatus
from ..stores.capabilities import BatchedWrites
from ._contract_base import ContractBase, at

__all__ = ["DedupeContract"]


class DedupeContract(ContractBase):
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
