"""From a transition to an open dashboard page showing it: latency in a real browser.

    uv run python bench/web_live.py [--tasks 100000] [--cycles 15] [--dsn DSN]

A store is filled as in ``bench/scale.py`` (unmeasured), a real node process runs short
tasks (about 20 a second) and one long task that checkpoints every 10 ms, and
``chongming-task web`` serves the store as a real process. Headless Chromium (Debian's
``chromium`` and ``chromedriver``, through Selenium; nothing is downloaded) opens the
long task's page, and a ``MutationObserver`` notes the browser's clock each time the
page's status changes. The bench then pauses and resumes the task through the command
channel, ``--cycles`` times, at random moments. For each ``paused`` and each ``running``
the latency is the browser's time of the status appearing minus the transition's ``at``
(the node's clock when it made the transition, before writing it: the write, the
dashboard's follower, the server-sent event, the page's fetch and the browser's render
are all inside; one machine, one clock).

Rows: SQLite (the follower polls twice a second), PostgreSQL (the node's store announces
its writes, the follower ``LISTEN``s and also polls twice a second), and PostgreSQL with a
node that does not announce (``announce_writes=False``: the follower's half-second poll
alone). Target: every transition on the page within a second.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chongming_task import Controller, TaskStatus
from scale import Target, fill, postgres_target, sqlite_target

NODE = """
import random, sys, threading
from chongming_task import Controller, Progress
from chongming_task.stores import open_store
from chongming_task.stores.postgres import PostgresTaskStore
store = (PostgresTaskStore(sys.argv[1], schema=sys.argv[2], announce_writes=False)
         if sys.argv[3:] == ["quiet"] else open_store(sys.argv[1], schema=sys.argv[2] or None))
node = Controller(store, owner="bench-node", max_workers=8)

@node.task(name="short")
def short(token):
    token.checkpoint(Progress(current=1, total=1))
    return "ok"

@node.task(name="held")
def held(token):
    for n in range(10_000_000):
        token.checkpoint(Progress(current=n, total=10_000_000))
        token.sleep(0.01)

print(node.submit(held).task_id, flush=True)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
while not stop.wait(0.05):
    node.task(short).configure(bucket_key=f"k{random.randrange(10**6)}").submit()
node.close(timeout=5)
"""

# Notes (status, browser time in ms) whenever the task page's status line changes; the
# live part is replaced by each fetch, so the observer watches the whole document.
OBSERVE = """
window.__seen = [];
var last = null;
function look() {
  var p = document.querySelector('#task p.status');
  if (!p) return;
  var s = p.textContent.trim().split(' ')[0];
  if (s !== last) { last = s; window.__seen.push([s, Date.now()]); }
}
new MutationObserver(look).observe(document.body, {childList: true, subtree: true,
                                                   characterData: true});
look();
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _browser() -> Any:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        sys.exit("web_live: needs Debian's chromium and chromium-driver (apt-get install)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must never fetch a browser
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)


def _wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.01)
    raise SystemExit(f"web_live: no {what} within {timeout} s")


def measure(target: Target, schema: str, cycles: int, browser: Any, *quiet: str) -> list[float]:
    db = target.cli[1]
    node = subprocess.Popen(
        [sys.executable, "-c", NODE, db, schema, *quiet],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert node.stdout is not None
    task_id = node.stdout.readline().strip()
    port = _free_port()
    web = subprocess.Popen(
        [sys.executable, "-m", "chongming_task", *target.cli, "web", "--port", str(port)],
        stdout=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    store = target.open()
    operator = Controller(store, owner="bench-operator", poll_commands=False)
    latencies: list[float] = []
    try:

        def up() -> bool:
            try:
                with urllib.request.urlopen(base + "/healthz", timeout=5):
                    return True
            except OSError:
                return False

        _wait(up, 60, "dashboard")
        _wait(lambda: (s := store.get(task_id)) and s.status is TaskStatus.RUNNING, 30, "run")
        browser.get(f"{base}/tasks/{task_id}")
        browser.execute_script(OBSERVE)
        time.sleep(2)  # the page's event stream is open
        version = store.get(task_id).status_version  # type: ignore[union-attr]
        for _ in range(cycles):
            for act, status in ((operator.pause, TaskStatus.PAUSED), (operator.resume, None)):
                status = status or TaskStatus.RUNNING
                time.sleep(random.uniform(0.3, 1.3))  # any phase of the follower's beat
                act(task_id)

                def landed(since: int = version, to: TaskStatus = status) -> Any:
                    moves = store.history(task_id, since_version=since)
                    return next((t for t in moves if t.to_status is to), None)

                move = _wait(landed, 30, f"{status.value} transition")
                version = move.version
                at = move.at.timestamp()

                def shown(to: str = status.value, after: float = at) -> Any:
                    seen = browser.execute_script("return window.__seen;")
                    return next((t for s, t in seen if s == to and t / 1000 >= after - 0.05), None)

                latencies.append(_wait(shown, 30, f"{status.value} on the page") / 1000 - at)
        return latencies
    finally:
        operator.close()
        store.close()
        web.terminate()
        web.wait(20)
        assert node.stdin is not None
        node.stdin.close()
        node.wait(30)


def report(label: str, latencies: list[float]) -> None:
    ordered = sorted(latencies)
    p90 = ordered[max(0, round(0.9 * len(ordered)) - 1)]
    late = sum(1 for x in ordered if x > 1.0)
    print(
        f"{label:44} {len(ordered):4} {statistics.median(ordered) * 1000:8.0f} "
        f"{p90 * 1000:8.0f} {ordered[-1] * 1000:8.0f}  "
        f"{'yes' if late == 0 else f'NO ({late} over 1 s)'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--cycles", type=int, default=15, help="pause + resume pairs")
    parser.add_argument("--dsn", default=None)
    args = parser.parse_args()
    browser = _browser()
    print(
        f"{args.tasks:,} tasks in the store, {args.cycles} pause/resume cycles, started "
        f"{datetime.now():%H:%M}"
    )
    print(f"{'store':44} {'n':>4} {'p50 ms':>8} {'p90 ms':>8} {'max ms':>8}  all < 1 s")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            target = sqlite_target(Path(tmp) / "live.db")
            fill(target, args.tasks)
            report("SQLite (poll every 0.5 s)", measure(target, "", args.cycles, browser))
        if args.dsn:
            schema = f"bench_live_{int(time.time())}"
            target = postgres_target(args.dsn, schema)
            try:
                fill(target, args.tasks)
                report("PostgreSQL (LISTEN/NOTIFY)", measure(target, schema, args.cycles, browser))
                report(
                    "PostgreSQL, node not announcing (poll 0.5 s)",
                    measure(target, schema, args.cycles, browser, "quiet"),
                )
            finally:
                target.drop()
    finally:
        browser.quit()


if __name__ == "__main__":
    main()
