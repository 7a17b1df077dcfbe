"""Fault campaign: SIGKILL node processes mid-task and check that the store still tells
the truth.

    uv run python bench/chaos.py [--kills N] [--ttl SECONDS] [--dsn DSN] [--seed S]

Runs on a fresh SQLite file, and also on PostgreSQL (a fresh schema, dropped afterwards)
when ``--dsn`` or ``CHONGMING_TEST_POSTGRES`` names a server.

Two kinds of node process share the store. A *steady* node (buckets 32-63) is never
killed. *Victim* nodes (buckets 0-31) are started one after another and each is killed
with SIGKILL at a random moment, mid-task. Every node keeps eight tasks in flight: half
of them sleep up to twice the lease TTL without ever calling ``checkpoint()`` (healthy,
only their lease says they are alive), some checkpoint progress every 50 ms, and some are
hostile: they checkpoint NaN and non-UTF-8 progress (refused in their own thread) and
half of them return a result no store can hold (which must end ``failed``,
``result_invalid``, never ``succeeded`` in the process and ``running`` in the store). Just before
a task function returns, it appends its task id to the node's record file and fsyncs it:
the record of the functions that really returned. Meanwhile a console process-less
controller owning every bucket runs ``reconcile()`` every 0.3 s, as an operator's cron
would. At the end the last victim and the steady node are closed gracefully, the console
waits one TTL and reconciles once more, and the campaign reads every task and its trail.

Printed per store (each "must be 0" line fails the run when it is not):
  kills, tasks
  returned but not succeeded, in the kill window   (a killed node returned, then died
                                                    before its success was committed:
                                                    recorded ``lost``, result unknown)
  returned but not succeeded, otherwise            must be 0 (an unstorable result
                                                    must be failed/result_invalid)
  succeeded but never returned                     must be 0
  healthy tasks of a live node marked lost         must be 0
  tasks left non-terminal after the final reconcile must be 0
  illegal or broken transitions in the trails      must be 0
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from chongming_task import (
    CancellationToken,
    Controller,
    FailureKind,
    InvalidValue,
    Progress,
    TaskStatus,
    TaskStore,
    current,
)
from chongming_task.policies import BucketPolicy, parse_buckets
from chongming_task.states import NON_TERMINAL, is_legal
from chongming_task.stores import open_store

ROOT = Path(__file__).resolve().parents[1]
VICTIM_BUCKETS = "0-31"
STEADY_BUCKETS = "32-63"
IN_FLIGHT = 8


# -- the node process -------------------------------------------------------------------------


def current_id() -> str:
    """The running task's id (called inside a task function)."""
    running = current()
    assert running is not None
    return running.task_id


def node_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--db", required=True)
    p.add_argument("--schema")
    p.add_argument("--owner", required=True)
    p.add_argument("--owned", required=True)
    p.add_argument("--record", required=True)
    p.add_argument("--ttl", type=float, required=True)
    p.add_argument("--seed", type=int, required=True)
    a = p.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    record = open(a.record, "a", encoding="utf-8")  # noqa: SIM115  # held for the run
    record_lock = threading.Lock()

    def returned(task_id: str, note: str = "ok") -> None:
        """The function really returned: durable before the runtime hears of it."""
        with record_lock:
            record.write(f"{task_id} {note}\n")
            record.flush()
            os.fsync(record.fileno())

    owned = parse_buckets(a.owned, 64)
    store = open_store(a.db, schema=a.schema)
    node = Controller(
        store,
        owner=a.owner,
        owned_buckets=owned,
        lease_ttl=a.ttl,
        activity_interval=0.1,
        max_workers=IN_FLIGHT,
    )
    rng = random.Random(a.seed)
    policy = BucketPolicy(64)
    keys = [k for k in (f"key-{i}" for i in range(5000)) if policy.bucket_for(k) in owned][:64]

    @node.task(name="quiet")
    def quiet(token: CancellationToken, seconds: float) -> dict[str, float]:
        time.sleep(seconds)  # CPU-bound work, say: no checkpoint for up to 2 TTL
        returned(current_id())
        return {"slept": seconds}

    @node.task(name="busy")
    def busy(token: CancellationToken, seconds: float) -> int:
        end = time.monotonic() + seconds
        steps = 0
        while time.monotonic() < end:
            token.checkpoint(Progress(current=steps, message=f"step {steps}"))
            time.sleep(0.05)
            steps += 1
        returned(current_id())
        return steps

    @node.task(name="hostile")
    def hostile(token: CancellationToken, seconds: float) -> object:
        """Hands over what a careless user would: NaN and non-UTF-8 progress, and now
        and then a result no store can hold. Each is refused in this task alone."""
        for bad in (Progress(current=float("nan")), Progress(current=1, message="\udcff")):
            with contextlib.suppress(InvalidValue):
                token.checkpoint(bad)
        time.sleep(seconds)
        if rng.random() < 0.5:
            returned(current_id(), "invalid")
            return {"file": "report-\udcff.csv"}
        returned(current_id())
        return "fine"

    print("ready", flush=True)
    inflight: list = []  # type: ignore[type-arg]
    while not stop.is_set():
        inflight = [r for r in inflight if not r.done()]
        while len(inflight) < IN_FLIGHT:
            kind = rng.choice([quiet, busy, hostile])
            seconds = rng.uniform(0.2, 2 * a.ttl)
            inflight.append(node.tasks[kind].configure(bucket_key=rng.choice(keys)).submit(seconds))
        stop.wait(0.05)
    node.close(timeout=4 * a.ttl)
    store.close()
    record.close()
    return 0


# -- the campaign -----------------------------------------------------------------------------


@dataclass
class Figures:
    store: str
    kills: int = 0
    tasks: int = 0
    returned: int = 0
    unstorable_results: int = 0
    succeeded: int = 0
    lost_of_killed_nodes: int = 0
    returned_not_succeeded_kill_window: int = 0
    returned_not_succeeded_otherwise: int = 0
    succeeded_never_returned: int = 0
    healthy_marked_lost: int = 0
    non_terminal_after_final_reconcile: int = 0
    illegal_transitions: int = 0
    reconciles: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def violations(self) -> int:
        return (
            self.returned_not_succeeded_otherwise
            + self.succeeded_never_returned
            + self.healthy_marked_lost
            + self.non_terminal_after_final_reconcile
            + self.illegal_transitions
        )


class Node:
    def __init__(
        self, db: str, schema: str | None, owner: str, owned: str, work: Path, ttl: float, seed: int
    ) -> None:
        self.owner = owner
        self.record = work / f"returned-{owner}.txt"
        extra = ["--schema", schema] if schema else []
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "_node",
                "--db",
                db,
                *extra,
                "--owner",
                owner,
                "--owned",
                owned,
                "--record",
                str(self.record),
                "--ttl",
                str(ttl),
                "--seed",
                str(seed),
            ],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            self.proc.kill()
            raise RuntimeError(f"node {owner} did not start (said {line!r})")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def close(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        if self.proc.wait(120) != 0:
            raise RuntimeError(f"node {self.owner} exited {self.proc.returncode}")

    def returned(self) -> dict[str, str]:
        """``{task id: "ok" | "invalid"}`` for every function that returned."""
        if not self.record.exists():
            return {}
        return dict(line.split(" ", 1) for line in self.record.read_text().splitlines() if line)


def campaign(
    label: str, db: str, schema: str | None, kills: int, ttl: float, seed: int, work: Path
) -> Figures:
    figures = Figures(store=label, kills=kills)
    rng = random.Random(seed)
    started = time.monotonic()
    console_store: TaskStore = open_store(db, schema=schema)
    console = Controller(console_store, owner="console", poll_commands=False)
    stop_reconcile = threading.Event()
    reconcile_errors: list[str] = []

    def reconcile_loop() -> None:
        while not stop_reconcile.wait(0.3):
            try:
                console.reconcile()
                figures.reconciles += 1
            except Exception as exc:  # counted: an operator's cron would see it
                reconcile_errors.append(f"{type(exc).__name__}: {exc}")

    nodes: list[Node] = []
    killed: set[str] = set()
    steady = Node(db, schema, "steady", STEADY_BUCKETS, work, ttl, seed)
    nodes.append(steady)
    reconciler = threading.Thread(target=reconcile_loop, name="chaos-reconcile")
    reconciler.start()
    try:
        for i in range(kills):
            victim = Node(db, schema, f"victim-{i}", VICTIM_BUCKETS, work, ttl, seed + i + 1)
            nodes.append(victim)
            time.sleep(rng.uniform(0.5, 2.5))
            victim.kill()
            killed.add(victim.owner)
        last = Node(db, schema, "victim-last", VICTIM_BUCKETS, work, ttl, seed + kills + 1)
        nodes.append(last)
        time.sleep(2 * ttl)
        last.close()
        steady.close()
    finally:
        stop_reconcile.set()
        reconciler.join(30)
        for node in nodes:
            if node.proc.poll() is None:
                node.proc.kill()
    time.sleep(ttl + 0.5)  # every lease of a killed node has expired
    console.reconcile()
    figures.problems += reconcile_errors[:5]

    returned: dict[str, str] = {}
    for node in nodes:
        returned.update(node.returned())
    tasks = console.list_tasks()
    figures.tasks = len(tasks)
    figures.returned = len(returned)
    for snapshot in tasks:
        owner = snapshot.owner or "?"
        was_returned = snapshot.task_id in returned
        if returned.get(snapshot.task_id) == "invalid":
            # It returned a value no store can hold: the truth is failed, result_invalid
            # (or lost, if its node was killed before the failure was committed).
            figures.unstorable_results += 1
            failure = snapshot.failure
            if snapshot.status is TaskStatus.LOST and owner in killed:
                figures.returned_not_succeeded_kill_window += 1
            elif (
                snapshot.status is not TaskStatus.FAILED
                or failure is None
                or (failure.kind is not FailureKind.RESULT_INVALID)
            ):
                figures.returned_not_succeeded_otherwise += 1
                figures.problems.append(
                    f"{snapshot.task_id} returned an unstorable result but is "
                    f"{snapshot.status.value}"
                )
        elif snapshot.status is TaskStatus.SUCCEEDED:
            figures.succeeded += 1
            if not was_returned:
                figures.succeeded_never_returned += 1
                figures.problems.append(f"{snapshot.task_id} succeeded but never returned")
        elif was_returned:
            if owner in killed and snapshot.status is TaskStatus.LOST:
                figures.returned_not_succeeded_kill_window += 1
            else:
                figures.returned_not_succeeded_otherwise += 1
                figures.problems.append(
                    f"{snapshot.task_id} of {owner} returned but is {snapshot.status.value}"
                )
        if snapshot.status is TaskStatus.LOST:
            if owner in killed:
                figures.lost_of_killed_nodes += 1
            else:
                figures.healthy_marked_lost += 1
                figures.problems.append(f"{snapshot.task_id} of live node {owner} marked lost")
        if snapshot.status in NON_TERMINAL:
            figures.non_terminal_after_final_reconcile += 1
            figures.problems.append(f"{snapshot.task_id} of {owner} left {snapshot.status.value}")
        previous = None
        for t in console.history(snapshot.task_id):
            broken = (t.from_status is not None and not is_legal(t.from_status, t.to_status)) or (
                previous is not None
                and (t.from_status is not previous.to_status or t.version <= previous.version)
            )
            if broken:
                figures.illegal_transitions += 1
                figures.problems.append(
                    f"{snapshot.task_id}: v{t.version} {t.from_status} -> {t.to_status}"
                )
            previous = t
        if previous is None or previous.to_status is not snapshot.status:
            figures.illegal_transitions += 1
            figures.problems.append(f"{snapshot.task_id}: trail ends apart from the snapshot")
    console.close()
    console_store.close()
    figures.seconds = round(time.monotonic() - started, 1)
    return figures


def report(f: Figures) -> str:
    def must(n: int) -> str:
        return f"{n:6d}  must be 0{'' if n == 0 else '  <-- VIOLATED'}"

    lines = [
        f"== {f.store}: {f.seconds}s, {f.reconciles} concurrent reconciles",
        f"kills                                              {f.kills:6d}",
        f"tasks                                              {f.tasks:6d}",
        f"functions that returned (fsynced record)           {f.returned:6d}",
        f"  of which returned a result no store can hold     {f.unstorable_results:6d}",
        f"succeeded in the store                             {f.succeeded:6d}",
        f"lost, of killed nodes                              {f.lost_of_killed_nodes:6d}",
        f"returned but not succeeded, in the kill window     "
        f"{f.returned_not_succeeded_kill_window:6d}",
        f"returned but not succeeded, otherwise              "
        f"{must(f.returned_not_succeeded_otherwise)}",
        f"succeeded but never returned                       {must(f.succeeded_never_returned)}",
        f"healthy tasks of a live node marked lost           {must(f.healthy_marked_lost)}",
        f"non-terminal after the final reconcile             "
        f"{must(f.non_terminal_after_final_reconcile)}",
        f"illegal or broken transitions                      {must(f.illegal_transitions)}",
    ]
    lines += [f"  ! {p}" for p in f.problems[:20]]
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_node":
        return node_main(sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=20, help="SIGKILLs per store (default 20)")
    p.add_argument("--ttl", type=float, default=3.0, help="lease TTL in seconds (default 3)")
    p.add_argument("--dsn", default=os.environ.get("CHONGMING_TEST_POSTGRES"))
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    seed = a.seed if a.seed is not None else secrets.randbits(32)
    results: list[Figures] = []
    with tempfile.TemporaryDirectory(prefix="chongming-chaos-") as tmp:
        work = Path(tmp)
        sqlite_work = work / "sqlite"
        sqlite_work.mkdir()
        results.append(
            campaign(
                "SQLite", str(sqlite_work / "chaos.db"), None, a.kills, a.ttl, seed, sqlite_work
            )
        )
        print(report(results[-1]), flush=True)
        if a.dsn:
            from chongming_task.stores.postgres import PostgresTaskStore

            schema = f"chongming_chaos_{secrets.token_hex(4)}"
            setup = PostgresTaskStore(a.dsn, schema=schema)
            setup.create_schema()
            setup.close()
            pg_work = work / "postgres"
            pg_work.mkdir()
            try:
                results.append(campaign("PostgreSQL", a.dsn, schema, a.kills, a.ttl, seed, pg_work))
            finally:
                import psycopg

                with psycopg.connect(a.dsn, autocommit=True) as conn:
                    conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE".encode())
            print(report(results[-1]), flush=True)
        else:
            print("(PostgreSQL skipped: give --dsn or CHONGMING_TEST_POSTGRES)")
    print(f"seed {seed}; ttl {a.ttl}s; {a.kills} kills per store")
    if a.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
    return 1 if any(r.violations for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
