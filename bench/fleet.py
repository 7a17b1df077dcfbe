"""A fleet of nodes on one PostgreSQL: what N nodes cost the server, how fast a stop
reaches one of them, and how long ``doctor`` takes.

    uv run python bench/fleet.py [--nodes 10,100,500,1000] [--modes listen,poll:60,poll:0.5]
                                 [--hosts 4] [--settle 45] [--seconds 60] [--stops 20]

Starts a PostgreSQL cluster of its own (``initdb`` + ``pg_ctl`` in a temp dir, fsync on,
``max_connections`` sized for the largest fleet) and a PgBouncer of its own in
transaction mode in front of it (20 server connections); never the server you run.

For each fleet size N and each mode, ``--hosts`` processes run N nodes between them, each
node a real ``Controller`` on a ``PostgresTaskStore(pooled=True)`` of its own through the
PgBouncer (``bench/_fleethost.py``): its own pool, beacon and pulse, command poller, lease
renewal and reconcile of its bucket (node i owns bucket i of N), and one task that sleeps
until stopped. The modes:

- ``listen``: each node also holds a direct ``LISTEN`` connection (``listen_dsn``) and
  polls at its default (the pulse every 10 s, the poller's own pass every 60 s);
- ``poll:S``: no ``LISTEN``; the poller claims every S seconds, the pulse every 10 s
  wakes it when commands wait. ``poll:0.5`` is what a pooled node without ``listen_dsn``
  does by default, the reference.

After ``--settle`` seconds (pools shrink after 30 s unused; the server's statistics lag
up to 10 s) it counts, over ``--seconds``: the database's transactions a second
(``pg_stat_database``), the server connections (``pg_stat_activity``), the connections
the nodes say they hold (their health, as ``nodes`` shows it), and the CPU of the
server's processes, of the PgBouncer and of the node hosts (% of one core). Then
``--stops`` stops of running tasks on random nodes, sent through the PgBouncer as the
CLI sends them, one every 0.6 s (20 of them span more than a beacon's period): each from
the request until ``stopped`` is in the store (read every 2 ms on a direct connection),
and the server transactions each stop cost beyond the fleet's idle rate. Last, the wall
time of ``chongming-task doctor`` over the fleet.

The simulated nodes share the machine's two cores with the server, the PgBouncer and
each other (16 threads a node): past a few hundred nodes their own scheduling adds to
the stop latencies, which a fleet of machines would not see.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.pg_cluster import ThrowawayCluster, _bindir  # noqa: E402
from tests.integration.pgbouncer_support import PROGRAM, pgbouncer  # noqa: E402

from _stats import percentile  # noqa: E402  (bench/ is on sys.path when run as a script)
from chongming_task import CommandAction  # noqa: E402
from chongming_task.control import StoreControl  # noqa: E402
from chongming_task.stores.postgres import PostgresTaskStore  # noqa: E402

SCHEMA = "fleet"
HOST = ROOT / "bench" / "_fleethost.py"
TICK = os.sysconf("SC_CLK_TCK")
GAP = 0.6
START_LIMIT = 600.0
"""Seconds a fleet may take to start before it counts as too large for this machine."""
"""Seconds between two stops: 20 span more than a beacon's period (10 s)."""


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of ``pids`` so far (those gone count nothing)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / TICK


def measured_pids(cluster: ThrowawayCluster) -> tuple[list[int], list[int]]:
    """The server's processes (the postmaster and its children) and this run's PgBouncer
    (its configuration lives in a temporary directory of ours), from one scan of /proc."""
    master = int((cluster.data / "postmaster.pid").read_text().split()[0])
    servers, bouncers = [master], []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == master:
                servers.append(int(entry.name))
                continue
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if argv[0].endswith(b"pgbouncer") and b"chongming-pgbouncer-" in argv[-2]:
                bouncers.append(int(entry.name))
    return servers, bouncers


@dataclass
class Row:
    nodes: int
    mode: str
    started: float
    tx_per_s: float
    server_conns: int
    node_conns: float
    server_cpu: float
    bouncer_cpu: float
    hosts_cpu: float
    stop_p50: float
    stop_p99: float
    stop_max: float
    tx_per_stop: float
    doctor: float


class Fleet:
    """``count`` nodes across ``hosts`` processes; ``tasks`` maps each node to its task."""

    def __init__(self, dsn: str, listen_dsn: str | None, poll: str, count: int, hosts: int):
        self.procs: list[subprocess.Popen[str]] = []
        self.tasks: dict[str, str] = {}
        share = [count // hosts + (1 if h < count % hosts else 0) for h in range(hosts)]
        first = 0
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(ROOT / "src")}
        for n in share:
            if n:
                args = [dsn, listen_dsn or "-", poll, str(first), str(n), str(count)]
                self.procs.append(
                    subprocess.Popen(
                        [sys.executable, str(HOST), *args],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        text=True,
                        env=env,
                    )
                )
            first += n

    def wait_up(self, limit: float = START_LIMIT) -> None:
        """Until every host has started its nodes; past ``limit`` seconds the hosts are
        killed and the fleet counts as one this machine cannot start."""
        late = threading.Timer(limit, lambda: [p.kill() for p in self.procs])
        late.start()
        try:
            for proc in self.procs:
                assert proc.stdout is not None
                for line in proc.stdout:
                    data = json.loads(line)
                    if data.get("up"):
                        break
                    self.tasks[data["node"]] = data["task"]
                else:
                    if late.finished.is_set():
                        raise RuntimeError(f"the nodes did not all start within {limit:.0f} s")
                    raise RuntimeError(f"a host process ended early (exit {proc.wait()})")
        finally:
            late.cancel()

    def close(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(OSError):
                assert proc.stdin is not None
                proc.stdin.close()
        for proc in self.procs:
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@contextlib.contextmanager
def fleet(dsn: str, listen_dsn: str | None, poll: str, count: int, hosts: int) -> Iterator[Fleet]:
    running = Fleet(dsn, listen_dsn, poll, count, hosts)
    try:
        running.wait_up()
        yield running
    finally:
        running.close()


def xacts(mon: psycopg.Connection) -> int:  # type: ignore[type-arg]
    mon.execute("SELECT pg_stat_clear_snapshot()")
    row = mon.execute(
        "SELECT xact_commit + xact_rollback FROM pg_stat_database "
        "WHERE datname = current_database()"
    ).fetchone()
    assert row is not None
    return int(row[0])


def wait_running(mon: psycopg.Connection, count: int) -> None:  # type: ignore[type-arg]
    deadline = time.monotonic() + 300
    while True:
        row = mon.execute(
            f"SELECT count(*) FROM {SCHEMA}.tasks WHERE status = 'running'"
        ).fetchone()
        if row is not None and row[0] == count:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {row[0] if row else 0} of {count} tasks running")
        time.sleep(0.5)


def stops(
    bouncer: str,
    mon: psycopg.Connection,
    task_ids: list[str],  # type: ignore[type-arg]
) -> tuple[list[float], int]:
    """Stop ``task_ids`` one every 0.6 s through the PgBouncer; each one's seconds from the
    request until ``stopped`` is read, and the monitor's own reads (to subtract)."""
    store = PostgresTaskStore(bouncer, schema=SCHEMA, pooled=True, announce_writes=False)
    control = StoreControl(store, owner="fleet-console")
    sent: dict[str, float] = {}
    seen: dict[str, float] = {}
    lock = threading.Lock()

    def send() -> None:
        for task_id in task_ids:
            started = time.monotonic()
            control.send(task_id, CommandAction.STOP, "fleet bench")
            with lock:
                sent[task_id] = started
            time.sleep(GAP)

    sender = threading.Thread(target=send)
    sender.start()
    reads = 0
    deadline = time.monotonic() + 120 + GAP * len(task_ids)
    try:
        while len(seen) < len(task_ids) and time.monotonic() < deadline:
            with lock:
                waiting = [t for t in sent if t not in seen]
            if waiting:
                reads += 1
                for (task_id,) in mon.execute(
                    f"SELECT task_id FROM {SCHEMA}.tasks WHERE task_id = ANY(%s) "
                    "AND status = 'stopped'",
                    [waiting],
                ):
                    seen[task_id] = time.monotonic() - sent[task_id]
            time.sleep(0.002)
    finally:
        sender.join()
        store.close()
    if len(seen) < len(task_ids):
        raise RuntimeError(f"{len(task_ids) - len(seen)} stops did not land within 120 s")
    return [seen[t] for t in task_ids], reads


def doctor_seconds(dsn: str) -> float:
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "chongming_task", "--db", dsn, "--pg-schema", SCHEMA, "doctor"],
        capture_output=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    return time.monotonic() - started


def measure(
    cluster: ThrowawayCluster, bouncer: str, count: int, mode: str, args: argparse.Namespace
) -> Row:
    with psycopg.connect(cluster.dsn, autocommit=True) as mon:
        mon.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    made = PostgresTaskStore(cluster.dsn, schema=SCHEMA)
    made.create_schema()
    made.close()
    listen_dsn = cluster.dsn if mode == "listen" else None
    poll = "default" if mode == "listen" else mode.split(":", 1)[1]
    began = time.monotonic()
    with (
        fleet(bouncer, listen_dsn, poll, count, args.hosts) as running,
        psycopg.connect(cluster.dsn, autocommit=True) as mon,
    ):
        wait_running(mon, count)
        started = time.monotonic() - began
        time.sleep(args.settle)
        hosts = [p.pid for p in running.procs]
        servers, bouncers = measured_pids(cluster)
        before, cpu_s, cpu_b, cpu_h, t0 = (
            xacts(mon),
            cpu_seconds(servers),
            cpu_seconds(bouncers),
            cpu_seconds(hosts),
            time.monotonic(),
        )
        time.sleep(args.seconds)
        elapsed = time.monotonic() - t0
        rate = (xacts(mon) - before) / elapsed
        server_cpu = (cpu_seconds(servers) - cpu_s) / elapsed
        bouncer_cpu = (cpu_seconds(bouncers) - cpu_b) / elapsed
        hosts_cpu = (cpu_seconds(hosts) - cpu_h) / elapsed
        row = mon.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        ).fetchone()
        server_conns = int(row[0]) if row else 0
        said = [
            int(r[0])
            for r in mon.execute(
                f"SELECT (health::jsonb->>'connections')::int FROM {SCHEMA}.nodes "
                "WHERE stopped_at IS NULL AND node LIKE 'node-%%'"
            )
            if r[0] is not None
        ]
        picked = random.Random(count).sample(sorted(running.tasks.values()), min(args.stops, count))
        before, t0 = xacts(mon), time.monotonic()
        took, reads = stops(bouncer, mon, picked)
        time.sleep(12)  # the statistics lag
        spent = xacts(mon) - before - reads - rate * (time.monotonic() - t0)
        doctor = doctor_seconds(cluster.dsn)
    return Row(
        nodes=count,
        mode=mode,
        started=started,
        tx_per_s=rate,
        server_conns=server_conns,
        node_conns=sum(said) / max(len(said), 1),
        server_cpu=server_cpu,
        bouncer_cpu=bouncer_cpu,
        hosts_cpu=hosts_cpu,
        stop_p50=percentile(took, 50) * 1000,
        stop_p99=percentile(took, 99) * 1000,
        stop_max=max(took) * 1000,
        tx_per_stop=spent / len(picked),
        doctor=doctor,
    )


def show(row: Row) -> None:
    print(
        f"{row.nodes:5} {row.mode:9} {row.tx_per_s:8.1f} {row.tx_per_s / row.nodes:7.3f} "
        f"{row.server_conns:6} {row.node_conns:5.1f} {row.server_cpu * 100:6.0f}% "
        f"{row.bouncer_cpu * 100:6.1f}% "
        f"{row.hosts_cpu * 100:6.0f}% {row.stop_p50:8.1f} {row.stop_p99:8.1f} "
        f"{row.stop_max:8.1f} {row.tx_per_stop:7.1f} {row.doctor:6.2f} {row.started:6.0f}",
        flush=True,
    )


def main() -> int:
    logging.getLogger("chongming_task.store").setLevel(logging.ERROR)
    # A kill ends the run through its cleanup: the cluster and PgBouncer are removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", default="10,100,500,1000")
    p.add_argument("--modes", default="listen,poll:60,poll:0.5")
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--settle", type=float, default=45.0)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--stops", type=int, default=20)
    a = p.parse_args()
    sizes = [int(n) for n in a.nodes.split(",")]
    modes = a.modes.split(",")
    bindir = _bindir()
    if bindir is None or PROGRAM is None:
        print("needs PostgreSQL's server binaries (initdb, pg_ctl) and pgbouncer")
        return 2
    most = max(sizes)
    cluster = ThrowawayCluster(
        bindir,
        settings={
            "fsync": "on",
            "full_page_writes": "on",
            "max_connections": str(most + 100),
            "shared_buffers": "256MB",
        },
    )
    try:
        cluster.init()
        cluster.start()
        with pgbouncer(cluster.dsn, clients=most * 4 + 100, pool_size=20) as bouncer:
            print(
                "nodes mode        tx/s  a node  sconn  nconn  srvCPU  pgbCPU hstCPU  stop p50  "
                "stop p99 stop max  tx/stop doctor  start"
            )
            print(" " * 64 + "(ms)     (ms)     (ms)          (s)   (s)")
            for count in sizes:
                for mode in modes:
                    try:
                        show(measure(cluster, bouncer, count, mode, a))
                    except RuntimeError as exc:  # this machine's limit, said as such
                        print(f"{count:5} {mode:9} not measured here: {exc}", flush=True)
    finally:
        cluster.remove()
    return 0


if __name__ == "__main__":
    sys.exit(main())
