"""What a newcomer meets first (issue 13): a failed task keeps its traceback (bounded,
the raise kept) and `show` prints it; a script's functions are named without
``__main__.``; `ps --name` takes a glob."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from chongming_task import CancellationToken, Controller, SqliteTaskStore, TaskStatus
from chongming_task.values import MAX_TRACEBACK


def lookup(token: CancellationToken, key: str) -> str:
    table = {"present": "yes"}
    return table[key]


def chained(token: CancellationToken, size: int) -> None:
    try:
        raise KeyError("k" * size)  # a cause far longer than a stored traceback
    except KeyError as cause:
        raise ValueError("at the bottom") from cause


def test_the_traceback_is_stored_and_shown(tmp_path: Path) -> None:
    db = tmp_path / "tb.db"
    store = SqliteTaskStore(db)
    with Controller(store, owner="node-a") as node:
        job = node.task(lookup, name="lookup")
        run = node.submit(job, "missing")
        final = run.wait(10)
    assert final.status is TaskStatus.FAILED and final.failure is not None
    assert final.failure.message == "KeyError: 'missing'"
    stored = store.get(run.task_id)
    store.close()
    assert stored is not None and stored.failure is not None
    tb = stored.failure.traceback or ""
    assert tb.startswith("Traceback (most recent call last):")
    assert "in lookup" in tb and "return table[key]" in tb
    assert tb.rstrip().endswith("KeyError: 'missing'")

    shown = subprocess.run(
        [sys.executable, "-m", "chongming_task", "--db", str(db), "show", run.task_id],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert "Traceback (most recent call last):" in shown.stdout
    assert "return table[key]" in shown.stdout
    as_json = subprocess.run(
        [sys.executable, "-m", "chongming_task", "--db", str(db), "--json", "show", run.task_id],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert json.loads(as_json.stdout)["failure"]["traceback"] == tb


def test_a_huge_traceback_keeps_its_end(tmp_path: Path) -> None:
    store = SqliteTaskStore(tmp_path / "deep.db")
    with Controller(store, owner="node-a") as node:
        job = node.task(chained, name="chained")
        run = node.submit(job, 3 * MAX_TRACEBACK)
        final = run.wait(10)
    store.close()
    assert final.failure is not None
    tb = final.failure.traceback or ""
    assert len(tb) <= MAX_TRACEBACK + 64
    assert tb.startswith("[... ") and "earlier characters]" in tb.splitlines()[0]
    assert tb.rstrip().endswith("ValueError: at the bottom")


def test_a_scripts_own_function_is_named_without_main() -> None:
    from chongming_task.definitions import define

    def ingest(token: CancellationToken) -> None:
        return None

    ingest.__module__ = "__main__"
    ingest.__qualname__ = "ingest"
    assert define(ingest).name == "ingest"
    assert define(lookup).name == "tests.unit.test_first_hour.lookup"


def test_ps_name_takes_a_glob(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    from chongming_task import TaskSnapshot

    db = tmp_path / "glob.db"
    store = SqliteTaskStore(db)
    t0 = datetime(2026, 3, 1, tzinfo=UTC)
    for i, name in enumerate(["etl.extract", "etl.load", "report", "etl"]):
        store.create(
            TaskSnapshot(
                task_id=f"t{i}",
                name=name,
                status=TaskStatus.QUEUED,
                status_version=1,
                created_at=t0,
            )
        )
    store.close()

    def names(*flags: str) -> list[str]:
        out = subprocess.run(
            [sys.executable, "-m", "chongming_task", "--db", str(db), "--json", "ps", *flags],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        return sorted(t["name"] for t in json.loads(out.stdout))

    assert names("--name", "etl.*") == ["etl.extract", "etl.load"]
    assert names("--name", "*t") == ["etl.extract", "report"]
    assert names("--name", "etl") == ["etl"]  # no wildcard: the exact name
    assert len(names("--name", "etl*", "--limit", "2")) == 2
