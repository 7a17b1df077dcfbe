"""The process a node lives in: the controllers still open (closed at the interpreter's
exit, forgotten in a forked child), and the settings checked at construction."""

from __future__ import annotations

import atexit
import logging
import os
from typing import TYPE_CHECKING

from ..errors import ConfigurationError

if TYPE_CHECKING:
    from .controller import Controller

__all__ = ["OPEN", "check_processes", "check_settings", "close_at_exit"]

log = logging.getLogger("chongming_task.controller")


OPEN: set[Controller] = set()
"""Controllers with a service started and not yet closed (their threads hold them)."""


def close_at_exit() -> None:
    """A program that ends without ``close()`` still ends, and leaves its tasks true in
    the store: each controller still open is closed as by ``close()`` (running tasks
    asked to stop, waiting ones cancelled, every transition written). ``atexit`` runs
    once the program's own non-daemon threads have ended, so a controller serves as
    long as its program runs; its threads are daemon threads, so that the interpreter
    reaches this point at all (concurrent.futures joins its workers at the same stage)."""
    for controller in list(OPEN):
        if controller.schedules:
            log.warning(
                "%r was not closed and has schedules: closing it at interpreter exit, so "
                "they fire no more; to keep a node serving, end its program with "
                "node.serve() (until Ctrl-C or SIGTERM)",
                controller,
            )
        else:
            log.info("%r was not closed: closing it at interpreter exit", controller)
        try:
            controller.close()
        except Exception:
            log.exception("closing %r at interpreter exit failed", controller)


atexit.register(close_at_exit)
# A forked child holds copies of its parent's controllers, without their threads: closing
# them at the child's exit would write "controller closed" over the parent's tasks.
os.register_at_fork(after_in_child=OPEN.clear)


def check_settings(
    max_workers: int | None, max_parallel_per_bucket: int | None, **positive: float | None
) -> int:
    """Refuse impossible settings at construction; return the worker count."""
    if max_workers is None:
        max_workers = min(32, (os.cpu_count() or 1) + 4)
    if max_workers < 1:
        raise ConfigurationError(f"max_workers must be >= 1, got {max_workers}")
    if max_parallel_per_bucket is not None and max_parallel_per_bucket < 1:
        raise ConfigurationError(
            f"max_parallel_per_bucket must be >= 1 or None, got {max_parallel_per_bucket}"
        )
    for label, value in positive.items():
        if value is not None and value <= 0:
            raise ConfigurationError(f"{label} must be > 0, got {value}")
    return max_workers


def check_processes(
    max_processes: int | None, max_tasks_per_process: int | None, max_memory_per_process: int | None
) -> int:
    """Refuse impossible worker process settings at construction; return the count."""
    processes = (os.cpu_count() or 1) if max_processes is None else max_processes
    if processes < 1:
        raise ConfigurationError(f"max_processes must be >= 1, got {max_processes}")
    for name, limit in (
        ("max_tasks_per_process", max_tasks_per_process),
        ("max_memory_per_process", max_memory_per_process),
    ):
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise ConfigurationError(f"{name} must be an int or None, got {limit!r}")
        if limit is not None and limit < 1:
            raise ConfigurationError(f"{name} must be >= 1 or None, got {limit}")
    return processes
