"""The shared helpers of the store contract: records to store, and one fresh store per
test. ``StoreContract`` is the class to subclass."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import SkipTest

from ..model import Command, CommandAction, TaskSnapshot, TaskStatus, Transition
from ..stores.protocol import TaskStore

__all__ = ["T0", "ContractBase", "ContractTimeout", "at", "raises"]

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class ContractTimeout(AssertionError):
    """A contract test ran past its ``deadline``."""


@contextmanager
def _deadline(seconds: float, where: str) -> Iterator[None]:
    """Within: past ``seconds``, ``ContractTimeout`` is raised in the test (a real-time
    alarm: the main thread only; elsewhere nothing is armed)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(
        signal, "setitimer"
    ):
        yield
        return

    def expired(signum: int, frame: object) -> None:
        raise ContractTimeout(
            f"{where}: a test ran past {seconds:g} s: a store call never returned, or the "
            "store ignores a query field the test relies on to end"
        )

    before = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def raises(exc: type[BaseException], fn: Callable[[], object]) -> BaseException:
    try:
        fn()
    except exc as caught:
        return caught
    raise AssertionError(f"expected {exc.__name__}")


class ContractBase:
    """Helpers every contract test uses. Subclasses provide ``make_store()``."""

    def make_store(self) -> TaskStore:
        """Return a new, empty, isolated store."""
        raise NotImplementedError("subclasses of StoreContract implement make_store()")

    # -- helpers --------------------------------------------------------------------------------

    deadline: float = 120.0
    """Seconds a test may take with its store (on the main thread, where the interpreter
    can interrupt it): a store call that never returns, or a loop over pages a store
    never ends, fails the test instead of holding the suite for ever."""

    @contextmanager
    def _store(self) -> Iterator[TaskStore]:
        with _deadline(self.deadline, type(self).__name__):
            store = self.make_store()
            try:
                yield store
            finally:
                store.close()

    @staticmethod
    def _declares(store: TaskStore, role: type, name: str) -> None:
        """Skip the test (of ``name``) where the store does not declare ``role`` whole."""
        if not isinstance(store, role):
            raise SkipTest(f"{type(store).__name__} does not declare {role.__name__} ({name})")

    @staticmethod
    def snapshot(task_id: str = "t1", **changes: Any) -> TaskSnapshot:
        base = TaskSnapshot(
            task_id=task_id,
            name="job",
            status=TaskStatus.QUEUED,
            status_version=1,
            created_at=T0,
        )
        return replace(base, **changes)

    @staticmethod
    def transition(task_id: str, version: int, to: TaskStatus, **changes: Any) -> Transition:
        base = Transition(
            task_id=task_id,
            version=version,
            from_status=None,
            to_status=to,
            at=at(version),
        )
        return replace(base, **changes)

    @staticmethod
    def command(command_id: str, created: float, task_id: str = "t1") -> Command:
        return Command(
            command_id=command_id,
            task_id=task_id,
            action=CommandAction.STOP,
            created_at=at(created),
            issued_by="tester",
        )

    @staticmethod
    def _ids(snapshots: list[TaskSnapshot]) -> list[str]:
        return [s.task_id for s in snapshots]
