"""The node bench/schedule_fleet.py runs as each replica: it defines the task ``tick``
and the schedule ``tick-1s`` (every second), says it is ready, and serves until it is
stopped or killed. ``python _schedule_node.py WHERE SCHEMA OWNER``."""

from __future__ import annotations

import sys

from chongming_task import CancellationToken, Controller, IntervalTrigger
from chongming_task.stores import open_store


def tick(token: CancellationToken) -> str:
    return "ticked"


def main() -> None:
    where, schema, owner = sys.argv[1:4]
    store = open_store(where, schema=schema or None)
    with Controller(store, owner=owner, lease_ttl=10.0) as node:
        node.task(tick, name="tick")
        node.schedule("tick-1s", "tick", IntervalTrigger(1))
        print("ready", flush=True)
        node.serve()
    store.close()


if __name__ == "__main__":
    main()
