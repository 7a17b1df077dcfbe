"""A node process for cross-process tests: ``python -m tests.integration.node DB [options]``.

It defines ``loop`` (checkpoints every 5 ms until stopped) and ``silent`` (sleeps
``seconds`` without ever checkpointing), submits what ``--submit`` asks, prints one JSON
line per submitted task (``{"task_id": ...}``), then serves until its stdin closes or it is
killed. ``--claim-on FILE`` makes it claim open commands itself once FILE exists and then
hang, to stand for a node that dies holding a claim. ``--poll-on FILE`` makes it poll
commands only when FILE appears (it prints ``{"polled": n}`` and removes FILE), so a
test can send several commands before the holder sees any.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from datetime import datetime, timedelta

from chongming_task import CancellationToken, Controller
from chongming_task.clock import SystemClock
from chongming_task.stores import open_store


class OffsetClock(SystemClock):
    """The real clock, ``offset`` seconds off (a node whose NTP failed)."""

    def __init__(self, offset: float) -> None:
        self.offset = timedelta(seconds=offset)

    def now(self) -> datetime:
        return super().now() + self.offset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("db")
    parser.add_argument("--owner", default=None)
    parser.add_argument("--owned", default=None, help="e.g. 0-31")
    parser.add_argument("--num-buckets", type=int, default=64)
    parser.add_argument("--lease-ttl", type=float, default=30.0)
    parser.add_argument("--poll", default="0.05", help="seconds, or 'default'")
    parser.add_argument("--submit", action="append", default=[], help="name[:arg][@key]")
    parser.add_argument("--delay", type=float, default=None, help="each submit this late")
    parser.add_argument("--claim-on", default=None)
    parser.add_argument("--poll-on", default=None)
    parser.add_argument("--no-reconcile", action="store_true", help="never reconcile alone")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--schema", default=None, help="PostgreSQL schema, with a DSN")
    parser.add_argument("--pooled", action="store_true", help="the DSN is a PgBouncer's")
    parser.add_argument("--listen-dsn", default=None, help="a direct DSN for LISTEN")
    parser.add_argument(
        "--clock-offset", type=float, default=0.0, help="seconds this node's clock is off"
    )
    args = parser.parse_args()
    owned = None
    if args.owned:
        low, high = args.owned.split("-")
        owned = range(int(low), int(high) + 1)
    if args.pooled:
        from chongming_task.stores.postgres import PostgresTaskStore

        store = PostgresTaskStore(
            args.db, schema=args.schema, pooled=True, listen_dsn=args.listen_dsn
        )
    else:
        store = open_store(args.db, schema=args.schema)
    node = Controller(
        store,
        owner=args.owner,
        num_buckets=args.num_buckets,
        owned_buckets=owned,
        lease_ttl=args.lease_ttl,
        command_poll_interval=None if args.poll == "default" else float(args.poll),
        activity_interval=0.05,
        max_workers=args.workers,
        clock=OffsetClock(args.clock_offset),
        poll_commands=False if args.poll_on else None,
        reconcile_interval=None if args.no_reconcile else "lease_ttl",
    )

    @node.task(name="loop")
    def loop(token: CancellationToken) -> str:
        while True:
            token.checkpoint()
            token.sleep(0.010)

    @node.task(name="aloop")
    async def aloop(token: CancellationToken) -> str:
        while True:
            await token.acheckpoint()
            await token.asleep(0.010)

    @node.task(name="silent")
    def silent(token: CancellationToken, seconds: str) -> str:
        time.sleep(float(seconds))  # pure work: no checkpoint at all
        return "done"

    for spec in args.submit:
        spec, _, key = spec.partition("@")
        name, _, arg = spec.partition(":")
        submitter = node.tasks[name].configure(delay=args.delay, bucket_key=key or None)
        run = submitter.submit(*([arg] if arg else []))
        print(json.dumps({"task_id": run.task_id, "bucket": run.bucket}), flush=True)
    print(json.dumps({"ready": os.getpid()}), flush=True)

    if args.claim_on:

        def claim_and_hang() -> None:
            while not os.path.exists(args.claim_on):
                time.sleep(0.01)
            claimed = store.claim_commands(now=node.clock.now(), lease_seconds=1.0)
            print(json.dumps({"claimed": [c.command_id for c in claimed]}), flush=True)
            threading.Event().wait()

        threading.Thread(target=claim_and_hang, daemon=True).start()

    if args.poll_on:

        def poll_when_asked() -> None:
            while True:
                if os.path.exists(args.poll_on):
                    polled = node.poll_commands_once()
                    os.remove(args.poll_on)
                    print(json.dumps({"polled": polled}), flush=True)
                time.sleep(0.01)

        threading.Thread(target=poll_when_asked, daemon=True).start()

    sys.stdin.read()  # serve until the test closes our stdin
    node.close()
    store.close()


if __name__ == "__main__":
    main()
