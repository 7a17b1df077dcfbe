"""The traits' section of the store contract: ``atomic()``, the storage clock and
result previews, each tested only where the store declares it."""

from __future__ import annotations

import json
from datetime import UTC

from ..model import (
    Failure,
    FailureKind,
    TaskStatus,
)
from ..stores.roles import (
    PREVIEW,
    Previewed,
    SupportsAtomic,
    SupportsResultPreview,
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

    def test_capability_result_preview_reads_a_long_result_no_further_than_its_start(
        self,
    ) -> None:
        with self._store() as store:
            self._declares(store, SupportsResultPreview, "result previews")
            assert isinstance(store, SupportsResultPreview)
            done = TaskStatus.SUCCEEDED
            results = {
                "none": None,
                "small": {"rows": 3, "name": "ok"},
                # JSON text of exactly PREVIEW characters (a string: its quotes and its
                # characters, however many bytes each): held whole.
                "exact": "é" * (PREVIEW - 2),
                "over": "x" * (PREVIEW - 1),
                "long": [{"i": i, "text": "ü" * 20} for i in range(2000)],
            }
            for task_id, outcome in results.items():
                store.create(self.snapshot(task_id, status=done, outcome=outcome))
            failure = Failure(kind=FailureKind.EXCEPTION, message="boom", traceback="tb\n" * 9)
            store.create(self.snapshot("failed", status=TaskStatus.FAILED, failure=failure))
            for task_id in ("none", "small", "exact", "failed"):
                whole = store.get(task_id)
                assert whole is not None
                assert store.get_previewed(task_id) == Previewed(whole), task_id
            for task_id in ("over", "long"):
                whole = store.get(task_id)
                found = store.get_previewed(task_id)
                assert whole is not None and found is not None
                assert found.snapshot == whole.evolve(outcome=None), task_id
                assert found.preview is not None and len(found.preview) == PREVIEW
                text = store.result_json(task_id)
                assert text is not None and text.startswith(found.preview), task_id
                assert json.loads(text) == results[task_id]
            assert json.loads(store.result_json("small") or "null") == results["small"]
            assert store.result_json("none") is None
            assert store.get_previewed("nope") is None and store.result_json("nope") is None
