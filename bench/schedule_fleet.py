"""One firing per slot across replicas: two node processes define the same one-second
schedule on one store; every second must create exactly one task between them, and
when the replica that fired last is killed with SIGKILL the other must fire the next
slot.

    uv run python bench/schedule_fleet.py [--seconds 60] [--after-kill 10] [--dsn DSN]

Runs on a fresh SQLite file (two processes, one file), and on PostgreSQL (a fresh
schema, dropped afterwards) when ``--dsn`` or ``CHONGMING_TEST_POSTGRES`` names a
server. The count is judged by the clock, not by the tasks' ids (which the firing makes
from the slot): each whole second of the run, from the first slot after both replicas
are ready to the end, should hold exactly one task created in it.

Printed per store (the run fails when a "must" does not hold):
  seconds judged, seconds with one task, seconds with none (slots missed)
  seconds with two or more tasks                  must be 0
  slots fired                                     must be >= 95 %
  the next slot after the kill: its task created after the kill, in seconds
                                                  must be <= 1 s (one period) + the lease
"""

from __future__ import annotations

import argparse
import math
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from _stats import store_schema  # bench/ is on sys.path when run as a script
from chongming_task.model import TaskQuery
from chongming_task.stores import open_store

BENCH = Path(__file__).resolve().parent
LEASE = 10.0  # the nodes' lease TTL (_schedule_node.py)


def start(where: str, schema: str, owner: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCH), *sys.path])}
    proc = subprocess.Popen(
        [sys.executable, str(BENCH / "_schedule_node.py"), where, schema, owner],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise SystemExit(f"replica {owner} did not start")
    return proc


def run(where: str, schema: str, seconds: float, after_kill: float, label: str) -> bool:
    owners = [f"replica-{n}-{secrets.token_hex(2)}" for n in range(2)]
    procs = {owner: start(where, schema, owner) for owner in owners}
    began = math.ceil(time.time())  # the first whole second both replicas reach
    try:
        time.sleep(max(0.0, began + seconds - time.time()) + 0.3)
        store = open_store(where, schema=schema or None, create=False)
        try:
            ticks = store.query(TaskQuery(tag="schedule:tick-1s", limit=10_000))
        finally:
            store.close()
        last = max(ticks, key=lambda t: t.created_at)
        killed = last.owner or ""
        procs[killed].send_signal(signal.SIGKILL)
        procs[killed].wait(10)
        killed_at = time.time()
        time.sleep(after_kill)
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
        ended = math.floor(killed_at + after_kill)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    store = open_store(where, schema=schema or None, create=False)
    try:
        ticks = store.query(TaskQuery(tag="schedule:tick-1s", limit=10_000))
    finally:
        store.close()
    per_second = Counter(math.floor(t.created_at.timestamp()) for t in ticks)
    judged = range(began, ended)
    one = sum(per_second[s] == 1 for s in judged)
    none = sum(per_second[s] == 0 for s in judged)
    twice = sum(per_second[s] >= 2 for s in judged)
    after = sorted(t.created_at for t in ticks if t.created_at.timestamp() > killed_at)
    resumed = (after[0].timestamp() - killed_at) if after else math.inf
    fired = one / len(judged)
    by = Counter(t.owner for t in ticks)
    print(f"{label}: {len(judged)} seconds judged, 2 replicas, one 1-second schedule")
    print(f"  seconds with one task               {one}")
    print(f"  seconds with none (slots missed)    {none}")
    print(f"  seconds with two or more tasks      {twice}   (must be 0)")
    print(f"  slots fired                         {fired:.1%}   (must be >= 95%)")
    print(f"  fired by each replica               {', '.join(str(n) for n in by.values())}")
    print(
        f"  killed the replica that fired last at "
        f"{datetime.fromtimestamp(killed_at, UTC):%H:%M:%S.%f}"[:-3]
        + f"; the next slot's task {resumed:.3f} s after   (must be <= {1 + LEASE:g} s)"
    )
    return twice == 0 and fired >= 0.95 and resumed <= 1 + LEASE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--after-kill", type=float, default=10.0)
    parser.add_argument("--dsn", default=os.environ.get("CHONGMING_TEST_POSTGRES"))
    args = parser.parse_args()
    ok = True
    with tempfile.TemporaryDirectory() as folder:
        db = str(Path(folder) / "fleet.db")
        open_store(db).close()
        ok &= run(db, "", args.seconds, args.after_kill, "SQLite")
    if args.dsn and args.dsn != "none":
        with store_schema(args.dsn, "slots") as schema:
            ok &= run(args.dsn, schema, args.seconds, args.after_kill, "PostgreSQL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
