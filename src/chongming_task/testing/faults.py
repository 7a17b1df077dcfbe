"""``FaultyStore``: wrap any store and make chosen calls fail, to test failure stories."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from ..errors import StoreError, StoreUnavailable
from ..model import Command, Progress, TaskQuery, TaskSnapshot, TaskStatus, Transition
from ..stores.protocol import TaskStore
from ..stores.roles import rules_of
from ..values import ValueRules

__all__ = ["FaultyStore"]


class FaultyStore:
    """A ``TaskStore`` that delegates to ``inner`` but fails the calls it is told to.

    ``fail_next("save", times=1)`` makes the next ``save`` raise ``StoreError`` (a network
    blip); ``fail_when("save", predicate)`` fails every call whose arguments match;
    ``outage()`` / ``restore()`` fail every call in between with ``StoreUnavailable``.
    ``calls`` counts calls. It holds what ``inner`` holds (``value_rules``).
    """

    def __init__(self, inner: TaskStore) -> None:
        self.inner = inner
        self._lock = threading.Lock()
        self._fail_next: dict[str, int] = {}
        self._predicates: dict[str, Callable[..., bool]] = {}
        self._down = False
        self.calls: dict[str, int] = {}
        self.failures: dict[str, int] = {}

    @property
    def value_rules(self) -> ValueRules:
        return rules_of(self.inner)

    def fail_next(self, method: str, times: int = 1) -> None:
        with self._lock:
            self._fail_next[method] = self._fail_next.get(method, 0) + times

    def fail_when(self, method: str, predicate: Callable[..., bool]) -> None:
        with self._lock:
            self._predicates[method] = predicate

    def outage(self) -> None:
        self._down = True

    def restore(self) -> None:
        self._down = False

    def _maybe_fail(self, method: str, *args: Any, **kwargs: Any) -> None:
        with self._lock:
            self.calls[method] = self.calls.get(method, 0) + 1
            down = fail = self._down and method != "close"
            if not fail and self._fail_next.get(method, 0) > 0:
                self._fail_next[method] -= 1
                fail = True
            predicate = self._predicates.get(method)
            if not fail and predicate is not None and predicate(*args, **kwargs):
                fail = True
            if fail:
                self.failures[method] = self.failures.get(method, 0) + 1
        if down:
            raise StoreUnavailable(f"injected outage in {method}")
        if fail:
            raise StoreError(f"injected failure in {method}")

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        self._maybe_fail(method, *args, **kwargs)
        return getattr(self.inner, method)(*args, **kwargs)

    # Spelled out (not __getattr__) so that isinstance(x, TaskStore) holds on every Python.
    def create(self, snapshot: TaskSnapshot) -> None:
        self._call("create", snapshot)

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        self._call("save", snapshot, expect_version=expect_version)

    def get(self, task_id: str) -> TaskSnapshot | None:
        result: TaskSnapshot | None = self._call("get", task_id)
        return result

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        result: list[TaskSnapshot] = self._call("query", query)
        return result

    def counts(self) -> dict[TaskStatus, int]:
        result: dict[TaskStatus, int] = self._call("counts")
        return result

    def append(self, transition: Transition) -> None:
        self._call("append", transition)

    def history(self, task_id: str, *, since_version: int = 0) -> list[Transition]:
        result: list[Transition] = self._call("history", task_id, since_version=since_version)
        return result

    def touch(
        self,
        task_id: str,
        *,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> None:
        self._call(
            "touch",
            task_id,
            progress=progress,
            heartbeat_at=heartbeat_at,
            lease_owner=lease_owner,
            lease_until=lease_until,
        )

    def submit_command(self, command: Command) -> None:
        self._call("submit_command", command)

    def claim_commands(
        self, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        result: list[Command] = self._call(
            "claim_commands", now=now, lease_seconds=lease_seconds, limit=limit
        )
        return result

    def complete_command(
        self, command_id: str, *, now: datetime, outcome: str | None = None
    ) -> None:
        self._call("complete_command", command_id, now=now, outcome=outcome)

    def release_command(self, command_id: str, *, now: datetime) -> None:
        self._call("release_command", command_id, now=now)

    def prune(self, *, keep_terminal: int) -> int:
        result: int = self._call("prune", keep_terminal=keep_terminal)
        return result

    def close(self) -> None:
        self._call("close")
