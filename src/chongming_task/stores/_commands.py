"""The command queue written once for both SQL stores: commands handed out in the order
the store received them, one task's commands never out of that order
(docs/design.md, "Commands"), through each store's own statements and transaction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta

from ..model import Command, utc
from . import codec
from ._sql import Executor

__all__ = ["CommandQueueSQL", "in_arrival_order"]

_SCAN = 1000
"""Open commands a claim reads at most (in arrival order): the rule needs only the
commands before the ones it hands out, so a cut never breaks it."""


def in_arrival_order(open_commands: Sequence[tuple[str, str, bool]], *, limit: int) -> list[str]:
    """The ids a claim may lease, from ``(command_id, task_id, leased)`` of the open
    commands in arrival order: every one not leased, except those behind a leased (or
    skipped) command of the same task, at most ``limit``. A command whose ``leased`` is
    true is held by another claimer (its lease lives, or it is locked mid-claim)."""
    held: set[str] = set()
    picked: list[str] = []
    for command_id, task_id, leased in open_commands:
        if leased or task_id in held:
            held.add(task_id)
            continue
        if len(picked) == limit:
            held.add(task_id)  # the rest of this task waits for the next claim
            continue
        picked.append(command_id)
    return picked


class CommandQueueSQL:
    """Mixin: claim, complete, release and look up commands. A store gives ``_sql`` (its
    named statements: ``open_commands``, ``lease_command``, ``complete_command``,
    ``release_command``, ``pending_commands``, ``finished_commands``), ``_sql_scope``
    and, where claimers run side by side, ``_lock_commands``."""

    __slots__ = ()

    _sql: Mapping[str, str]

    def _sql_scope(self, what: str, *, write: bool) -> AbstractContextManager[Executor]:
        raise NotImplementedError

    def _lock_commands(self, cur: Executor, ids: list[str], now: str) -> set[str]:
        """Which of ``ids`` this claim holds and may lease: all of them in a store whose
        write transaction already excludes every other claimer."""
        return set(ids)

    def claim_commands(
        self, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        return self._claim(None, now=now, lease_seconds=lease_seconds, limit=limit)

    def claim_commands_for(
        self, holder: str, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        """``CommandChannel``."""
        return self._claim(holder, now=now, lease_seconds=lease_seconds, limit=limit)

    def _claim(
        self, holder: str | None, *, now: datetime, lease_seconds: float, limit: int
    ) -> list[Command]:
        now = utc(now, "now")
        at = codec.encode_dt(now)
        until = codec.encode_dt(now + timedelta(seconds=lease_seconds))
        with self._sql_scope("claim_commands", write=True) as cur:
            if holder is None:
                rows = cur.execute(self._sql["open_commands"], (at, _SCAN)).fetchall()
            else:
                read = self._sql["open_commands_for"]
                rows = cur.execute(read, (at, holder, _SCAN)).fetchall()
            chosen = in_arrival_order([(r[1], r[2], bool(r[0])) for r in rows], limit=limit)
            if not chosen:
                return []
            held = self._lock_commands(cur, chosen, at)
            wanted = set(chosen)
            marks = [(r[1], r[2], r[1] not in held) for r in rows if r[1] in wanted]
            picked = in_arrival_order(marks, limit=limit)
            cur.executemany(self._sql["lease_command"], [(until, cid) for cid in picked])
        by_id = {r[1]: r for r in rows}
        return [
            codec.values_to_command((*by_id[cid][1:7], until, *by_id[cid][8:])) for cid in picked
        ]

    def pending_commands(self, task_id: str) -> list[Command]:
        """``CommandChannel``."""
        with self._sql_scope("pending_commands", write=False) as cur:
            rows = cur.execute(self._sql["pending_commands"], (task_id,)).fetchall()
        return [codec.values_to_command(r) for r in rows]

    def finished_commands(self, *, after: datetime, limit: int = 500) -> list[Command]:
        """``CommandChannel``."""
        with self._sql_scope("finished_commands", write=False) as cur:
            rows = cur.execute(
                self._sql["finished_commands"], (codec.encode_dt(utc(after, "after")), limit)
            ).fetchall()
        return [codec.values_to_command(r) for r in rows]

    def complete_command(
        self, command_id: str, *, now: datetime, outcome: str | None = None
    ) -> None:
        with self._sql_scope("complete_command", write=True) as cur:
            cur.execute(self._sql["complete_command"], (codec.encode_dt(now), outcome, command_id))

    def release_command(self, command_id: str, *, now: datetime) -> None:
        with self._sql_scope("release_command", write=True) as cur:
            cur.execute(self._sql["release_command"], (command_id,))
