"""The list section of the store contract: ``TaskQuery.name_glob`` selects what
``fnmatch.fnmatchcase`` would, whatever the characters of the names; ``after`` pages
through a query by ``(created_at, task_id)``, ties and both orders included; a
``brief`` query lists the same tasks, at most without their heavy parts."""

from __future__ import annotations

from dataclasses import replace
from fnmatch import fnmatchcase

from ..model import BRIEF_MESSAGE, Failure, FailureKind, Progress, TaskQuery, TaskStatus
from ._contract_base import ContractBase, at

__all__ = ["QueryContract"]

NAMES = [
    "etl.load",
    "etl.extract",
    "etl",
    "etlx",
    "ETL.load",
    "a%b_c",
    "a.b.c",
    "br[ack]et",
    "back\\slash",
    "caret^x",
    "dash-y",
    "naïve.步骤",
    "line\nbreak",
]

GLOBS = [
    "etl.*",
    "etl",
    "etl*",
    "etl?load",
    "*.load",
    "ETL*",
    "a%b_c",
    "a_b%c",
    "a?b?c",
    "a.b.c",
    "br[[]ack]et",
    "br[ack]et",
    "br[!x]ck]et",
    "back\\*",
    "*^*",
    "caret[^]x",
    "dash[-]y",
    "[d-e]*",
    "[!a-e]*",
    "[z-a]*",
    "[!z-a]*",
    "[a-c-e]*",
    "*[.-.]*",
    "naïve.*",
    "*步骤",
    "line?break",
    "line*",
    "*",
    "[",
    "x[",
    "",
]


class QueryContract(ContractBase):
    def test_query_by_name_glob_is_fnmatchcase(self) -> None:
        with self._store() as store:
            for n, name in enumerate(NAMES):
                store.create(self.snapshot(f"g{n:02d}", name=name, created_at=at(n)))
            for glob in GLOBS:
                expected = [f"g{n:02d}" for n, name in enumerate(NAMES) if fnmatchcase(name, glob)]
                found = [s.task_id for s in store.query(TaskQuery(name_glob=glob))]
                assert found == expected, (glob, found, expected)
            limited = store.query(TaskQuery(name_glob="etl*", limit=2, newest_first=True))
            assert [s.task_id for s in limited] == ["g03", "g02"]

    def test_query_pages_by_key_through_ties(self) -> None:
        with self._store() as store:
            for n in range(5):
                store.create(self.snapshot(f"t{n}", created_at=at(n)))
            for task_id in ["u3", "u1", "u2", "u0"]:  # four created at one instant
                store.create(self.snapshot(task_id, created_at=at(2)))
            for newest_first in (True, False):
                whole = self._ids(store.query(TaskQuery(newest_first=newest_first)))
                pages: list[str] = []
                after = None
                while True:
                    page = store.query(TaskQuery(newest_first=newest_first, limit=2, after=after))
                    if not page:
                        break
                    pages += self._ids(page)
                    after = (page[-1].created_at, page[-1].task_id)
                assert pages == whole, (newest_first, pages, whole)
            assert self._ids(store.query(TaskQuery(newest_first=True)))[:3] == ["t4", "t3", "u3"]
            older = TaskQuery(
                newest_first=True, after=(at(2), "u1"), statuses=frozenset({TaskStatus.QUEUED})
            )
            assert self._ids(store.query(older)) == ["u0", "t2", "t1", "t0"]

    def test_a_brief_query_lists_the_same_tasks_without_more_than_it_shows(self) -> None:
        message = "m" * (BRIEF_MESSAGE * 3)
        failure = Failure(kind=FailureKind.EXCEPTION, message="boom", traceback="Traceback ...")
        with self._store() as store:
            store.create(
                self.snapshot(
                    "heavy",
                    status=TaskStatus.SUCCEEDED,
                    outcome={"rows": ["x" * 1000] * 50},
                    progress=Progress(current=1, total=2, message=message),
                )
            )
            store.create(self.snapshot("failed", status=TaskStatus.FAILED, failure=failure))
            whole = {s.task_id: s for s in store.query()}
            brief = {s.task_id: s for s in store.query(TaskQuery(brief=True))}
            assert brief.keys() == whole.keys()
            heavy = brief["heavy"]
            assert heavy.outcome in (None, whole["heavy"].outcome)
            assert heavy.progress is not None and heavy.progress.message is not None
            assert (heavy.progress.current, heavy.progress.total) == (1, 2)
            assert heavy.progress.message in (message, message[:BRIEF_MESSAGE])
            cut = brief["failed"].failure
            assert cut is not None and (cut.kind, cut.message) == (failure.kind, "boom")
            assert cut.traceback in (None, failure.traceback)
            same = ("task_id", "name", "status", "status_version", "created_at", "tags")
            for task_id, s in brief.items():
                assert replace(s, outcome=None, progress=None, failure=None) == replace(
                    whole[task_id], outcome=None, progress=None, failure=None
                ), task_id
                assert all(getattr(s, f) == getattr(whole[task_id], f) for f in same)
