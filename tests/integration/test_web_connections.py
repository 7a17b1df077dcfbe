"""The dashboard's cost to a PostgreSQL server: however many pages are asked for at once,
it holds the 2 connections the README budgets for it (one pooled, the follower's and the
pages' in turn, and one ``LISTEN``), and the server names them by its process."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from chongming_task import Controller
from chongming_task.stores.postgres import PostgresTaskStore
from tests.integration.postgres_support import pg_dsn as pg_dsn
from tests.integration.postgres_support import schema as schema
from tests.integration.postgres_support import server_connections
from tests.integration.test_web import Web


@pytest.fixture
def filled(pg_dsn: str, schema: str) -> Iterator[None]:
    store = PostgresTaskStore(pg_dsn, schema=schema)
    with Controller(store, owner="filler") as node:
        task = node.task(lambda token, n: n, name="n")
        for run in [node.submit(task, n) for n in range(50)]:
            run.result(timeout=30)
    store.close()
    yield


def test_the_dashboard_holds_two_server_connections_under_load(
    pg_dsn: str, schema: str, filled: None
) -> None:
    web = Web(pg_dsn, "--pg-schema", schema)
    name = f"chongming-task web:{web.proc.pid}"

    stop = threading.Event()
    answers: list[int] = []

    def browse() -> None:
        while not stop.is_set():
            for path in ("/", "/tasks?status=all", "/nodes", "/healthz"):
                answers.append(web.get(path)[0])

    browsers = [threading.Thread(target=browse) for _ in range(6)]
    try:
        for thread in browsers:
            thread.start()
        seen = []
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            seen.append(server_connections(pg_dsn, name))
            time.sleep(0.05)
    finally:
        stop.set()
        for thread in browsers:
            thread.join(30)
        web.close()
    assert answers and set(answers) == {200}, sorted(set(answers))
    assert max(seen) == 2, f"server connections seen: {sorted(set(seen))}"
