"""A long day, compressed: a mixed load for a given time, with retention on, and what it
leaves behind.

    uv run python bench/soak.py [--minutes 5] [--dsn DSN]     # PostgreSQL
    uv run python bench/soak.py [--minutes 5]                 # SQLite, in a temp dir

Two node processes (buckets 0-31 and 32-63), each submitting 20 thread and 20
``async def`` tasks a second, a delayed and a deduplicated submit every second, a
three-step pipeline every 5 s, and a schedule firing every 2 s; each node prunes its
own buckets' tasks finished over ``--keep`` seconds ago (default 60). Beside them a
dashboard process polled every 2 s, a CLI pause then resume of a running task every
2 s, and ``prune --older-than`` (twice ``--keep``) every minute.

Every 10 s it samples each process's RSS, open files, threads and server connections
(PostgreSQL: TCP connections to the server's port) and the store's rows per table.
It prints each as a slope per minute over the run after its first third (the warm-up:
retention has had its first pass), the last sample of each, and the must-be-0 lines.
Exits 1 when a must-be-0 line is not 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import timedelta
from pathlib import Path

from chongming_task import CancellationToken, Controller, Pipeline, TaskStatus
from chongming_task.model import TaskQuery
from chongming_task.policies import BucketPolicy, parse_buckets
from chongming_task.schedules import IntervalTrigger
from chongming_task.states import NON_TERMINAL, is_legal
from chongming_task.stores import open_store

ROOT = Path(__file__).resolve().parents[1]
S = TaskStatus
TABLES = ("tasks", "transitions", "commands", "late_reports", "pipelines", "schedules", "nodes")


# -- a node ------------------------------------------------------------------------------


def node_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--db", required=True)
    p.add_argument("--schema")
    p.add_argument("--owner", required=True)
    p.add_argument("--owned", required=True)
    p.add_argument("--keep", type=float, required=True)
    a = p.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    owned = parse_buckets(a.owned, 64)
    keys = [k for k in (f"k{i}" for i in range(2000)) if BucketPolicy(64).bucket_for(k) in owned]
    store = open_store(a.db, schema=a.schema)
    node = Controller(
        store,
        owner=a.owner,
        owned_buckets=owned,
        lease_ttl=10.0,
        retention={"*": timedelta(seconds=a.keep)},
    )

    @node.task(name="work")
    def work(token: CancellationToken, n: int) -> int:
        token.sleep(0.01)
        return n

    @node.task(name="awork")
    async def awork(token: CancellationToken, n: int) -> int:
        await token.asleep(0.01)
        await asyncio.sleep(0)
        return n

    @node.task(name="step")
    def step(token: CancellationToken) -> str:
        token.sleep(0.05)
        return "step"

    @node.task(name="slow")
    def slow(token: CancellationToken) -> str:
        for _ in range(100):  # 5 s, checkpointing: what the CLI pauses and resumes
            token.checkpoint()
            token.sleep(0.05)
        return "slow"

    node.schedule("tick", "step", IntervalTrigger(seconds=2.0), bucket_key=keys[0])
    submitted = 0
    for tick in itertools.count():
        if stop.wait(0.1):
            break
        key = keys[tick % len(keys)]
        try:
            for n in range(2):
                node.tasks["work"].configure(bucket_key=key).submit(tick * 2 + n)
                node.tasks["awork"].configure(bucket_key=key).submit(tick * 2 + n)
            submitted += 4
            if tick % 10 == 0:
                node.tasks["work"].configure(delay=3.0, bucket_key=key).submit(-1)
                node.tasks["slow"].configure(
                    dedupe_key=f"{a.owner}-{tick // 10 % 5}", bucket_key=key
                ).submit()
                submitted += 2
            if tick % 50 == 0:
                flow = Pipeline("chain")
                flow.add("a", "step", bucket_key=key)
                flow.add("b", "step", depends_on=["a"], bucket_key=key)
                flow.add("c", "step", depends_on=["b"], bucket_key=key)
                node.submit_pipeline(flow)
                submitted += 3
        except Exception as exc:  # a store fault: counted, the load goes on
            print(json.dumps({"fault": f"{type(exc).__name__}: {exc}"}), flush=True)
    node.close(timeout=10)
    store.close()
    print(json.dumps({"submitted": submitted}), flush=True)
    return 0


# -- what a process costs --------------------------------------------------------------------


def process_sample(pid: int, port: int | None) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    fds = os.listdir(f"/proc/{pid}/fd")
    sample = {
        "rss_kb": float(fields["VmRSS"].split()[0]),
        "fds": float(len(fds)),
        "threads": float(fields["Threads"]),
    }
    if port is not None:
        sample["conns"] = float(_connections(pid, fds, port))
    return sample


def _connections(pid: int, fds: list[str], port: int) -> int:
    """TCP connections of ``pid`` to ``port`` (from /proc: its sockets' inodes)."""
    inodes = set()
    for fd in fds:
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = 0
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                parts = line.split()
                remote_port = int(parts[2].rsplit(":", 1)[1], 16)
                if remote_port == port and parts[9] in inodes and parts[3] == "01":
                    found += 1
    return found


def rows(db: str, schema: str | None) -> dict[str, int]:
    if schema is None:
        import sqlite3

        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
        try:
            return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(db, autocommit=True) as conn:
        return {
            t: int(conn.execute(f"SELECT count(*) FROM {schema}.{t}").fetchone()[0])  # type: ignore[index]
            for t in TABLES
        }


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope per minute of (seconds, value) points."""
    if len(points) < 2:
        return 0.0
    xs = [x / 60 for x, _ in points]
    ys = [y for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return 0.0 if den == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den


# -- the run ---------------------------------------------------------------------------------


def cli(db: str, schema: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "chongming_task", "--db", db]
    if schema:
        command += ["--pg-schema", schema]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=120)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_node":
        return node_main(sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--dsn", default=None, help="PostgreSQL (default: SQLite in a temp dir)")
    p.add_argument("--keep", type=float, default=60.0, help="retention's age, seconds")
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="chongming-soak-") as tmp:
        if a.dsn:
            from chongming_task.stores.postgres import PostgresTaskStore

            schema: str | None = f"chongming_soak_{secrets.token_hex(4)}"
            made = PostgresTaskStore(a.dsn, schema=schema)
            made.create_schema()
            made.close()
            db = a.dsn
            import psycopg

            port: int | None = int(psycopg.conninfo.conninfo_to_dict(a.dsn).get("port") or 5432)
        else:
            schema, port = None, None
            db = str(Path(tmp) / "soak.db")
            open_store(db).close()
        try:
            return soak(db, schema, port, a.minutes, a.keep, Path(tmp))
        finally:
            if schema is not None:
                import psycopg

                with psycopg.connect(db, autocommit=True) as conn:
                    conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE".encode())


def soak(
    db: str, schema: str | None, port: int | None, minutes: float, keep: float, tmp: Path
) -> int:
    where = ["--db", db, *(["--schema", schema] if schema else [])]
    logs = contextlib.ExitStack()
    nodes = {}
    for name, owned in (("soak-a", "0-31"), ("soak-b", "32-63")):
        log = logs.enter_context(open(tmp / f"{name}.log", "w"))  # noqa: SIM115
        command = [sys.executable, str(Path(__file__)), "_node", *where, "--owner", name,
                   "--owned", owned, "--keep", str(keep)]  # fmt: skip
        nodes[name] = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT
        )
    web_port = _free_port()
    web_log = logs.enter_context(open(tmp / "web.log", "w"))  # noqa: SIM115
    web = subprocess.Popen(
        [sys.executable, "-m", "chongming_task", "--db", db,
         *(["--pg-schema", schema] if schema else []), "web", "--port", str(web_port)],
        stdout=subprocess.DEVNULL, stderr=web_log, cwd=ROOT,
    )  # fmt: skip
    processes = {**{n: p.pid for n, p in nodes.items()}, "web": web.pid}
    samples: dict[str, list[tuple[float, dict[str, float]]]] = {n: [] for n in processes}
    table_rows: list[tuple[float, dict[str, int]]] = []
    dashboard = {"polls": 0, "errors": 0}
    controls = {"sent": 0, "failed": 0}
    prunes = {"runs": 0, "failed": 0}
    began = time.monotonic()
    end = began + minutes * 60
    next_sample = next_poll = next_control = began
    next_prune = began + 60
    rng = random.Random(7)
    try:
        while (now := time.monotonic()) < end:
            if now >= next_poll:
                next_poll += 2
                dashboard["polls"] += 1
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/", timeout=30) as r:
                        dashboard["errors"] += r.status != 200
                except Exception:
                    dashboard["errors"] += now - began > 10  # the first seconds: starting
            if now >= next_control:
                next_control += 2
                listed = cli(db, schema, "--json", "ps", "--status", "running", "--name", "slow")
                running = json.loads(listed.stdout) if listed.returncode == 0 else []
                if running:
                    task_id = rng.choice(running)["task_id"]
                    for word in ("pause", "resume"):
                        controls["sent"] += 1
                        controls["failed"] += cli(db, schema, word, task_id).returncode != 0
            if now >= next_prune:
                next_prune += 60
                prunes["runs"] += 1
                older = f"{int(2 * keep)}s"
                prunes["failed"] += cli(db, schema, "prune", "--older-than", older).returncode != 0
            if now >= next_sample:
                next_sample += 10
                at = now - began
                for name, pid in processes.items():
                    with contextlib.suppress(OSError, KeyError):
                        samples[name].append((at, process_sample(pid, port)))
                table_rows.append((at, rows(db, schema)))
            time.sleep(0.05)
    finally:
        for proc in nodes.values():
            proc.send_signal(signal.SIGTERM)
        web.send_signal(signal.SIGINT)
        said = {n: proc.communicate(timeout=60)[0] for n, proc in nodes.items()}
        with contextlib.suppress(subprocess.TimeoutExpired):
            web.wait(30)
        if web.poll() is None:
            web.kill()
        logs.close()
    return report(db, schema, minutes, samples, table_rows, said, dashboard, controls, prunes)


def report(
    db: str,
    schema: str | None,
    minutes: float,
    samples: dict[str, list[tuple[float, dict[str, float]]]],
    table_rows: list[tuple[float, dict[str, int]]],
    said: dict[str, str],
    dashboard: dict[str, int],
    controls: dict[str, int],
    prunes: dict[str, int],
) -> int:
    warm = minutes * 60 / 3
    kind = "PostgreSQL" if schema else "SQLite"
    print(f"soak on {kind}, {minutes:g} min; slopes per minute after the first third")
    for name, points in samples.items():
        late = [(t, s) for t, s in points if t >= warm]
        if not late:
            continue
        last = late[-1][1]
        parts = [
            f"{metric} {last[metric]:,.0f} ({slope([(t, s[metric]) for t, s in late]):+,.1f}/min)"
            for metric in last
        ]
        print(f"  {name:7} " + ", ".join(parts))
    late_rows = [(t, r) for t, r in table_rows if t >= warm]
    if late_rows:
        last_rows = late_rows[-1][1]
        print("  rows    " + ", ".join(
            f"{t} {last_rows[t]:,} ({slope([(x, r[t]) for x, r in late_rows]):+,.1f}/min)"
            for t in TABLES
        ))  # fmt: skip
    submitted = faults = 0
    for out in said.values():
        for line in out.splitlines():
            data = json.loads(line)
            submitted += data.get("submitted", 0)
            faults += "fault" in data
    store = open_store(db, schema=schema)
    try:
        everything = store.query(TaskQuery(brief=True))
        unfinished = [s for s in everything if s.status in NON_TERMINAL]
        keyed: dict[str, int] = {}
        for s in unfinished:
            if s.dedupe_key is not None:
                keyed[s.dedupe_key] = keyed.get(s.dedupe_key, 0) + 1
        sample = random.Random(1).sample(everything, min(300, len(everything)))
        illegal = 0
        for s in sample:
            trail = store.history(s.task_id)
            versions = [t.version for t in trail]
            moves = all(
                t.from_status is None or is_legal(t.from_status, t.to_status) for t in trail
            )
            illegal += not moves or versions != sorted(set(versions))
    finally:
        store.close()
    counts = {
        "tasks submitted": submitted,
        "dashboard polls": dashboard["polls"],
        "CLI controls sent": controls["sent"],
        "prune runs": prunes["runs"],
        "tasks in the store at the end": len(everything),
    }
    must_be_0 = {
        "submits that raised": faults,
        "dashboard polls answered other than 200": dashboard["errors"],
        "CLI controls that failed": controls["failed"],
        "prune runs that failed": prunes["failed"],
        "tasks lost": sum(s.status is S.LOST for s in everything),
        "tasks left unfinished after the nodes closed": len(unfinished),
        "dedupe keys held by two unfinished tasks": sum(n > 1 for n in keyed.values()),
        "illegal or broken trails (300 sampled)": illegal,
    }
    for k, v in counts.items():
        print(f"  {k}: {v:,}")
    for k, v in must_be_0.items():
        print(f"  {k}: {v}  (must be 0)")
    return 1 if any(must_be_0.values()) else 0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    sys.exit(main())
