from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from chongming_task import Controller, InMemoryTaskStore, SqliteTaskStore, TaskStore


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    """Re-check ``predicate`` until it holds; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    tick = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        tick.wait(0.005)


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TaskStore]:
    s: TaskStore = (
        InMemoryTaskStore() if request.param == "memory" else SqliteTaskStore(tmp_path / "t.db")
    )
    yield s
    s.close()


@pytest.fixture
def make_controller() -> Iterator[Callable[..., Controller]]:
    made: list[Controller] = []

    def make(store: TaskStore | None = None, **kwargs: object) -> Controller:
        kwargs.setdefault("activity_interval", 0.02)
        c = Controller(store if store is not None else InMemoryTaskStore(), **kwargs)  # type: ignore[arg-type]
        made.append(c)
        return c

    yield make
    for c in made:
        c.close(timeout=5)
