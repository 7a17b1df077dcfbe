"""The traits' section of the store contract: ``atomic()`` and the storage clock, each
tested only where the store declares it."""

from __future__ import annotations

from datetime import UTC

from ..model import (
    TaskStatus,
)
from ..stores.roles import (
    SupportsAtomic,
    SupportsStorageClock,
)
from .contract_base import ContractBase

__all__ = ["TraitsContract"]


class TraitsContract(ContractBase):
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

    def test_capability_storage_clock_tells_aware_forward_time(self) -> None:
        with self._store() as store:
            self._declares(store, SupportsStorageClock, "a storage clock")
            assert isinstance(store, SupportsStorageClock)
            first, second = store.storage_now(), store.storage_now()
            assert first.tzinfo is UTC and second >= first
