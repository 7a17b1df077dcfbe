"""What the costliest dashboard requests cost, this tree beside an earlier commit.

    uv run python bench/web_heavy.py --then REV [--result-mb 20] [--heavy 11] [--deep 100000]

One SQLite store a tree, made by that tree's own code (each reads the schema it writes):
``--heavy`` succeeded tasks whose results are ``--result-mb`` MB each, and ``--deep``
small tasks to page through. For the package at ``--then`` (its ``src/`` from this
checkout's history) and for this tree, ``chongming-task web`` serves its file, and the
bench asks it, each request ``--requests`` times:

- six ``/tasks?status=all`` at once, first, then six ``/tasks/ID`` of heavy tasks at
  once: the server's peak memory (``VmHWM``) is read after each;
- ``/healthz``: the floor, one point read;
- ``/tasks?status=all``: the list, with every heavy task on its first page;
- ``/tasks/ID`` of a heavy task, and the bytes it sends;
- the costliest page a URL can ask for: the page ``--deep`` tasks down by its key
  (``until`` + ``before``), which is what the "Older" link gives.

Medians in milliseconds, bytes of the answer, the task page's median against
``/healthz``'s, and the peak RSS in MiB, side by side.
"""

from __future__ import annotations

import argparse
import json
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
    """The store, made by the package this process imports (``--child-fill``); returns
    the newest creation time, and the key (``until``, ``before``) of the task ``deep``
    down."""
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
        # First, before any other page: the peak is the lists' own, then the pages'.
        for label in ("list", "task page"):
            threads = [threading.Thread(target=_get, args=(base + pages[label],)) for _ in range(6)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            found[f"peak MiB after 6 {label}s at once"] = _peak_mib(web.pid)
        for label, path in pages.items():
            _get(base + path)  # warm
            taken = [_get(base + path) for _ in range(requests)]
            found[label] = (statistics.median(t for t, _ in taken) * 1000, taken[0][1])
        return found
    finally:
        web.terminate()
        web.wait(30)


def filled(src: Path, db: Path, args: argparse.Namespace) -> tuple[str, str, str]:
    """``fill`` run by the package under ``src``, in a process of its own."""
    command = [sys.executable, __file__, "--child-fill", str(db), "--then", "-"]
    command += ["--heavy", str(args.heavy), "--result-mb", str(args.result_mb)]
    command += ["--deep", str(args.deep)]
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    newest, until, before = json.loads(out.splitlines()[-1])
    return newest, until, before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--then", required=True, help="the earlier commit")
    parser.add_argument("--heavy", type=int, default=11)
    parser.add_argument("--result-mb", type=int, default=20)
    parser.add_argument("--deep", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--child-fill", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_fill:
        print(json.dumps(fill(Path(args.child_fill), args.heavy, args.result_mb, args.deep)))
        return
    with tempfile.TemporaryDirectory(prefix="web-heavy-") as folder:
        then = extract(args.then, Path(folder) / "then")
        dbs = {"then": Path(folder) / "then.db", "now": Path(folder) / "now.db"}
        common = {
            "healthz": "/healthz",
            "list": "/tasks?status=all",
            "task page": "/tasks/" + HEAVY_ID.format(0),
        }
        rows = {}
        for tree, src in (("then", then), ("now", NOW)):
            _, until, before = filled(src, dbs[tree], args)
            deep = f"/tasks?status=all&until={urllib.parse.quote(until)}&before={before}"
            rows[tree] = measure(src, dbs[tree], {**common, "deepest page": deep}, args.requests)
    print(
        f"{args.heavy} results of {args.result_mb} MB, {args.deep:,} tasks to page through; "
        f"medians of {args.requests}"
    )
    print(f"{'request':<16}{'then ms':>12}{'then bytes':>14}{'now ms':>12}{'now bytes':>14}")
    for label in (*common, "deepest page"):
        (t_ms, t_bytes), (n_ms, n_bytes) = rows["then"][label], rows["now"][label]  # type: ignore[misc]
        print(f"{label:<16}{t_ms:>12.1f}{t_bytes:>14,}{n_ms:>12.1f}{n_bytes:>14,}")
    for tree in ("then", "now"):
        page, floor = rows[tree]["task page"][0], rows[tree]["healthz"][0]  # type: ignore[index]
        print(f"{tree}: the task page {page / floor:.1f}x /healthz")
    for label in ("list", "task page"):
        peak = f"peak MiB after 6 {label}s at once"
        print(f"{peak:<36}{rows['then'][peak]:>8.0f}{rows['now'][peak]:>26.0f}")


if __name__ == "__main__":
    main()
