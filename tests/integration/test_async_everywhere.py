"""Outside its node, an ``async def`` task is a task like any other: ``ps``, ``show``,
``watch``, the dashboard, leases, ``doctor`` and ``reconcile`` see and judge it as they
do a thread task. The node is a real subprocess; every other party is another process
(the CLI, the dashboard) or this one reading the shared file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chongming_task import SqliteTaskStore, TaskStatus
from tests.conftest import Lines, wait_until
from tests.integration.test_cli import cli
from tests.integration.test_cross_process import Node

S = TaskStatus
WATCH = ["--interval", "0.1"]


def _cli(db: Path, *args: str, ok: tuple[int, ...] = (0,)) -> str:
    done = cli(db, *args, check=False)
    assert done.returncode in ok, done.stderr
    return done.stdout


def _json(db: Path, *args: str, ok: tuple[int, ...] = (0,)) -> Any:
    return json.loads(_cli(db, "--json", *args, ok=ok))


def test_an_async_task_is_listed_watched_leased_and_judged_like_any_other(
    tmp_path: Path,
) -> None:
    db = tmp_path / "async.db"
    node = Node(
        db, "--owner", "node-a", "--lease-ttl", "2", "--submit", "aloop", "--submit", "loop"
    )
    store = SqliteTaskStore(db)
    try:
        aloop, loop = node.task_ids
        wait_until(lambda: all(store.get(t).status is S.RUNNING for t in (aloop, loop)))  # type: ignore[union-attr]

        # ps finds it by its tag, and lists it with the thread task.
        tagged = _json(db, "ps", "--tag", "async")
        assert [row["task_id"] for row in tagged] == [aloop]
        assert "async" in tagged[0]["tags"] and tagged[0]["status"] == "running"
        assert {row["task_id"] for row in _json(db, "ps")} == {aloop, loop}
        shown = _cli(db, "show", aloop)
        assert aloop in shown and "async" in shown and "running" in shown

        # Its lease is renewed while it runs, as a thread task's is.
        first = store.get(aloop).lease_until  # type: ignore[union-attr]
        assert first is not None
        wait_until(
            lambda: store.get(aloop).lease_until > first,  # type: ignore[operator,union-attr]
            what="the async task's lease renewed",
        )

        # watch, in a process of its own, sees a pause and a resume from a third.
        watch = subprocess.Popen(
            [sys.executable, "-m", "chongming_task", "--db", str(db), "--json", "watch", *WATCH],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert watch.stdout is not None
            first = json.loads(watch.stdout.readline())  # its first refresh is read
            assert first["event"] == "progress", first
            printed = Lines(watch.stdout)
            assert "now paused" in _cli(db, "pause", aloop, "--wait", "10")
            assert "now running" in _cli(db, "resume", aloop, "--wait", "10")
            printed.wait_for(
                lambda out: '"from": "paused", "to": "running"' in out,
                what="the resume on the screen",
            )
        finally:
            watch.terminate()
            _, err = watch.communicate(timeout=20)
        out = json.dumps(first) + "\n" + printed.close()
        events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        seen = [e["to"] for e in events if e.get("event") == "transition" and e["task_id"] == aloop]
        assert seen[-3:] == ["pausing", "paused", "running"], (seen, err)
        assert all(e["name"] == "aloop" for e in events if e.get("task_id") == aloop)

        # The dashboard's task page shows it, tag and all.
        pytest.importorskip("starlette", reason="the [web] extra is not installed")
        from tests.integration.test_web import Web

        web = Web(db)
        try:
            status, page = web.get(f"/tasks/{aloop}")
            assert status == 200 and aloop in page and "async" in page and "aloop" in page
        finally:
            web.close()

        # kill -9: once the lease runs out, doctor names it and reconcile marks it lost.
        node.kill()
        lease = store.get(aloop).lease_until  # type: ignore[union-attr]
        assert lease is not None
        wait_until(
            lambda: any(
                aloop in alarm["task_ids"]
                for alarm in _json(db, "doctor", ok=(0, 3))["alarms"]  # 3: alarms raised
                if alarm["kind"] == "lease-expired"
            ),
            timeout=20,
            what="doctor naming the dead node's async task",
        )
        _cli(db, "reconcile")
        lost = store.get(aloop)
        assert lost is not None and lost.status is S.LOST
        assert lost.failure is not None and "result unknown" in lost.failure.message
        assert store.get(loop).status is S.LOST  # type: ignore[union-attr]
    finally:
        store.close()
        node.finish()


def test_a_dead_nodes_delayed_task_is_judged_by_its_lease(tmp_path: Path) -> None:
    """A delayed task waits in the node that submitted it; kill -9 that node and the task
    is judged like any other unfinished task of a dead node: once its lease (its time
    and a TTL) has run out, doctor names it and reconcile marks it lost."""
    db = tmp_path / "delayed.db"
    node = Node(db, "--owner", "node-d", "--lease-ttl", "1", "--delay", "3", "--submit", "loop")
    store = SqliteTaskStore(db)
    try:
        (task_id,) = node.task_ids
        waiting = store.get(task_id)
        assert waiting is not None and waiting.status is S.QUEUED and waiting.run_at is not None
        assert waiting.lease_until is not None and waiting.lease_until > waiting.run_at
        node.kill()
        assert "queued (runs at " in _cli(db, "ps")
        wait_until(
            lambda: any(
                task_id in alarm["task_ids"]
                for alarm in _json(db, "doctor", ok=(0, 3))["alarms"]
                if alarm["kind"] == "lease-expired"
            ),
            timeout=20,
            what="doctor naming the dead node's delayed task",
        )
        _cli(db, "reconcile")
        lost = store.get(task_id)
        assert lost is not None and lost.status is S.LOST and lost.started_at is None
    finally:
        store.close()
        node.finish()
