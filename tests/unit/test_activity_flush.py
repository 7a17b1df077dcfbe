"""What a node writes of its running tasks' activity: every progress move at the next
pass, a heartbeat alone at most every ``HEARTBEAT_EVERY`` seconds."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from datetime import datetime

from chongming_task import CancellationToken, Controller, InMemoryTaskStore, Progress
from chongming_task.node.supervision import HEARTBEAT_EVERY


class CountingStore(InMemoryTaskStore):
    """Counts each task's activity writes, and whether each carried a progress move."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[str, float | None]] = []

    def write_activity(
        self, items: Sequence[tuple[str, Progress | None, datetime | None]], *, owner: str
    ) -> list[str]:
        for task_id, progress, _ in items:
            self.writes.append((task_id, None if progress is None else progress.current))
        return super().write_activity(items, owner=owner)


def test_heartbeats_alone_are_written_every_few_seconds_progress_at_once() -> None:
    assert HEARTBEAT_EVERY >= 2
    store = CountingStore()
    done = threading.Event()
    with Controller(store, owner="n", activity_interval=0.05) as node:

        @node.task(name="alive")
        def alive(token: CancellationToken) -> None:
            while not done.is_set():
                token.checkpoint()  # a heartbeat, no progress
                time.sleep(0.01)

        @node.task(name="moving")
        def moving(token: CancellationToken) -> None:
            for i in range(1, 1000):
                if done.is_set():
                    return
                token.checkpoint(Progress(current=i, total=1000))
                time.sleep(0.1)

        quiet, busy = node.submit(alive), node.submit(moving)
        time.sleep(1.5)
        done.set()
        quiet.wait(5)
        busy.wait(5)
    heartbeats = [p for task_id, p in store.writes if task_id == quiet.task_id]
    moves = [p for task_id, p in store.writes if task_id == busy.task_id]
    assert len(heartbeats) == 1, heartbeats  # the first, then none for 5 s
    assert len(moves) >= 5 and moves == sorted(moves), moves  # each move, in order
