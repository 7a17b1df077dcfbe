"""Every built-in store runs the shipped contract."""

from __future__ import annotations

from pathlib import Path

import pytest

from chongming_task.stores import InMemoryTaskStore, SqliteTaskStore, TaskStore
from chongming_task.testing import StoreContract


class TestInMemoryStore(StoreContract):
    def make_store(self) -> TaskStore:
        return InMemoryTaskStore()


class TestSqliteMemoryStore(StoreContract):
    def make_store(self) -> TaskStore:
        return SqliteTaskStore(":memory:")


class TestSqliteFileStore(StoreContract):
    @pytest.fixture(autouse=True)
    def _dir(self, tmp_path: Path) -> None:
        self._tmp = tmp_path
        self._n = 0

    def make_store(self) -> TaskStore:
        self._n += 1
        return SqliteTaskStore(self._tmp / f"store-{self._n}.db")


def test_verify_reports_no_failure_for_a_correct_store() -> None:
    assert TestInMemoryStore.verify() == {}


def test_verify_catches_a_store_that_clobbers_the_lease() -> None:
    class ClobberingStore(InMemoryTaskStore):
        def save(self, snapshot, *, expect_version):  # type: ignore[no-untyped-def]
            with self._lock:
                current = self._tasks[snapshot.task_id]
                if current.status_version != expect_version:
                    from chongming_task.errors import ConcurrencyConflict

                    raise ConcurrencyConflict("conflict")
                self._tasks[snapshot.task_id] = snapshot  # the original defect

    class TestClobbering(StoreContract):
        def make_store(self) -> TaskStore:
            return ClobberingStore()

    failures = TestClobbering.verify()
    assert "test_save_does_not_clobber_the_lease" in failures
