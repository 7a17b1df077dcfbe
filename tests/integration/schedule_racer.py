"""One racer of the schedule races (``test_schedule_race``): a node that defines the
schedule ``every-10s`` on a fake clock, says it is ready, and once the file ``go`` exists
reaches its next ``SLOTS`` slots as fast as it can, as every other racer does. It prints
how many it fired and how many it found taken, as a JSON line."""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from chongming_task import CancellationToken, Controller, IntervalTrigger
from chongming_task.stores import open_store
from chongming_task.testing import FakeClock

START = datetime(2026, 3, 1, 12, 0, 5, tzinfo=UTC)
SLOTS = 20


def main() -> None:
    where, schema, owner, folder = sys.argv[1:5]
    go = Path(folder) / "go"
    store = open_store(where, schema=schema or None)
    clock = FakeClock(START)
    with Controller(store, owner=owner, clock=clock, run_schedules=False) as node:

        @node.task(name="tick")
        def tick(token: CancellationToken) -> str:
            return owner

        entry = node.schedule("every-10s", "tick", IntervalTrigger(10), overlap="allow")
        print("ready", flush=True)
        while not go.exists():
            time.sleep(0.001)
        for slot in range(1, SLOTS + 1):
            clock.set(START + timedelta(seconds=10 * slot))
            node.tick_schedules()
        said = {"fired": entry.fired, "taken": entry.taken}
        print(json.dumps(said), flush=True)
    store.close()


if __name__ == "__main__":
    main()
