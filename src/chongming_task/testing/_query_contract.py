"""The name-glob section of the store contract: ``TaskQuery.name_glob`` selects what
``fnmatch.fnmatchcase`` would, whatever the characters of the names."""

from __future__ import annotations

from fnmatch import fnmatchcase

from ..model import TaskQuery
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
