"""A host process of ``bench/fleet.py``: many nodes in one process, each a real
``Controller`` on a ``PostgresTaskStore`` of its own (its own pool, its own ``LISTEN``
connection where it has a ``listen_dsn``), each owning one bucket and running one task
that sleeps until stopped.

    python bench/_fleethost.py DSN LISTEN_DSN|- POLL|default FIRST COUNT NUM_BUCKETS

Prints one JSON line a node (``{"node": ..., "task": ...}``), then ``{"up": true}``,
and closes every node when its standard input ends.
"""

from __future__ import annotations

import json
import logging
import sys
from concurrent.futures import ThreadPoolExecutor

from chongming_task import CancellationToken, Controller
from chongming_task.policies import BucketPolicy
from chongming_task.stores.postgres import PostgresTaskStore

SCHEMA = "fleet"


def key_for(bucket: int, policy: BucketPolicy) -> str:
    """A bucket key that lands in ``bucket``."""
    return next(f"k{j}" for j in range(1_000_000) if policy.bucket_for(f"k{j}") == bucket)


def start(
    index: int, dsn: str, listen_dsn: str | None, poll: float | None, num_buckets: int
) -> tuple[Controller, PostgresTaskStore, str]:
    # The simulated nodes share two cores with the server and each other: a connection
    # made while a thousand start may wait longer than a real node's 5 s.
    store = PostgresTaskStore(
        dsn, schema=SCHEMA, pooled=True, listen_dsn=listen_dsn, connect_timeout=30
    )
    node = Controller(
        store,
        owner=f"node-{index:04d}",
        owned_buckets=[index],
        num_buckets=num_buckets,
        max_workers=1,
        command_poll_interval=poll,
    )

    @node.task(name="hold")
    def hold(token: CancellationToken) -> None:
        while True:  # a stop ends the sleep at once
            token.sleep(3600)

    task = node.tasks["hold"].configure(bucket_key=key_for(index, node.bucket_policy)).submit()
    return node, store, task.task_id


def main() -> None:
    dsn, listen, poll, first, count, num_buckets = sys.argv[1:7]
    # Without listen_dsn every store says once that it polls: a thousand times here.
    logging.getLogger("chongming_task.store").setLevel(logging.ERROR)
    listen_dsn = None if listen == "-" else listen
    interval = None if poll == "default" else float(poll)
    nodes = []
    with ThreadPoolExecutor(4) as starting:
        for node, store, task_id in starting.map(
            lambda i: start(i, dsn, listen_dsn, interval, int(num_buckets)),
            range(int(first), int(first) + int(count)),
        ):
            nodes.append((node, store))
            print(json.dumps({"node": node.owner, "task": task_id}), flush=True)
    print(json.dumps({"up": True}), flush=True)
    sys.stdin.read()
    with ThreadPoolExecutor(16) as closing:
        list(closing.map(lambda pair: (pair[0].close(timeout=10), pair[1].close()), nodes))


if __name__ == "__main__":
    main()
