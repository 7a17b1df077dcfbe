"""The one seam through which an instrumentation watches tasks (``chongming_task.otel``).

Nothing is watched until a ``Watcher`` is installed: each place below reads the module's
``watcher`` once and, finding ``None``, goes on as before (one global read: what the run
path pays without instrumentation, measured by bench/throughput.py). Installed, it is
told of:

- a submit, a ``submit_many``, a pipeline's submit and a schedule's firing, around the
  call (``submitted``, ``Watcher.firing``); each new task stores ``trace_context()`` as its
  ``TaskSnapshot.trace_context``;
- each attempt, on the thread or ``asyncio`` task that carries it (``began``, then the
  ``Seen`` it returns ``ended``), and the end of each run it saw (``run_ended``);
- a control sent through a store (``StoreControl``: the CLI, the dashboard);
- each log record made while a task runs (``annotate``).

A watcher keeps its own faults: one that raises is a fault of the instrumentation,
which must log it and let the task go on (``otel`` does).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from .model import CommandAction, ControlReceipt, TaskSnapshot
    from .run.life import Run

__all__ = ["Seen", "Watcher", "install", "remove", "submitted", "watcher"]

T = TypeVar("T")


class Seen(Protocol):
    """One attempt being watched."""

    def ended(self, raised: BaseException | None) -> None:
        """The attempt is over (its end recorded in the run); ``raised``: what the
        task's function raised, if it did."""


class Watcher(Protocol):
    def trace_context(self) -> str | None:
        """What a task made now stores as its ``trace_context`` (``None``: nothing)."""

    def submitting(self, operation: str) -> AbstractContextManager[Callable[[object], None]]:
        """Around one submit (``operation``: ``submit``, for a pipeline's too, or
        ``submit_many``): the callable it gives is told what the call made (a run, a
        list of them, a pipeline run; a ``StoredTask`` holding a dedupe key)."""

    def firing(self, schedule: str) -> AbstractContextManager[None]:
        """Around one firing of ``schedule`` (its submit is inside)."""

    def began(self, run: Run) -> Seen:
        """``run``'s attempt began, here: its function is called next."""

    def run_ended(self, run: Run) -> None:
        """``run`` is terminal (its last transitions made)."""

    def controlling(
        self, task: TaskSnapshot, action: CommandAction, reason: str | None, actor: str
    ) -> AbstractContextManager[Callable[[ControlReceipt], None]]:
        """Around a control sent through a store for ``task``; told its receipt."""

    def annotate(self, record: logging.LogRecord) -> None:
        """A log record made while a task runs, its task's attributes already set."""


watcher: Watcher | None = None
"""The installed watcher, if any: read once at each place that tells it."""


def install(new: Watcher) -> None:
    global watcher
    watcher = new


def remove(old: Watcher) -> None:
    """Remove ``old`` if it is the installed watcher."""
    global watcher
    if watcher is old:
        watcher = None


def submitted(
    watch: Watcher, operation: str, call: Callable[..., T], *args: Any, **kwargs: Any
) -> T:
    """``call(*args, **kwargs)`` inside ``watch``'s submit of ``operation``."""
    with watch.submitting(operation) as made:
        result = call(*args, **kwargs)
        made(result)
        return result
