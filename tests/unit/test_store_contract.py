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


@pytest.mark.parametrize(
    ("ignored", "said"),
    [("after", "it ignores TaskQuery.after"), ("limit", "it ignores TaskQuery.limit")],
)
def test_a_store_that_ignores_a_query_field_fails_the_contract_naming_it(
    ignored: str, said: str
) -> None:
    """Before, paging a store that ignored ``after`` asked for the same page for ever."""
    from dataclasses import replace

    from chongming_task.model import TaskQuery

    class Careless(InMemoryTaskStore):
        def query(self, query: TaskQuery | None = None):  # type: ignore[no-untyped-def]
            query = query or TaskQuery()
            return super().query(replace(query, **{ignored: None}))

    class TestCareless(StoreContract):
        def make_store(self) -> TaskStore:
            return Careless()

    failures = TestCareless.verify()
    assert said in failures["test_query_pages_by_key_through_ties"]


def test_a_store_call_that_never_returns_fails_its_test_at_the_deadline() -> None:
    import threading

    from chongming_task.testing import ContractTimeout

    class Stuck(InMemoryTaskStore):
        def counts(self):  # type: ignore[no-untyped-def]
            threading.Event().wait()  # never returns

    class TestStuck(StoreContract):
        deadline = 0.5

        def make_store(self) -> TaskStore:
            return Stuck()

    with pytest.raises(ContractTimeout, match=r"ran past 0\.5 s"):
        TestStuck().test_counts_by_status()
