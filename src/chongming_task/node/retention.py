"""A node's retention: its own buckets' finished tasks deleted once they ended longer
ago than the node's ``retention`` says, and finished commands once older than the
longest of its ages (docs/design.md, "Retention").

One batch a pass, each one short transaction of the store (``Maintenance``); the
next pass follows at once while a batch came back full, else after ``interval``. The
loop runs on its own thread, off every task's path; between batches the node's own
writes go first."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta

from ..errors import ConfigurationError, StoreUnavailable
from ..model import TaskStatus
from ..states import TERMINAL
from .services import LoopService, NodeContext, Pass

__all__ = ["RetentionLoop", "retention_rules"]

log = logging.getLogger("chongming_task.retention")

EVERY = "*"
"""The key of a rule for every finished status without one of its own."""


def retention_rules(given: Mapping[str | TaskStatus, timedelta]) -> dict[TaskStatus, timedelta]:
    """Each finished status's age from ``given``: keys are finished statuses (names or
    ``TaskStatus``) or ``"*"`` for the others, values positive ``timedelta``s. A status
    left out (with no ``"*"``) is kept for ever. ``ConfigurationError`` for the rest."""
    rules: dict[TaskStatus, timedelta] = {}
    every: timedelta | None = None
    for key, kept in given.items():
        if not isinstance(kept, timedelta) or kept <= timedelta(0):
            raise ConfigurationError(
                f"retention[{key!r}] must be a positive timedelta, got {kept!r}"
            )
        if key == EVERY:
            every = kept
            continue
        try:
            status = TaskStatus(key)
        except ValueError:
            raise ConfigurationError(
                f"retention key {key!r} is not a status: use a finished one "
                f"({', '.join(sorted(s.value for s in TERMINAL))}) or '*'"
            ) from None
        if status not in TERMINAL:
            raise ConfigurationError(
                f"retention of {status.value!r}: only finished tasks are deleted"
            )
        rules[status] = kept
    if every is not None:
        for status in TERMINAL:
            rules.setdefault(status, every)
    return rules


class RetentionLoop(LoopService):
    """Deletes the node's finished tasks past their age, a batch a pass."""

    def __init__(
        self,
        node: NodeContext,
        rules: Mapping[TaskStatus, timedelta],
        *,
        buckets: frozenset[int] | None,
        interval: float = 60.0,
        batch: int = 500,
        pause: float = 0.05,
    ) -> None:
        super().__init__()
        self.name = f"chongming-retention[{node.owner}]"
        self.interval = interval
        self._store = node.capabilities.prune_by_age  # refused here where it has none
        self._leases = node.leases
        self._buckets = buckets
        self._batch = batch
        self._pause = pause
        by_age: dict[timedelta, set[TaskStatus]] = {}
        for status, kept in rules.items():
            by_age.setdefault(kept, set()).add(status)
        self._groups = [(kept, frozenset(statuses)) for kept, statuses in by_age.items()]
        # Commands have no status and no bucket: the finished ones go once older than the
        # longest age the node keeps anything for.
        self._commands_kept = max(rules.values(), default=None)

    def run_once(self, now: float | None = None) -> Pass:
        try:
            at = self._leases.now()  # the store's clock where it has one
            done, full = 0, False
            for kept, statuses in self._groups:
                went = self._store.prune_ended(
                    before=at - kept, statuses=statuses, buckets=self._buckets, limit=self._batch
                )
                done += went
                full = full or went == self._batch
            if self._commands_kept is not None:
                went = self._store.prune_finished_commands(
                    before=at - self._commands_kept, limit=self._batch
                )
                done += went
                full = full or went == self._batch
        except StoreUnavailable as exc:
            log.debug("retention: %s", exc)  # the supervisor reports the outage
            return Pass(wait=self.interval)
        return Pass(done=done, wait=self._pause if full else self.interval)
