"""`schedules` from another process: each node's schedules with trigger, next firing,
last run and whether they can fire (a schedule fires only while its node runs)."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

from chongming_task import (
    CancellationToken,
    Controller,
    CronTrigger,
    IntervalTrigger,
    SqliteTaskStore,
)
from chongming_task.model import NodeRecord, ScheduleRecord
from tests.conftest import wait_until
from tests.integration.test_cli import cli


def _cli(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return cli(db, *args, check=False)


def tick(token: CancellationToken) -> str:
    return "ok"


def test_schedules_shows_trigger_next_and_last_run_while_the_node_runs(tmp_path: Path) -> None:
    db = tmp_path / "sched.db"
    with Controller(SqliteTaskStore(db), owner="node-s") as node:
        node.task(tick, name="tick")
        every = node.schedule("every-second", "tick", IntervalTrigger(1))
        node.schedule("nightly", "tick", CronTrigger("0 2 * * *"))
        wait_until(lambda: every.fired >= 1 and every.last_run is not None, what="a firing")
        assert every.last_run is not None
        wait_until(lambda: every.last_run is not None and every.last_run.done(), what="done")
        shown = _cli(db, "--json", "schedules")
        assert shown.returncode == 0, shown.stderr
        rows = {r["name"]: r for r in json.loads(shown.stdout)}
        table = _cli(db, "schedules").stdout
    assert set(rows) == {"every-second", "nightly"}
    first = rows["every-second"]
    assert first["nodes"] == ["node-s"] and first["task"] == "tick"
    assert first["last_fired_by"] == "node-s" and first["node_states"] == {"node-s": "live"}
    assert first["trigger"] == "every 1s" and first["state"] == "ok"
    assert first["fired"] >= 1 and first["last_task_id"] is not None
    assert first["last_status"] in {"succeeded", "queued", "starting", "running"}
    assert rows["nightly"]["trigger"] == "cron '0 2 * * *' (UTC)"
    assert rows["nightly"]["last_fired_at"] is None and rows["nightly"]["fired"] == 0
    next_fire = datetime.fromisoformat(rows["nightly"]["next_fire_at"])
    assert next_fire.hour == 2 and next_fire.minute == 0 and next_fire > datetime.now(UTC)
    lines = table.splitlines()
    assert lines[0].split()[:4] == ["SCHEDULE", "NODES", "TASK", "TRIGGER"]
    assert any(line.startswith("nightly") and " never " in line for line in lines)
    assert any(line.startswith("every-second") and " ago " in line for line in lines)
    # A clean close: the node's schedules fire no more, and their records go with it.
    after = _cli(db, "schedules")
    assert after.returncode == 0 and after.stdout.startswith("no schedules"), after.stdout


def test_a_dead_nodes_schedules_say_they_will_not_fire(tmp_path: Path) -> None:
    db = tmp_path / "dead.db"
    store = SqliteTaskStore(db)
    long_ago = datetime.now(UTC) - timedelta(hours=1)
    store.declare_node(
        NodeRecord(
            node="node-gone",
            buckets=None,
            num_buckets=64,
            ttl_seconds=30.0,
            started_at=long_ago,
            seen_at=long_ago,
            host="h",
            pid=1,
        )
    )
    store.declare_schedule(
        ScheduleRecord(
            node="node-gone",
            name="report",
            task="report",
            trigger="every 60s",
            updated_at=long_ago,
            next_fire_at=long_ago + timedelta(seconds=60),
            last_fired_at=long_ago,
            last_task_id="gone-task",
            fired=3,
        )
    )
    store.close()
    rows = json.loads(_cli(db, "--json", "schedules").stdout)
    assert [r["state"] for r in rows] == ["node DEAD: will not fire"]
    assert rows[0]["last_status"] is None  # its last task was pruned
    line = _cli(db, "schedules").stdout.splitlines()[1]
    assert "due 59m" in line and "pruned" in line and "node DEAD: will not fire" in line


def test_one_row_a_schedule_whatever_number_of_nodes_define_it(tmp_path: Path) -> None:
    db = tmp_path / "fleet.db"
    with (
        Controller(SqliteTaskStore(db), owner="node-a") as a,
        Controller(SqliteTaskStore(db), owner="node-b") as b,
    ):
        entries = []
        for node in (a, b):
            node.task(tick, name="tick")
            entries.append(node.schedule("every-second", "tick", IntervalTrigger(1)))
        wait_until(lambda: sum(e.fired for e in entries) >= 3, what="three slots fired")
        shown = _cli(db, "--json", "schedules")
        assert shown.returncode == 0, shown.stderr
        table = _cli(db, "schedules").stdout
    [row] = json.loads(shown.stdout)
    assert row["nodes"] == ["node-a", "node-b"] and row["state"] == "ok"
    assert row["last_fired_by"] in {"node-a", "node-b"}
    assert row["fired"] >= 3
    [line] = [x for x in table.splitlines() if x.startswith("every-second")]
    assert "node-a, node-b" in line and f" by {row['last_fired_by']}" in line
