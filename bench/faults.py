"""Fault scenarios, each with its must-be-0 lines: what the store and the nodes say when
clocks are wrong, the disk fills, nodes die mid-pipeline, one node is cut off from the
store, and operators send quick controls from other processes.

    uv run python bench/faults.py [--dsn DSN] [--only NAME ...] [--rounds N]

Scenarios (every node is a real process; the controls are real CLI processes):

  skew        PostgreSQL. Two nodes, one clock 60 s ahead, one 60 s behind. An operator
              stops a task, a node whose clock is behind cancels it 0.1 s later; then
              the fast node is killed and a replacement (as fast) takes its buckets.
  full-disk   SQLite on a 4 MB tmpfs, filled by another file while tasks checkpoint,
              then freed (needs root; skipped otherwise).
  kill        Both stores. A node runs pipelines and a 1 s schedule and is killed (kill
              -9) again and again; a replacement takes its buckets each time. Then
              ``doctor`` is asked, with no ``reconcile`` by hand.
  partition   PostgreSQL. A node reaches the server through a TCP proxy; the proxy is
              cut for longer than the lease TTL while its buckets' owner reconciles;
              the tasks finish on the node; the proxy heals.
  controls    Both stores. Quick control sequences from CLI processes (pause then
              resume, resume then pause, stop then resume, pause then stop, pause then
              resume then pause) on running tasks of another process.
  unheard     PostgreSQL. A node submits as fast as four threads can (one task a call,
              and batches) through a TCP proxy that, again and again, drops the
              server's answers and then cuts: commits done by the server that their
              callers were told failed. Every call is tagged, so each is followed.
  dead-delayed  Both stores. A node submits tasks delayed 120 s and is killed; doctor
              is asked as soon as its declaration expires; an heir takes its buckets.

Exits 1 when a must-be-0 line is not 0.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _faultnode import NodeProc, node_main  # bench/ is on sys.path when run as a script
from chongming_task import Controller, TaskStatus
from chongming_task.control import StoreControl
from chongming_task.fleet import dead_nodes
from chongming_task.model import CommandAction
from chongming_task.states import is_legal
from chongming_task.stores import open_store
from chongming_task.stores.capabilities import Capabilities
from chongming_task.stores.protocol import TaskStore

S = TaskStatus


# -- what every scenario checks ---------------------------------------------------------------


@dataclass
class Figures:
    scenario: str
    store: str
    counts: dict[str, int] = field(default_factory=dict)
    must_be_0: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    skipped: str | None = None
    problems: list[str] = field(default_factory=list)
    said: list[str] = field(default_factory=list)
    """What the node logged, where the scenario counts its lines."""

    @property
    def violations(self) -> int:
        return sum(self.must_be_0.values())


def illegal_moves(store: TaskStore, task_ids: list[str], problems: list[str]) -> int:
    bad = 0
    for task_id in task_ids:
        trail = store.history(task_id)
        for before, after in itertools.pairwise(trail):
            if after.from_status is not before.to_status or not is_legal(
                before.to_status, after.to_status
            ):
                bad += 1
                problems.append(f"{task_id}: {before.to_status} -> {after.to_status}")
    return bad


def wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def cli(db: str, schema: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "chongming_task", "--db", db]
    if schema:
        command += ["--pg-schema", schema]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=120)


@contextlib.contextmanager
def place(kind: str, dsn: str | None, work: Path) -> Iterator[tuple[str, str | None]]:
    """A fresh store: a SQLite file in ``work``, or a new schema on ``dsn`` (dropped)."""
    if kind == "SQLite":
        yield str(work / f"faults-{secrets.token_hex(3)}.db"), None
        return
    assert dsn is not None
    from chongming_task.stores.postgres import PostgresTaskStore

    schema = f"chongming_faults_{secrets.token_hex(4)}"
    setup = PostgresTaskStore(dsn, schema=schema)
    setup.create_schema()
    setup.close()
    try:
        yield dsn, schema
    finally:
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE".encode())


# -- the scenarios ----------------------------------------------------------------------------


def skew(dsn: str, work: Path) -> Figures:
    f = Figures("skew", "PostgreSQL")
    ttl = "2"
    with place("PostgreSQL", dsn, work) as (db, schema):
        fast = NodeProc(db, schema, "--owner", "fast", "--owned", "0-31", "--ttl", ttl,
                        "--clock-offset", "60", "--loops", "4")  # fmt: skip
        slow = NodeProc(db, schema, "--owner", "slow", "--owned", "32-63", "--ttl", ttl,
                        "--clock-offset", "-60", "--loops", "4")  # fmt: skip
        store = open_store(db, schema=schema)
        try:
            ids = fast.task_ids + slow.task_ids
            wait_for(lambda: all(store.get(t).status is S.RUNNING for t in ids), 20)  # type: ignore[union-attr]
            # An operator stops a task; 0.1 s later a node a minute behind cancels it.
            target = fast.task_ids[0]
            StoreControl(store, owner="operator").send(target, CommandAction.STOP)
            time.sleep(0.1)
            behind = datetime.now(UTC) - timedelta(seconds=60)
            StoreControl(store, owner="slow", now=lambda: behind).send(target, CommandAction.CANCEL)
            wait_for(lambda: store.get(target).is_terminal, 20)  # type: ignore[union-attr]
            ended = store.get(target)
            assert ended is not None
            f.must_be_0["commands carried out out of arrival order"] = int(
                ended.status is not S.STOPPED
            )
            # Kill the fast node; a replacement, as fast, takes its buckets.
            fast.kill()
            again = NodeProc(db, schema, "--owner", "fast-2", "--owned", "0-31", "--ttl", ttl,
                             "--clock-offset", "60")  # fmt: skip
            dead = fast.task_ids[1:]
            recovered = wait_for(
                lambda: all(store.get(t).status is S.LOST for t in dead),  # type: ignore[union-attr]
                30,
            )
            f.must_be_0["a dead node's tasks not lost after its replacement started"] = (
                0 if recovered else sum(store.get(t).status is not S.LOST for t in dead)  # type: ignore[union-attr]
            )
            time.sleep(2 * float(ttl))  # the skewed live node keeps its leases meanwhile
            f.counts["the killed node's tasks lost"] = sum(
                store.get(t).status is S.LOST  # type: ignore[union-attr]
                for t in dead
            )
            f.must_be_0["healthy tasks of a live node marked lost"] = sum(
                store.get(t).status is S.LOST  # type: ignore[union-attr]
                for t in slow.task_ids
            )
            f.must_be_0["illegal or broken transitions"] = illegal_moves(store, ids, f.problems)
            f.counts["tasks"] = len(ids)
            again.finish()
            slow.finish()
        finally:
            store.close()
    return f


def full_disk(work: Path) -> Figures:
    f = Figures("full-disk", "SQLite")
    disk = work / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        f.skipped = "needs root and mount(8) for a tmpfs"
        return f
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)])
    if made.returncode != 0:
        f.skipped = "could not mount a tmpfs"
        return f
    log = work / "full-disk-node.log"
    try:
        db = str(disk / "tasks.db")
        node = NodeProc(db, None, "--owner", "node-a", "--ttl", "1", "--loops", "4",
                        "--tell", "--finish-on", str(disk / "finish"), log=log)  # fmt: skip
        store = open_store(db)
        filler = disk / "filler"
        try:
            wait_for(lambda: all(store.get(t).status is S.RUNNING for t in node.task_ids), 20)  # type: ignore[union-attr]
            with filler.open("wb") as out, contextlib.suppress(OSError):
                while True:
                    out.write(b"\0" * 65536)
                    out.flush()
            time.sleep(8)  # four tasks checkpointing, twenty supervisor passes a second
            filler.unlink()
            time.sleep(8)  # long enough for the episode to be over
            (disk / "finish").touch()
            told = node.finish()
        finally:
            store.close()
        said = log.read_text(errors="replace")
        loud = [
            line
            for line in said.splitlines()
            if any(level in line for level in ("WARNING", "ERROR", "CRITICAL"))
        ]
        f.counts["lines logged at WARNING or above"] = len(loud)
        f.said = loud
        f.counts["fault episodes started"] = said.count("store writes failing")
        f.counts["fault episodes ended"] = said.count("store writes succeed again")
        f.must_be_0["tracebacks logged"] = said.count("Traceback")
        f.must_be_0["episode lines beyond one start and one end"] = max(
            0, said.count("store writes failing") - 1
        ) + max(0, said.count("store writes succeed again") - 1)
        f.must_be_0["episodes not said to end"] = int(
            said.count("store writes failing") != said.count("store writes succeed again")
        )
        f.must_be_0["tasks whose caller was not told succeeded"] = sum(
            1 for line in told if "told" in line and not line["said"].startswith("succeeded")
        )
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
    return f


def kill(kind: str, dsn: str | None, work: Path, rounds: int) -> Figures:
    f = Figures("kill", kind)
    ttl = 1.5
    with place(kind, dsn, work) as (db, schema):
        store = open_store(db, schema=schema)
        try:
            node = NodeProc(db, schema, "--owner", "k-0", "--ttl", str(ttl), "--flows")
            for i in range(rounds):
                time.sleep(1.5 + (i % 3) * 0.4)
                node.kill()
                node = NodeProc(db, schema, "--owner", f"k-{i + 1}", "--ttl", str(ttl),
                                "--flows")  # fmt: skip
            time.sleep(1.5)
            node.kill()
            last = NodeProc(db, schema, "--owner", "k-last", "--ttl", str(ttl))
            caps = Capabilities(store)
            settled = wait_for(lambda: not _unfinished(caps), 4 * ttl + 10)
            doctor = cli(db, schema, "--json", "doctor")
            alarms = json.loads(doctor.stdout)["alarms"] if doctor.stdout else []
            everything = store.query()
            ids = [s.task_id for s in everything]
            f.counts["kills"] = rounds + 1
            f.counts["tasks"] = len(ids)
            for status in S:
                n = sum(s.status is status for s in everything)
                if n:
                    f.counts[status.value] = n
            f.must_be_0["tasks left unfinished with no live node (no reconcile by hand)"] = (
                0 if settled else _unfinished(caps)
            )
            f.must_be_0["doctor's lease-expired alarms after recovery"] = sum(
                a["count"] for a in alarms if a["kind"] == "lease-expired"
            )
            f.must_be_0["pipeline steps started after an upstream that did not succeed"] = (
                _started_downstream_of_failure(store, everything, f.problems)
            )
            f.must_be_0["illegal or broken transitions"] = illegal_moves(store, ids, f.problems)
            last.finish()
        finally:
            store.close()
    return f


def _unfinished(caps: Capabilities) -> int:
    """Tasks not finished (the last node submits none: every one left is a dead node's)."""
    from chongming_task.model import TaskScan
    from chongming_task.states import NON_TERMINAL

    return caps.scan_tasks(TaskScan(statuses=NON_TERMINAL, limit=1))[0]


def _started_downstream_of_failure(
    store: TaskStore, everything: list[Any], problems: list[str]
) -> int:
    """A pipeline step that ran although the step before it did not succeed."""
    by_run: dict[str, dict[str, Any]] = {}
    for s in everything:
        if s.pipeline_run_id:
            by_run.setdefault(s.pipeline_run_id, {})[s.name] = s
    bad = 0
    caps = Capabilities(store)
    for run_id, steps in by_run.items():
        record = caps.pipeline_record(run_id)
        if record is None:
            continue
        key_of = {task_id: key for key, task_id in record.tasks.items()}
        snapshots = {key_of.get(s.task_id): s for s in steps.values()}
        for key, deps in record.depends_on.items():
            node = snapshots.get(key)
            if node is None or node.started_at is None:
                continue
            for dep in deps:
                upstream = snapshots.get(dep)
                if upstream is not None and upstream.status is not S.SUCCEEDED:
                    bad += 1
                    problems.append(f"{run_id}: {key} ran after {dep} {upstream.status}")
    return bad


def partition(dsn: str, work: Path) -> Figures:
    from chongming_task.testing.proxy import Proxy

    f = Figures("partition", "PostgreSQL")
    proxy = Proxy(("127.0.0.1", 5432))
    via = dsn.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
    if via == dsn:
        proxy.close()
        f.skipped = "the DSN does not name 127.0.0.1:5432"
        return f
    finish = work / "partition-finish"
    with place("PostgreSQL", dsn, work) as (db, schema):
        a = NodeProc(via, schema, "--owner", "node-a", "--ttl", "3", "--loops", "6",
                     "--finish-on", str(finish), "--tell")  # fmt: skip
        store = open_store(db, schema=schema)
        owner = Controller(store, owner="owner", reconcile_interval=None, poll_commands=False)
        try:
            ids = a.task_ids
            wait_for(lambda: all(store.get(t).status is S.RUNNING for t in ids), 20)  # type: ignore[union-attr]
            proxy.cut()
            marked = wait_for(lambda: len(owner.reconcile().lost) > 0 or _all_lost(store, ids), 20)
            wait_for(lambda: _all_lost(store, ids), 10)
            lost_rows = {t: store.get(t) for t in ids}
            finish.touch()  # the work finishes on the cut-off node
            time.sleep(1.0)
            proxy.heal()
            caps = Capabilities(store)
            wait_for(lambda: len(caps.late_reports(task_ids=ids)) == len(ids), 30)
            time.sleep(2.0)  # renewals and heartbeats would have landed by now
            reports = {r.task_id for r in caps.late_reports(task_ids=ids)}
            told = a.finish()
            f.counts["tasks cut off"] = len(ids)
            f.counts["lost by the owner's reconcile"] = sum(
                store.get(t).status is S.LOST  # type: ignore[union-attr]
                for t in ids
            )
            f.counts["late reports kept"] = len(reports)
            f.must_be_0["owner's reconcile never ran"] = int(not marked)
            f.must_be_0["lost tasks finished on the node with no late report"] = len(
                set(ids) - reports
            )
            f.must_be_0["leases or heartbeats landed on a lost row"] = sum(
                store.get(t) != lost_rows[t] for t in ids
            )
            f.must_be_0["callers told succeeded while the store holds lost"] = sum(
                1 for line in told if "told" in line and line["said"].startswith("succeeded")
            )
            f.must_be_0["illegal or broken transitions"] = illegal_moves(store, ids, f.problems)
        finally:
            owner.close()
            store.close()
            proxy.close()
    return f


def unheard(dsn: str, work: Path, rounds: int) -> Figures:
    """Commits nobody heard, from a node in this process (its calls are followed)."""
    import threading

    import psycopg

    from chongming_task import CancellationToken, StoreUnavailable
    from chongming_task.model import TaskQuery
    from chongming_task.node.submission import NEVER_STARTED
    from chongming_task.testing.proxy import Proxy

    f = Figures("unheard", "PostgreSQL")
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    proxy = Proxy((str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432)))
    via = psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1", port=proxy.port)
    with place("PostgreSQL", dsn, work) as (db, schema):
        store = open_store(db, schema=schema)
        node = Controller(
            open_store(via, schema=schema), owner="node-u", lease_ttl=5.0, activity_interval=0.05
        )
        ran: set[str] = set()
        told_ok: set[str] = set()
        told_failed: set[str] = set()
        stop = threading.Event()

        @node.task(name="call")
        def call(token: CancellationToken, tag: str) -> str:
            ran.add(tag)
            return tag

        def submitting(thread: int) -> None:
            for n in itertools.count():
                if stop.is_set():
                    return
                tag = f"t{thread}-{n}"
                try:
                    if thread == 0:  # batches of 5, one tag for the batch
                        node.tasks["call"].configure(tags={tag}).submit_many([(tag,)] * 5)
                    else:
                        node.tasks["call"].configure(tags={tag}).submit(tag)
                    told_ok.add(tag)
                except StoreUnavailable:
                    told_failed.add(tag)
                    time.sleep(0.05)

        threads = [threading.Thread(target=submitting, args=(i,)) for i in range(4)]
        try:
            for thread in threads:
                thread.start()
            for _ in range(rounds * 4):
                time.sleep(0.5)
                proxy.deafen()
                time.sleep(0.3)
                proxy.cut()
                proxy.heal()
            time.sleep(1.0)
            stop.set()
            for thread in threads:
                thread.join(60)
            caps = Capabilities(store)
            settled = wait_for(lambda: not _unfinished(caps), 60)
            everything = store.query(TaskQuery(brief=True))
            by_tag: dict[str, list[Any]] = {}
            for s in everything:
                for tag in s.tags:
                    by_tag.setdefault(tag, []).append(s)
            stored_anyway = [t for t in told_failed if t in by_tag]
            cancelled_so = sum(
                1
                for t in stored_anyway
                for s in by_tag[t]
                if s.status is S.CANCELLED and store.history(s.task_id)[-1].reason == NEVER_STARTED
            )
            f.counts["cuts"] = rounds * 4
            f.counts["calls told they succeeded"] = len(told_ok)
            f.counts["calls told they failed"] = len(told_failed)
            f.counts["of those, stored all the same"] = len(stored_anyway)
            f.counts["tasks ended 'submit reported as failed; never started'"] = cancelled_so
            f.must_be_0["calls told they failed whose task ran"] = len(told_failed & ran)
            f.must_be_0["tasks of failed calls not ended cancelled"] = sum(
                1 for t in stored_anyway for s in by_tag[t] if s.status is not S.CANCELLED
            )
            f.must_be_0["calls told they succeeded whose tasks did not all succeed"] = sum(
                1
                for t in told_ok
                if not by_tag.get(t) or any(s.status is not S.SUCCEEDED for s in by_tag[t])
            )
            f.must_be_0["tasks left unfinished"] = 0 if settled else _unfinished(caps)
            f.must_be_0["tasks lost"] = sum(s.status is S.LOST for s in everything)
            f.must_be_0["runs desynced (their own write taken for another's)"] = (
                node.health().desynced
            )
            f.must_be_0["illegal or broken transitions"] = illegal_moves(
                store, [s.task_id for s in everything], f.problems
            )
        finally:
            stop.set()
            node.close(timeout=10)
            node.store.close()
            store.close()
            proxy.close()
    return f


def dead_delayed(kind: str, dsn: str | None, work: Path) -> Figures:
    f = Figures("dead-delayed", kind)
    ttl = 1.5
    with place(kind, dsn, work) as (db, schema):
        store = open_store(db, schema=schema)
        try:
            node = NodeProc(db, schema, "--owner", "d-0", "--ttl", str(ttl), "--delayed", "20")
            ids = node.task_ids
            caps = Capabilities(store)
            wait_for(lambda: any(r.node == "d-0" for r in caps.nodes()), 20)  # declared
            node.kill()
            killed = time.monotonic()
            dead = wait_for(
                lambda: any(r.node == "d-0" for r in dead_nodes(caps.nodes(), caps.now())),
                4 * ttl + 10,
            )
            doctor = cli(db, schema, "--json", "doctor")
            alarms = json.loads(doctor.stdout)["alarms"] if doctor.stdout else []
            named = sum(a["count"] for a in alarms if a["kind"] == "dead-node-tasks")
            f.counts["delayed tasks of the killed node"] = len(ids)
            f.counts["seconds from the kill to doctor's answer"] = round(
                time.monotonic() - killed, 1
            )
            heir = NodeProc(db, schema, "--owner", "d-heir", "--ttl", str(ttl))
            settled = wait_for(lambda: not _unfinished(caps), 4 * ttl + 10)
            marked = [store.get(t) for t in ids]
            f.counts["marked lost by the heir"] = sum(
                s is not None and s.status is S.LOST for s in marked
            )
            f.must_be_0["the node never judged dead"] = int(not dead)
            f.must_be_0["delayed tasks of the dead node doctor did not name"] = len(ids) - named
            f.must_be_0["delayed tasks still waiting after the heir's reconcile"] = (
                0 if settled else _unfinished(caps)
            )
            f.must_be_0["lost without naming the dead node and its run time"] = sum(
                1
                for s in marked
                if s is None
                or s.failure is None
                or "node d-0 died" not in s.failure.message
                or "run time" not in s.failure.message
            )
            f.must_be_0["illegal or broken transitions"] = illegal_moves(store, ids, f.problems)
            heir.finish()
        finally:
            store.close()
    return f


def _all_lost(store: TaskStore, ids: list[str]) -> bool:
    return all(store.get(t).status is S.LOST for t in ids)  # type: ignore[union-attr]


SEQUENCES = [
    (("pause", "resume"), S.RUNNING),
    (("resume", "pause"), S.PAUSED),
    (("stop", "resume"), S.STOPPED),
    (("pause", "stop"), S.STOPPED),
    (("pause", "resume", "pause"), S.PAUSED),
]


def controls(kind: str, dsn: str | None, work: Path, rounds: int) -> Figures:
    f = Figures("controls", kind)
    with place(kind, dsn, work) as (db, schema):
        n = len(SEQUENCES) * rounds
        node = NodeProc(db, schema, "--owner", "holder", "--loops", str(n))
        store = open_store(db, schema=schema)
        try:
            ids = node.task_ids
            wait_for(lambda: all(store.get(t).status is S.RUNNING for t in ids), 30)  # type: ignore[union-attr]
            wrong = 0
            caps = Capabilities(store)
            for i, task_id in enumerate(ids):
                words, expected = SEQUENCES[i % len(SEQUENCES)]
                for word in words:  # one CLI process each, back to back
                    cli(db, schema, word, task_id)
                wait_for(lambda task_id=task_id: not caps.commands.pending(task_id), 20)
                time.sleep(0.3)  # a pause in flight reaches paused
                got = store.get(task_id)
                assert got is not None
                if got.status is not expected:
                    wrong += 1
                    f.problems.append(f"{task_id}: {' then '.join(words)} left {got.status}")
            f.counts["sequences"] = n
            f.must_be_0["tasks left against the operator's last word"] = wrong
            f.must_be_0["illegal or broken transitions"] = illegal_moves(store, ids, f.problems)
            node.finish()
        finally:
            store.close()
    return f


# -- the campaign -----------------------------------------------------------------------------


def report(f: Figures) -> str:
    head = f"{f.scenario} ({f.store})"
    if f.skipped:
        return f"{head}: skipped, {f.skipped}"
    lines = [f"{head}, {f.seconds:.0f} s"]
    lines += [f"  {k}: {v}" for k, v in f.counts.items()]
    lines += [f"  {k}: {v}  (must be 0)" for k, v in f.must_be_0.items()]
    lines += [f"  ! {p}" for p in f.problems[:10]]
    lines += [f"  | {line[:160]}" for line in f.said[:10]]
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_node":
        return node_main(sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", default=os.environ.get("CHONGMING_TEST_POSTGRES"))
    p.add_argument("--only", nargs="*", default=None, help="scenarios to run (default: all)")
    p.add_argument("--rounds", type=int, default=3, help="kills and control rounds (3)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    everything = ["skew", "full-disk", "kill", "partition", "controls", "unheard", "dead-delayed"]
    wanted = set(a.only or everything)
    results: list[Figures] = []
    with tempfile.TemporaryDirectory(prefix="chongming-faults-") as tmp:
        work = Path(tmp)
        stores = ["SQLite", *(["PostgreSQL"] if a.dsn else [])]
        plan: list[tuple[str, str, Callable[[], Figures]]] = []
        if "skew" in wanted and a.dsn:
            plan.append(("skew", "PostgreSQL", lambda: skew(a.dsn, work)))
        if "full-disk" in wanted:
            plan.append(("full-disk", "SQLite", lambda: full_disk(work)))
        for kind in stores:
            if "kill" in wanted:
                plan.append(("kill", kind, lambda kind=kind: kill(kind, a.dsn, work, a.rounds)))
        if "partition" in wanted and a.dsn:
            plan.append(("partition", "PostgreSQL", lambda: partition(a.dsn, work)))
        for kind in stores:
            if "controls" in wanted:
                plan.append(
                    ("controls", kind, lambda kind=kind: controls(kind, a.dsn, work, a.rounds))
                )
        if "unheard" in wanted and a.dsn:
            plan.append(("unheard", "PostgreSQL", lambda: unheard(a.dsn, work, a.rounds)))
        for kind in stores:
            if "dead-delayed" in wanted:
                plan.append(
                    ("dead-delayed", kind, lambda kind=kind: dead_delayed(kind, a.dsn, work))
                )
        for _, _, run in plan:
            started = time.monotonic()
            figures = run()
            figures.seconds = time.monotonic() - started
            results.append(figures)
            print(report(figures), flush=True)
        if not a.dsn:
            print("(PostgreSQL scenarios skipped: give --dsn or CHONGMING_TEST_POSTGRES)")
    if a.json:
        print(json.dumps([f.__dict__ for f in results], indent=2, default=str))
    return 1 if any(f.violations for f in results) else 0


if __name__ == "__main__":
    sys.exit(main())
