"""The PostgreSQL store through a real PgBouncer in transaction pooling mode: the whole
store contract (capabilities included, wake-ups through a direct ``listen_dsn``), a
cross-process stop through it, and, without ``listen_dsn``, polling with one warning."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator

import pytest

from chongming_task import Controller, TaskStatus
from chongming_task.stores.protocol import TaskStore
from chongming_task.testing.store_contract import StoreContract
from tests.conftest import wait_until
from tests.integration.pgbouncer_support import pgbouncer
from tests.integration.postgres_support import drop_schemas, made_schema, require_dsn
from tests.integration.test_cross_process import Node

pytest.importorskip("psycopg", reason="the [postgres] extra is not installed")

from chongming_task.stores.postgres import PostgresTaskStore


@pytest.fixture(scope="module")
def bouncer() -> Iterator[str]:
    with pgbouncer(require_dsn()) as through:
        yield through


class TestPostgresThroughPgBouncer(StoreContract):
    @pytest.fixture(autouse=True)
    def _server(self, bouncer: str) -> Iterator[None]:
        self._direct = require_dsn()
        self._through = bouncer
        self._made: list[str] = []
        yield
        drop_schemas(self._direct, self._made)

    def make_store(self) -> TaskStore:
        self._made.append(made_schema(self._direct))
        return PostgresTaskStore(
            self._through, schema=self._made[-1], pooled=True, listen_dsn=self._direct
        )


def test_a_stop_crosses_processes_through_pgbouncer(bouncer: str) -> None:
    direct = require_dsn()
    schema = made_schema(direct)
    node = Node(
        bouncer,
        *("--schema", schema, "--pooled", "--listen-dsn", direct, "--poll", "default"),
        *("--submit", "loop"),
    )
    store = PostgresTaskStore(bouncer, schema=schema, pooled=True, listen_dsn=direct)
    cli = [sys.executable, "-m", "chongming_task", "--db", bouncer, "--pg-schema", schema]
    try:
        (task_id,) = node.task_ids
        wait_until(lambda: store.get(task_id).status is TaskStatus.RUNNING)
        # The CLI through the pooler too: its stop is a command the node hears of at once.
        stopped = subprocess.run(
            [*cli, "--pg-pooled", "stop", task_id, "--wait", "20"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert stopped.returncode == 0, stopped.stderr
        assert "now stopped" in stopped.stdout
        assert store.get(task_id).status is TaskStatus.STOPPED
    finally:
        store.close()
        node.finish()
        drop_schemas(direct, [schema])


def test_without_a_listen_dsn_nodes_poll_and_say_why(
    bouncer: str, caplog: pytest.LogCaptureFixture
) -> None:
    direct = require_dsn()
    schema = made_schema(direct)
    with caplog.at_level(logging.WARNING, "chongming_task.store"):
        store = PostgresTaskStore(bouncer, schema=schema, pooled=True)
        # Opening the store (as every CLI command does) says nothing: only a node,
        # which subscribes to commands, is told what polling costs.
        assert "without listen_dsn" not in caplog.text
    try:
        with caplog.at_level(logging.WARNING, "chongming_task.store"):
            assert store.subscribe_commands(lambda: None) is None
        assert "without listen_dsn" in caplog.text and "poll" in caplog.text
        with Controller(store, owner="alone", owned_buckets=[0]) as node:
            assert node.command_poll_interval == 0.5
    finally:
        store.close()
        drop_schemas(direct, [schema])
