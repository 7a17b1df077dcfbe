"""Late reports (``Maintenance``) written once for both SQL stores: what a node
reported of a task after the store had ended it without it (docs/design.md, "Late
truth"), kept beside the task and pruned with it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager

from ..late import LateReport
from . import codec
from ._sql import Executor, json_id_list

__all__ = ["LateReportsSQL"]


class LateReportsSQL:
    """Mixin: a store gives ``_sql`` (statements ``record_late_report``,
    ``late_reports_of``, ``late_reports``, ``count_late_reports``) and ``_sql_scope``;
    ``_id_list`` spells a list of task ids as the store binds it."""

    __slots__ = ()

    _sql: Mapping[str, str]

    def _sql_scope(self, what: str, *, write: bool) -> AbstractContextManager[Executor]:
        raise NotImplementedError

    _id_list = staticmethod(json_id_list)

    def record_late_report(self, report: LateReport) -> None:
        """``Maintenance``."""
        values = codec.late_report_to_values(report)
        with self._sql_scope("record_late_report", write=True) as cur:
            cur.execute(self._sql["record_late_report"], values)

    def late_reports(
        self, *, task_ids: Sequence[str] | None = None, limit: int = 100
    ) -> list[LateReport]:
        """``Maintenance``."""
        with self._sql_scope("late_reports", write=False) as cur:
            if task_ids is None:
                rows = cur.execute(self._sql["late_reports"], (limit,)).fetchall()
            elif not task_ids:
                return []
            else:
                rows = cur.execute(
                    self._sql["late_reports_of"], (self._id_list(task_ids),)
                ).fetchall()
        return [codec.values_to_late_report(r) for r in rows][:limit]

    def count_late_reports(self) -> int:
        """``Maintenance``."""
        with self._sql_scope("count_late_reports", write=False) as cur:
            (count,) = cur.execute(self._sql["count_late_reports"]).fetchone()
        return int(count)
