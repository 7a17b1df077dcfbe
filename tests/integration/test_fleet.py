"""Fleet visibility end to end, on SQLite and on PostgreSQL: node processes declare their
buckets, and `nodes` / `doctor` / `ps` (real CLI subprocesses) show what no single node
can see: duplicate and uncovered buckets, a node killed with SIGKILL, its orphans."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tests.integration.postgres_support import drop_schemas, made_schema, pg_dsn
from tests.integration.test_cross_process import Node

__all__ = ["pg_dsn"]  # the fixture, found by pytest here


@dataclass
class Where:
    db: str
    node_args: list[str]
    cli_args: list[str]

    def node(self, *args: str) -> Node:
        return Node(self.db, *self.node_args, *args)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "chongming_task", "--db", self.db, *self.cli_args, *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    def json(self, *args: str, code: int = 0) -> Any:
        result = self.cli("--json", *args)
        assert result.returncode == code, (
            f"{args}: exit {result.returncode}: {result.stderr}{result.stdout[-1500:]}"
        )
        return json.loads(result.stdout)


@pytest.fixture(params=["sqlite", "postgres"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Where]:
    if request.param == "sqlite":
        yield Where(str(tmp_path / "fleet.db"), [], [])
        return
    dsn: str = request.getfixturevalue("pg_dsn")
    schema = made_schema(dsn)
    yield Where(dsn, ["--schema", schema], ["--pg-schema", schema])
    drop_schemas(dsn, [schema])


@pytest.fixture
def started() -> Iterator[list[Node]]:
    nodes: list[Node] = []
    yield nodes
    for node in nodes:
        node.finish()


def alarms(report: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [a for a in report["alarms"] if a["kind"] == kind]


def test_doctor_names_the_duplicate_and_the_gap_of_three_nodes(
    where: Where, started: list[Node]
) -> None:
    for owner, owned in (("node-a", "0-29"), ("node-b", "20-39"), ("node-c", "45-63")):
        started.append(where.node("--owner", owner, "--owned", owned, "--lease-ttl", "5"))
    nodes = where.json("nodes")
    assert [(n["node"], n["buckets"], n["state"]) for n in nodes] == [
        ("node-a", "0-29", "live"),
        ("node-b", "20-39", "live"),
        ("node-c", "45-63", "live"),
    ]
    result = where.cli("doctor")
    assert result.returncode == 3, result.stderr
    assert "ALARM duplicate-bucket: buckets 20-29 declared by node-a and node-b" in result.stdout
    assert "ALARM uncovered-bucket: no live node declares bucket(s) 40-44" in result.stdout
    report = where.json("doctor", code=3)
    assert report["healthy"] is False
    (twice,) = alarms(report, "duplicate-bucket")
    assert twice["buckets"] == list(range(20, 30)) and twice["nodes"] == ["node-a", "node-b"]
    (gap,) = alarms(report, "uncovered-bucket")
    assert gap["buckets"] == [40, 41, 42, 43, 44]

    # A clean stop retires the declarations: a fleet stopped on purpose is healthy.
    for node in started:
        node.finish()
    assert {n["state"] for n in where.json("nodes")} == {"stopped"}
    assert where.json("doctor")["healthy"] is True


def test_doctor_judges_by_the_bucket_count_the_live_nodes_declared(
    where: Where, started: list[Node]
) -> None:
    for owner, owned in (("node-a", "0-7"), ("node-b", "8-15")):
        started.append(where.node("--owner", owner, "--owned", owned, "--num-buckets", "16"))
    result = where.cli("doctor")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "16 buckets (as the nodes declared)" in result.stdout
    report = where.json("doctor")
    assert report["healthy"] and report["num_buckets"] == 16
    # A count given on the command line is the one judged by.
    told = where.json("--num-buckets", "64", "doctor", code=3)
    (mismatch,) = alarms(told, "num-buckets-mismatch")
    assert "expected 64" in mismatch["message"]
    # A node that disagrees with the others is named, against no count of the CLI's.
    started.append(where.node("--owner", "node-c", "--owned", "16-31", "--num-buckets", "32"))
    report = where.json("doctor", code=3)
    (mismatch,) = alarms(report, "num-buckets-mismatch")
    assert mismatch["nodes"] == ["node-c"] and "node-c=32" in mismatch["message"]
    assert "expected" not in mismatch["message"]


def test_a_dead_nodes_delayed_task_is_named_at_once_and_marked_lost_by_the_heir(
    where: Where, started: list[Node]
) -> None:
    node = where.node(
        "--owner", "node-a", "--owned", "0-63", "--lease-ttl", "1.5",
        "--delay", "120", "--submit", "loop",
    )  # fmt: skip
    started.append(node)
    (task_id,) = node.task_ids
    wait_until(  # declared: its beacon writes the declaration beside its first work
        lambda: [n["state"] for n in where.json("nodes")] == ["live"],
        what="node-a declared",
    )
    node.kill()
    wait_until(
        lambda: [n["state"] for n in where.json("nodes")] == ["dead"],
        timeout=20,
        what="node-a dead by its declaration",
    )
    # At once, long before its lease (its run time and a TTL past it) expires.
    report = where.json("doctor", code=3)
    (alarm,) = alarms(report, "dead-node-tasks")
    assert alarm["nodes"] == ["node-a"] and alarm["task_ids"] == [task_id]
    assert alarm["count"] == 1 and "delayed ones included" in alarm["message"]
    assert not alarms(report, "lease-expired")
    (waiting,) = where.json("ps")
    assert waiting["status"] == "queued"

    # The heir owns its buckets: its reconcile marks the task lost, naming the dead
    # node and the time the task waited for.
    started.append(where.node("--owner", "node-b", "--owned", "0-63", "--lease-ttl", "1.5"))
    wait_until(
        lambda: where.json("show", task_id)["status"] == "lost",
        timeout=30,
        what="the heir's reconcile",
    )
    shown = where.json("show", task_id)
    failure = shown["failure"]
    # It never started: nothing of it runs anywhere now (had the node only been cut
    # off, it may still start it, which the message says).
    assert failure["kind"] == "lost" and failure["carrier_may_run"] is False
    assert "node node-a died" in failure["message"]
    assert "before the task's run time" in failure["message"]
    assert "its carrier may still be running" not in where.cli("show", task_id).stdout
    assert shown["run_at"][:16].replace("T", " ") in failure["message"]
    (marked,) = [t for t in where.json("history", task_id) if t["to"] == "lost"]
    assert marked["actor"] == "node-b" and marked["reason"] == "reconcile: node node-a dead"
    assert where.json("doctor")["healthy"]  # the heir covers the buckets; nothing left


def test_a_killed_node_shows_lease_expired_then_orphans_while_a_silent_task_is_fine(
    where: Where, started: list[Node]
) -> None:
    ttl = 1.5
    node = where.node(
        "--owner",
        "node-a",
        "--owned",
        "0-63",
        "--lease-ttl",
        str(ttl),
        "--submit",
        "silent:60",
        "--submit",
        "silent:60",
    )
    started.append(node)
    task_ids = set(node.task_ids)

    def health() -> dict[str, bool]:
        return {t["task_id"]: t["lease_expired"] for t in where.json("ps")}

    wait_until(lambda: {t["status"] for t in where.json("ps")} == {"running"}, what="both running")
    # Long past every threshold, the live node's silent tasks (no checkpoint at all)
    # raise no alarm: their node renews the leases and declares the buckets.
    deadline = time.monotonic() + 3 * ttl
    while time.monotonic() < deadline:
        report = where.json("doctor", "--orphan-after", "0.5", "--stale-after", "0.5")
        assert report["healthy"], report["alarms"]
        assert health() == dict.fromkeys(task_ids, False)

    node.kill()
    killed = time.monotonic()
    wait_until(lambda: all(health().values()), timeout=ttl + 5, what="leases expired in ps")
    assert time.monotonic() - killed < ttl + 5
    table = where.cli("ps").stdout
    assert table.count("LEASE EXPIRED") == 2 and "heartbeat" in table
    (dead,) = where.json("nodes")
    assert dead["state"] == "dead" and dead["active_tasks"] == 2

    time.sleep(1.0)  # past the orphan threshold below
    result = where.cli("doctor", "--orphan-after", "1")
    assert result.returncode == 3, result.stderr
    report = where.json("doctor", "--orphan-after", "1", code=3)
    (orphans,) = alarms(report, "orphan")
    assert set(orphans["task_ids"]) == task_ids and orphans["count"] == 2
    (expired,) = alarms(report, "lease-expired")
    assert set(expired["task_ids"]) == task_ids
    (gap,) = alarms(report, "uncovered-bucket")
    assert gap["buckets"] == list(range(64))
    assert "ALARM orphan: 2 task(s)" in result.stdout


def _declared_pid(where: Where, name: str) -> int | None:
    found = [n for n in where.json("nodes") if n["node"] == name and n["state"] == "live"]
    return found[0]["pid"] if found else None


def _stop(node: Node) -> str:
    """Stop ``node`` cleanly; what it logged."""
    assert node.proc.stdin is not None and node.proc.stderr is not None
    node.proc.stdin.close()
    node.proc.wait(30)
    return node.proc.stderr.read()


TWIN_WARNING = "this name is declared by another live process too"


def test_a_node_warns_when_a_live_process_already_declared_its_name(
    where: Where, started: list[Node]
) -> None:
    # Two replicas deployed with one configured name show as one node: the second to
    # start says so. A crashed predecessor of this host (its pid gone) is no twin.
    same = ("--owner", "worker", "--owned", "0-63", "--lease-ttl", "30")
    crashed = where.node(*same)
    wait_until(lambda: _declared_pid(where, "worker") == crashed.proc.pid, timeout=20)
    crashed.kill()
    first = where.node(*same)
    started.append(first)
    wait_until(lambda: _declared_pid(where, "worker") == first.proc.pid, timeout=20)
    second = where.node(*same)
    started.append(second)
    wait_until(lambda: _declared_pid(where, "worker") == second.proc.pid, timeout=20)
    said = _stop(second)
    assert TWIN_WARNING in said and f"pid {first.proc.pid}," in said, said
    assert TWIN_WARNING not in _stop(first)  # its predecessor had crashed: no twin


def test_replicas_are_seen_from_their_start_and_two_running_every_bucket_raise_an_alarm(
    where: Where, started: list[Node]
) -> None:
    # Two unpartitioned replicas of one service, neither given a task yet.
    first = where.node("--owner", "svc-a")
    started.append(first)
    other = where.node("--owner", "svc-b")
    started.append(other)
    wait_until(lambda: _declared_pid(where, "svc-a") == first.proc.pid, timeout=30)
    wait_until(lambda: _declared_pid(where, "svc-b") == other.proc.pid, timeout=30)
    report = where.json("doctor", code=3)
    [shared] = alarms(report, "every-bucket-shared")
    assert shared["nodes"] == ["svc-a", "svc-b"]
    assert (
        "give each node its own owned_buckets (say svc-a: 0-31; svc-b: 32-63)"
        in (shared["message"])
    )
    # A replica restarted under its name after a crash replaces its predecessor at once.
    first.kill()
    again = where.node("--owner", "svc-a")
    started.append(again)
    wait_until(lambda: _declared_pid(where, "svc-a") == again.proc.pid, timeout=30)
    _stop(other)
    wait_until(lambda: _declared_pid(where, "svc-b") is None, timeout=30)
    assert alarms(where.json("doctor"), "every-bucket-shared") == []
