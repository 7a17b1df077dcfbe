"""Dashboard pages on a store of a million tasks while a node runs tasks: p50 / p99.

    uv run python bench/web_pages.py [--tasks 1000000] [--requests 100] [--dsn DSN]

The store is filled as in ``bench/scale.py`` (unmeasured): all but 2,000 tasks finished,
64 buckets, two declared nodes. Then a real node process runs tasks the whole time
(about 20 short tasks a second in random buckets, plus 8 long ones that checkpoint), and
``chongming-task web`` serves the store as a real process. Each page is requested
``--requests`` times in turn, one request at a time, over HTTP on loopback; the time is
the client's, from sending the request to the last byte of the answer. ``/healthz`` (one
point read through the same server stack) is the floor each page is read against.
Target: every page under 200 ms at p99. The store-wide figures (counts by status and
bucket, the fleet report) are read by the dashboard's follower thread about once a
second, never in a request; the overview and ``/metrics`` show the latest.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale import NOW, Target, fill, postgres_target, sqlite_target

NODE = """
import random, sys, threading, time
from chongming_task import Controller, Progress
from chongming_task.stores import open_store
store = open_store(sys.argv[1], schema=sys.argv[2] or None)
node = Controller(store, owner="bench-node", max_workers=12)

@node.task(name="short")
def short(token):
    token.checkpoint(Progress(current=1, total=1))
    return "ok"

@node.task(name="long")
def long(token):
    for n in range(1_000_000):
        token.checkpoint(Progress(current=n, total=1_000_000, message=f"step {n}"))
        token.sleep(0.05)

for k in range(8):
    node.task(long).configure(bucket_key=f"long-{k}").submit()
print("ready", flush=True)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
while not stop.wait(0.05):
    node.task(short).configure(bucket_key=f"k{random.randrange(10**6)}").submit()
node.close(timeout=5)
"""

PAGES = [
    "/healthz",
    "/",
    "/live/overview",
    "/tasks",
    "/tasks?status=all",
    "/tasks?status=all&until={deep}&before=ffffffffffffffffffffffffffffffff",
    "/tasks?status=succeeded&bucket=7",
    "/tasks?q=t00012",
    "/tasks?node=node-a",
    "/tasks?status=all&node=node-a",
    "/tasks?status=all&node=nobody",
    "/tasks/{task}",
    "/tasks/{task}/live",
    "/schedules",
    "/nodes",
    "/reconcile",
    "/metrics",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> float:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as response:
        response.read()
        assert response.status == 200, url
    return time.perf_counter() - start


def measure(
    target: Target, tasks: int, requests: int, schema: str
) -> list[tuple[str, list[float]]]:
    fill(target, tasks)
    db = target.cli[1]
    node = subprocess.Popen(
        [sys.executable, "-c", NODE, db, schema],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert node.stdout is not None and node.stdout.readline().strip() == "ready"
    port = _free_port()
    web = subprocess.Popen(
        [sys.executable, "-m", "chongming_task", *target.cli, "web", "--port", str(port)],
        stdout=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                _get(base + "/healthz")
                break
            except OSError:
                time.sleep(0.1)
        time.sleep(2)  # the node is running its tasks
        store = target.open()
        from chongming_task import TaskQuery, TaskStatus

        running = store.query(TaskQuery(statuses=frozenset({TaskStatus.RUNNING}), limit=1))
        store.close()
        task = running[0].task_id
        # The middle of the store (the fill spaces creation times 1 ms apart).
        deep = (NOW - timedelta(days=2) + timedelta(milliseconds=tasks // 2)).isoformat()
        results = []
        for page in PAGES:
            url = base + page.format(task=task, deep=urllib.parse.quote(deep))
            _get(url)  # warm
            results.append((page, [_get(url) for _ in range(requests)]))
        return results
    finally:
        web.terminate()
        web.wait(20)
        assert node.stdin is not None
        node.stdin.close()
        node.wait(30)


def report(label: str, tasks: int, results: list[tuple[str, list[float]]]) -> None:
    print(f"\n{label}: {tasks:,} tasks, a node running tasks meanwhile")
    print(f"{'page':44} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}  < 200 ms p99")
    for page, times in results:
        ordered = sorted(times)
        p99 = ordered[max(0, round(0.99 * len(ordered)) - 1)]
        ok = "" if page == "/healthz" else ("yes" if p99 < 0.2 else "NO")
        print(
            f"{page:44} {statistics.median(ordered) * 1000:8.1f} {p99 * 1000:8.1f} "
            f"{ordered[-1] * 1000:8.1f}  {ok}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--only", choices=["sqlite", "postgres"], default=None)
    args = parser.parse_args()
    if args.only != "postgres":
        with tempfile.TemporaryDirectory() as tmp:
            target = sqlite_target(Path(tmp) / "web.db")
            report("SQLite", args.tasks, measure(target, args.tasks, args.requests, ""))
    if args.dsn and args.only != "sqlite":
        schema = f"bench_web_{int(time.time())}"
        target = postgres_target(args.dsn, schema)
        try:
            report("PostgreSQL", args.tasks, measure(target, args.tasks, args.requests, schema))
        finally:
            target.drop()


if __name__ == "__main__":
    main()
