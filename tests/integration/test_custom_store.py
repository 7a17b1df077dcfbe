"""A third-party store built on the contract alone: ``JsonFileTaskStore``.

It runs the full ``StoreContract``, plugs into a ``Controller``, carries control between
two store instances on one file, and has its cross-process limit pinned in a test rather
than in a comment. The last test keeps ``docs/stores.md`` and the protocol in step.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from chongming_task import CancellationToken, Controller, TaskStatus, TaskStore
from chongming_task.stores.roles import ROLES, roles_of
from chongming_task.testing import StoreContract
from tests.conftest import wait_until
from tests.integration.json_file_store import JsonFileTaskStore
from tests.integration.json_roles_store import JsonRolesStore

ROOT = Path(__file__).resolve().parents[2]


class TestJsonFileStore(StoreContract):
    made: type[JsonFileTaskStore] = JsonFileTaskStore

    @pytest.fixture(autouse=True)
    def _dir(self, tmp_path: Path) -> None:
        self._tmp = tmp_path
        self._n = 0

    def make_store(self) -> TaskStore:
        self._n += 1
        return self.made(self._tmp / f"store-{self._n}.json")


class TestJsonRolesStore(TestJsonFileStore):
    """The same store with the four roles, written from the guide: every section of the
    contract runs (none is skipped for a role it lacks)."""

    made = JsonRolesStore


def test_the_json_roles_store_declares_every_role(tmp_path: Path) -> None:
    store = JsonRolesStore(tmp_path / "s.json")
    assert roles_of(store) == [role.__name__ for role in ROLES]
    assert roles_of(JsonFileTaskStore(tmp_path / "core.json")) == []


def test_the_json_store_is_a_task_store_without_inheriting(tmp_path: Path) -> None:
    store = JsonFileTaskStore(tmp_path / "s.json")
    assert isinstance(store, TaskStore)
    assert JsonFileTaskStore.__mro__ == (JsonFileTaskStore, object)


def test_the_json_store_plugs_into_a_controller(tmp_path: Path) -> None:
    with Controller(JsonFileTaskStore(tmp_path / "s.json"), activity_interval=0.02) as c:

        @c.task(name="double", retries=1)
        def double(token: CancellationToken, x: int) -> int:
            token.checkpoint()
            return 2 * x

        run = c.submit(double, 21)
        assert run.result(5) == 42
        assert c.get(run.task_id).status is TaskStatus.SUCCEEDED
        assert [t.to_status.value for t in c.history(run.task_id)] == [
            "queued",
            "starting",
            "running",
            "succeeded",
        ]


def test_control_crosses_between_two_instances_on_one_file(tmp_path: Path) -> None:
    """No caching: a command written through one instance reaches the holder's instance."""
    path = tmp_path / "shared.json"
    worker = Controller(
        JsonFileTaskStore(path), owner="worker", command_poll_interval=0.02, activity_interval=0.02
    )
    console = Controller(JsonFileTaskStore(path), owner="console")
    try:
        started = threading.Event()

        @worker.task(name="loop")
        def loop(token: CancellationToken) -> None:
            started.set()
            while True:
                token.checkpoint()
                token.sleep(0.005)

        run = worker.submit(loop)
        assert started.wait(5)
        receipt = console.stop(run.task_id)
        assert receipt.accepted and receipt.outcome == "accepted"
        assert run.wait(5).status is TaskStatus.STOPPED
        wait_until(lambda: console.get(run.task_id).status is TaskStatus.STOPPED)
    finally:
        worker.close()
        console.close()


_WRITER = """
import sys
from datetime import UTC, datetime
from chongming_task import TaskSnapshot, TaskStatus
from tests.integration.json_file_store import JsonFileTaskStore

store = JsonFileTaskStore(sys.argv[1])
for i in range(int(sys.argv[3])):
    store.create(TaskSnapshot(task_id=f"{sys.argv[2]}-{i}", name="n",
        status=TaskStatus.QUEUED, status_version=1, created_at=datetime.now(UTC)))
"""


def test_the_naive_file_store_is_not_cross_process_safe(tmp_path: Path) -> None:
    """Four processes create 150 tasks each in one JSON file. Without a lock between
    processes, read-modify-write loses updates (or a reader trips over a replaced file).
    This pins the documented limit: the example is an interface sketch, not a shared store."""
    path = tmp_path / "shared.json"
    JsonFileTaskStore(path)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(path), f"p{n}", "150"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for n in range(4)
    ]
    crashed = sum(p.wait(120) != 0 for p in procs)
    for p in procs:
        assert p.stderr is not None
        p.stderr.close()
    stored = len(JsonFileTaskStore(path).query())
    assert crashed > 0 or stored < 600, "expected lost updates without a cross-process lock"


def test_the_store_guide_lists_exactly_the_protocol_methods() -> None:
    guide = (ROOT / "docs" / "stores.md").read_text("utf-8")
    section = guide.split("## 1. The methods", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\|[^|]*\|\s*`(\w+)\(", section, flags=re.MULTILINE))
    protocol = {
        name
        for name, value in vars(TaskStore).items()
        if callable(value) and not name.startswith("_")
    }
    assert len(protocol) == 14
    assert documented == protocol, (
        f"in the protocol, not the guide: {sorted(protocol - documented)}; "
        f"in the guide, not the protocol: {sorted(documented - protocol)}"
    )


def _members(role: type) -> set[str]:
    return {
        name
        for name in [*vars(role), *getattr(role, "__annotations__", {})]
        if not name.startswith("_")
    }


@pytest.mark.parametrize("role", ROLES, ids=[role.__name__ for role in ROLES])
def test_the_store_guide_lists_exactly_each_roles_members(role: type) -> None:
    guide = (ROOT / "docs" / "stores.md").read_text("utf-8")
    section = guide.split(f"`{role.__name__}`\n", 1)[1].split("\n### ", 1)[0]
    documented = set(re.findall(r"^\|\s*`(\w+)[(:]", section, flags=re.MULTILINE))
    members = _members(role)
    assert documented == members, (
        f"in {role.__name__}, not the guide: {sorted(members - documented)}; "
        f"in the guide, not {role.__name__}: {sorted(documented - members)}"
    )
