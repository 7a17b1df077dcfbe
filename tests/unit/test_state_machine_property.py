"""Property: random control sequences never produce an illegal transition, and the store's
audit trail equals the in-memory one."""

from __future__ import annotations

import itertools
import logging
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chongming_task import (
    CancellationToken,
    Controller,
    InMemoryTaskStore,
    SqliteTaskStore,
    TaskStore,
    states,
)

ACTIONS = ("stop", "pause", "resume", "cancel", "yield")


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _worker(token: CancellationToken, steps: int) -> int:
    for i in range(steps):
        token.checkpoint(i)
        token.sleep(0.0005)
    return steps


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    ops=st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from(ACTIONS), st.integers(0, 3)),
        min_size=1,
        max_size=25,
    ),
    steps=st.lists(st.integers(1, 40), min_size=3, max_size=3),
)
def test_random_control_sequences_stay_legal_and_stored_history_matches(
    backend: str, ops: list[tuple[int, str, int]], steps: list[int]
) -> None:
    errors = _Errors()
    logging.getLogger("chongming_task").addHandler(errors)
    with tempfile.TemporaryDirectory() as tmp:
        store: TaskStore = (
            InMemoryTaskStore() if backend == "memory" else SqliteTaskStore(Path(tmp) / "p.db")
        )
        c = Controller(store, max_workers=2, activity_interval=0.01)
        try:
            job = c.task(_worker, name="worker")
            runs = [c.submit(job, n) for n in steps]
            pause = threading.Event()
            for index, action, wait_ms in ops:
                run = runs[index]
                if action == "yield":
                    pause.wait(wait_ms / 1000)
                else:
                    receipt = getattr(c, action)(run.task_id)
                    assert not receipt.accepted  # held here: acted on directly
            for run in runs:
                c.resume(run.task_id)  # let paused ones finish
                run.wait(10)
            c.wait_idle(5)
            for run in runs:
                memory = run.history()
                assert [t.version for t in memory] == list(range(1, len(memory) + 1))
                assert memory[0].from_status is None
                for before, after in itertools.pairwise(memory):
                    assert after.from_status is before.to_status
                    assert states.is_legal(before.to_status, after.to_status), after
                assert memory[-1].to_status in states.TERMINAL
                assert store.history(run.task_id) == memory
                stored = store.get(run.task_id)
                assert stored is not None
                assert stored.status is run.snapshot().status
                assert stored.status_version == len(memory)
        finally:
            c.close(timeout=5)
            store.close()
            logging.getLogger("chongming_task").removeHandler(errors)
    assert errors.records == [], [r.getMessage() for r in errors.records]
