"""What the costliest dashboard requests cost, this tree beside an earlier commit.

    uv run python bench/web_heavy.py --then REV [--result-mb 20] [--heavy 11] [--deep 100000]

One SQLite store: ``--heavy`` succeeded tasks whose results are ``--result-mb`` MB each,
and ``--deep`` small tasks to page through. For the package at ``--then`` (its ``src/``
from this checkout's history) and for this tree, the same ``chongming-task web`` process
serves the same file, and the bench asks it, each request ``--requests`` times:

- ``/healthz``: the floor, one point read;
- six ``/tasks?status=all`` at once, first: the server's peak memory (``VmHWM``) is
  read after them;
- ``/tasks?status=all``: the list, with every heavy task on its first page;
- ``/tasks/ID`` of a heavy task, and the bytes it sends;
- the costliest page a URL can ask for: with the earlier code an offset of ``--deep``
  from the newest task (``until`` + ``skip=``), with this tree the page ``--deep``
  tasks down by its key (``until`` + ``before``), which is what the "Older" link gives.

Medians in milliseconds, bytes of the answer, and the peak RSS in MiB, side by side.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

from throughput_then_now import NOW, extract  # bench/ is on sys.path when run as a script

HEAVY_ID = "{:02d}" + "e" * 30


def fill(db: Path, heavy: int, result_mb: int, deep: int) -> tuple[str, str, str]:
    """The store; returns the newest creation time, and the key (``until``, ``before``)
    of the task ``deep`` down."""
    sys.path.insert(0, str(NOW))
    from chongming_task import SqliteTaskStore, TaskSnapshot, TaskStatus, Transition
    from chongming_task.stores.capabilities import Capabilities

    now = datetime.now(UTC)
    store = SqliteTaskStore(db)
    result = {"rows": ["x" * 1000] * (result_mb * 1000)}
    for n in range(heavy):
        store.create(
            TaskSnapshot(
                task_id=HEAVY_ID.format(n),
                name="heavy",
                status=TaskStatus.SUCCEEDED,
                status_version=4,
                created_at=now + timedelta(seconds=n),
                ended_at=now,
                outcome=result,
            )
        )
    made = []
    for n in range(deep + 60):
        snapshot = TaskSnapshot(
            task_id=f"{n:032x}",
            name="small",
            status=TaskStatus.SUCCEEDED,
            status_version=4,
            created_at=now - timedelta(milliseconds=n),
        )
        first = Transition(
            task_id=snapshot.task_id,
            version=1,
            from_status=None,
            to_status=TaskStatus.QUEUED,
            at=snapshot.created_at,
        )
        made.append((snapshot, first))
        if len(made) == 10_000:
            Capabilities(store).create_many(made)
            made = []
    if made:
        Capabilities(store).create_many(made)
    store.close()
    key = now - timedelta(milliseconds=deep - heavy)
    return (now + timedelta(seconds=heavy)).isoformat(), key.isoformat(), f"{deep - heavy:032x}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[float, int]:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=600) as response:
        body = response.read()
        assert response.status == 200, (url, response.status)
    return time.perf_counter() - start, len(body)


def _peak_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(src: Path, db: Path, pages: dict[str, str], requests: int) -> dict[str, object]:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(src)}
    web = subprocess.Popen(
        [sys.executable, "-m", "chongming_task", "--db", str(db), "web", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                _get(base + "/healthz")
                break
            except OSError:
                time.sleep(0.1)
        found: dict[str, object] = {}
        # First, before any other page: the peak is the lists' own.
        threads = [threading.Thread(target=_get, args=(base + pages["list"],)) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        found["peak MiB"] = _peak_mib(web.pid)
        for label, path in pages.items():
            _get(base + path)  # warm
            taken = [_get(base + path) for _ in range(requests)]
            found[label] = (statistics.median(t for t, _ in taken) * 1000, taken[0][1])
        return found
    finally:
        web.terminate()
        web.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--then", required=True, help="the earlier commit")
    parser.add_argument("--heavy", type=int, default=11)
    parser.add_argument("--result-mb", type=int, default=20)
    parser.add_argument("--deep", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="web-heavy-") as folder:
        then = extract(args.then, Path(folder) / "then")
        db = Path(folder) / "heavy.db"
        newest, until, before = fill(db, args.heavy, args.result_mb, args.deep)
        common = {
            "healthz": "/healthz",
            "list": "/tasks?status=all",
            "task page": "/tasks/" + HEAVY_ID.format(0),
        }
        deep_then = f"/tasks?status=all&until={urllib.parse.quote(newest)}&skip={args.deep}"
        deep_now = f"/tasks?status=all&until={urllib.parse.quote(until)}&before={before}"
        rows = {
            "then": measure(then, db, {**common, "deepest page": deep_then}, args.requests),
            "now": measure(NOW, db, {**common, "deepest page": deep_now}, args.requests),
        }
    print(
        f"{args.heavy} results of {args.result_mb} MB, {args.deep:,} tasks to page through; "
        f"medians of {args.requests}"
    )
    print(f"{'request':<16}{'then ms':>12}{'then bytes':>14}{'now ms':>12}{'now bytes':>14}")
    for label in (*common, "deepest page"):
        (t_ms, t_bytes), (n_ms, n_bytes) = rows["then"][label], rows["now"][label]  # type: ignore[misc]
        print(f"{label:<16}{t_ms:>12.1f}{t_bytes:>14,}{n_ms:>12.1f}{n_bytes:>14,}")
    print(f"{'peak MiB (6 lists at once)':<30}{rows['then']['peak MiB']:>12.0f}"
          f"{rows['now']['peak MiB']:>26.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
