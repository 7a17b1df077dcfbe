"""PostgresTaskStore against a real server: the contract, and the concurrency the contract
cannot prove (docs/stores.md). Each test gets its own schema,
dropped afterwards. Without a server (CHONGMING_TEST_POSTGRES, or the throwaway cluster
tests/conftest.py starts where initdb and pg_ctl exist) these skip visibly; in CI they fail.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from chongming_task import (
    Command,
    CommandAction,
    ConcurrencyConflict,
    StoreError,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    TaskStore,
)
from chongming_task.testing import StoreContract
from tests.integration.postgres_support import (
    drop_schemas,
    new_schema,
    pg_dsn,
    require_dsn,
    schemas,
)
from tests.integration.together import BARRIER, run_together

__all__ = ["pg_dsn", "schemas"]  # fixtures used by name

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def make(dsn: str, made: list[str], *, max_size: int = 10):  # type: ignore[no-untyped-def]
    from chongming_task.stores.postgres import PostgresTaskStore

    schema = new_schema()
    made.append(schema)
    store = PostgresTaskStore(dsn, schema=schema, max_size=max_size)
    store.create_schema()
    return store


class TestPostgresStoreContract(StoreContract):
    @pytest.fixture(autouse=True)
    def _server(self) -> Iterator[None]:
        self._dsn = require_dsn()
        self._made: list[str] = []
        yield
        drop_schemas(self._dsn, self._made)

    def make_store(self) -> TaskStore:
        store: TaskStore = make(self._dsn, self._made)
        return store


def snapshot(task_id: str, **changes: object) -> TaskSnapshot:
    base = TaskSnapshot(
        task_id=task_id, name="n", status=TaskStatus.QUEUED, status_version=1, created_at=T0
    )
    return base.evolve(**changes)


def test_eight_threads_saving_the_same_version_one_wins(pg_dsn: str, schemas: list[str]) -> None:
    store = make(pg_dsn, schemas, max_size=8)
    store.create(snapshot("t1"))
    barrier = threading.Barrier(8)
    outcomes: list[str] = []
    lock = threading.Lock()

    def writer(n: int) -> None:
        barrier.wait()
        try:
            store.save(snapshot("t1", status_version=2, attempt=n), expect_version=1)
            result = "ok"
        except ConcurrencyConflict:
            result = "conflict"
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["conflict"] * 7 + ["ok"]
    final = store.get("t1")
    assert final is not None and final.status_version == 2
    store.close()


def test_eight_consumers_claim_twenty_commands_exactly_once(
    pg_dsn: str, schemas: list[str]
) -> None:
    store = make(pg_dsn, schemas, max_size=8)
    for i in range(20):
        store.submit_command(
            Command(
                command_id=f"c{i:02d}",
                task_id=f"t{i:02d}",
                action=CommandAction.STOP,
                created_at=T0 + timedelta(seconds=i),
            )
        )
    barrier = threading.Barrier(8)
    claimed: list[str] = []
    lock = threading.Lock()

    def consumer() -> None:
        barrier.wait()
        while True:
            got = store.claim_commands(now=T0 + timedelta(minutes=1), lease_seconds=60, limit=3)
            if not got:
                return
            with lock:
                claimed.extend(c.command_id for c in got)

    threads = [threading.Thread(target=consumer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(claimed) == 20 and len(set(claimed)) == 20
    store.close()


def test_side_by_side_claimers_hand_out_each_tasks_commands_in_arrival_order(
    pg_dsn: str, schemas: list[str]
) -> None:
    """Eight claimers at once over four tasks' commands: a command is only ever handed
    out together with, or after the completion of, every earlier command of its task."""
    store = make(pg_dsn, schemas, max_size=8)
    order: dict[str, tuple[str, int]] = {}
    for i in range(40):
        task, k = f"t{i % 4}", i // 4
        order[f"c{i:02d}"] = (task, k)
        # Senders' clocks disagree: creation times run backwards.
        store.submit_command(
            Command(
                command_id=f"c{i:02d}",
                task_id=task,
                action=CommandAction.PAUSE,
                created_at=T0 - timedelta(seconds=i),
            )
        )
    barrier = threading.Barrier(8)
    done: set[tuple[str, int]] = set()
    handed: list[tuple[str, int]] = []
    broken: list[str] = []
    lock = threading.Lock()

    def consumer() -> None:
        barrier.wait()
        idle = 0
        while idle < 20:
            got = store.claim_commands(now=T0 + timedelta(minutes=1), lease_seconds=60, limit=3)
            idle = 0 if got else idle + 1
            with lock:
                seen = set(done)
                for command in got:
                    task, k = order[command.command_id]
                    if k > 0 and (task, k - 1) not in seen:
                        broken.append(f"{command.command_id} before {task}#{k - 1}")
                    seen.add((task, k))
                    handed.append((task, k))
            for command in got:
                with lock:  # marked before the store says so: never a false alarm
                    done.add(order[command.command_id])
                store.complete_command(command.command_id, now=T0, outcome="pausing")
            time.sleep(0.001)

    threads = [threading.Thread(target=consumer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert broken == []
    assert sorted(handed) == sorted(order.values())
    store.close()


def test_a_killed_holder_keeps_its_lease_until_expiry_and_the_pool_heals(
    pg_dsn: str, schemas: list[str]
) -> None:
    import psycopg

    from chongming_task.stores.postgres import PostgresTaskStore

    schema = new_schema()
    schemas.append(schema)
    holder = PostgresTaskStore(pg_dsn, schema=schema, max_size=2, application_name="holder")
    holder.create_schema()
    other = PostgresTaskStore(pg_dsn, schema=schema, application_name="other")
    holder.submit_command(
        Command(command_id="c1", task_id="t", action=CommandAction.STOP, created_at=T0)
    )
    now = datetime.now(UTC)
    (claim,) = holder.claim_commands(now=now, lease_seconds=2)
    # Kill every backend of the holder's pool, as a crash or a network cut would.
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        killed = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'holder'"
        ).fetchall()
        assert killed and all(row[0] for row in killed), "no holder backend was terminated"
        # pg_terminate_backend only signals: wait until they are gone, as after a crash.
        gone = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'holder'"
        for _ in range(1000):
            if admin.execute(gone).fetchone() == (0,):
                break
            time.sleep(0.01)
    # The lease is neither released early ...
    assert other.claim_commands(now=now + timedelta(seconds=1), lease_seconds=2) == []
    # ... nor stuck: after expiry another consumer takes it over.
    again = other.claim_commands(now=now + timedelta(seconds=2), lease_seconds=2)
    assert [c.command_id for c in again] == [claim.command_id]
    # The holder's pool replaced its dead connections: it works again without help.
    holder.create(snapshot("after-kill"))
    assert holder.get("after-kill") is not None
    holder.close()
    other.close()


def test_a_pooled_connection_is_checked_without_a_query_until_its_backend_dies(
    pg_dsn: str, schemas: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hot path asks the server nothing before a statement: the check at checkout
    looks at the socket, and only a connection with something to read (a terminated
    backend's last words) is asked, then dropped."""
    import psycopg
    from psycopg_pool import ConnectionPool

    from chongming_task.stores import postgres

    asked: list[object] = []
    real = ConnectionPool.check_connection
    monkeypatch.setattr(
        ConnectionPool, "check_connection", staticmethod(lambda c: (asked.append(c), real(c)))
    )
    schema = new_schema()
    schemas.append(schema)
    store = postgres.PostgresTaskStore(
        pg_dsn, schema=schema, max_size=1, application_name="pool-check"
    )
    store.create_schema()
    store.create(snapshot("one"))
    assert store.get("one") is not None
    assert asked == []  # three checkouts, no query of their own
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        gone = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pool-check'"
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'pool-check'"
        )
        deadline = time.monotonic() + 10
        while admin.execute(gone).fetchone() != (0,) and time.monotonic() < deadline:
            time.sleep(0.01)
    assert store.get("one") is not None  # checked, found dead, replaced: no error
    assert len(asked) == 1
    store.close()


def test_a_role_without_ddl_rights_uses_the_existing_schema(
    pg_dsn: str, schemas: list[str]
) -> None:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from chongming_task.stores.postgres import PostgresTaskStore

    owner_store = make(pg_dsn, schemas)
    schema = owner_store.schema
    owner_store.create(snapshot("seeded"))
    role = f"{schema}_app"
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(f"DROP ROLE IF EXISTS {role}")
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        admin.execute(
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}"
        )
        admin.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {schema} TO {role}")
    app_dsn = make_conninfo(**{**conninfo_to_dict(pg_dsn), "user": role})
    try:
        app = PostgresTaskStore(app_dsn, schema=schema)
        assert app.get("seeded") is not None
        app.create(snapshot("by-app"))
        app.save(snapshot("by-app", status_version=2), expect_version=1)
        assert {s.task_id for s in app.query()} == {"seeded", "by-app"}
        with pytest.raises(StoreError, match="permission denied"):
            app.create_schema()  # DDL is refused, and nothing else needs it
        assert app.counts()[TaskStatus.QUEUED] == 2
        app.close()
    finally:
        owner_store.close()
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            admin.execute(f"DROP ROLE IF EXISTS {role}")


def test_tag_queries_use_exact_jsonb_containment(pg_dsn: str, schemas: list[str]) -> None:
    store = make(pg_dsn, schemas)
    store.create(snapshot("a", tags=frozenset({"io"})))
    store.create(snapshot("b", tags=frozenset({"ios"})))
    assert [s.task_id for s in store.query(TaskQuery(tag="io"))] == ["a"]
    plan = " ".join(store.explain_query(TaskQuery(tag="io")))
    assert "@>" in plan
    store.close()


def test_create_schema_waits_for_another_nodes_creation_of_it(
    pg_dsn: str, schemas: list[str]
) -> None:
    # Another node's create_schema, caught inside its transaction: its lock taken, its
    # DDL run, not committed. This one waits for it, then finds everything made. With
    # IF NOT EXISTS alone it failed once the other committed: a duplicate key in
    # pg_namespace, the system catalog's list of schemas.
    import psycopg

    from chongming_task.stores.postgres import PostgresTaskStore
    from chongming_task.stores.postgres import schema as postgres_schema

    schema = new_schema()
    schemas.append(schema)
    other = psycopg.connect(pg_dsn)
    other.execute("SELECT pg_advisory_xact_lock(%s, %s)", postgres_schema.schema_lock_key(schema))
    other.execute(postgres_schema.schema_ddl(schema))
    committer = threading.Timer(0.3, other.commit)
    committer.start()
    store = PostgresTaskStore(pg_dsn, schema=schema)
    try:
        store.create_schema()  # returns once the other's DDL committed
        store.create(snapshot("after-the-wait"))
        assert store.get("after-the-wait") is not None
    finally:
        committer.join()
        other.close()
        store.close()


NODE = (
    """
import sys
from chongming_task.stores.postgres import PostgresTaskStore
store = PostgresTaskStore(sys.argv[1], schema=sys.argv[2])
"""
    + BARRIER
    + """
store.create_schema()
store.close()
"""
)


def test_nodes_creating_one_schema_together_all_succeed(pg_dsn: str, schemas: list[str]) -> None:
    # Four processes each call create_schema() at start, connected first, on a schema
    # none made yet. Seen before the lock: three of four failed on the system catalog's
    # duplicate key.
    schema = new_schema()
    schemas.append(schema)
    for node in run_together(NODE, [[pg_dsn, schema]] * 4):
        assert node.returncode == 0, node.stderr


def test_a_missing_schema_is_a_clear_error(pg_dsn: str) -> None:
    from chongming_task.stores.postgres import PostgresTaskStore

    store = PostgresTaskStore(pg_dsn, schema=new_schema())
    with pytest.raises(StoreError, match="migrate"):
        store.get("anything")
    store.close()


def stored_version(dsn: str, schema: str) -> list[tuple[int]]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return conn.execute(f"SELECT version FROM {schema}.schema_version").fetchall()


def schema_then(dsn: str, schemas: list[str], task_id: str, change: str) -> str:
    """A new schema holding one task, then ``change`` (SQL; ``{schema}`` its name) run
    by another client, as another release would."""
    import psycopg

    store = make(dsn, schemas)
    store.create(snapshot(task_id))
    store.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(change.format(schema=store.schema).encode())
    return str(store.schema)


def test_a_schema_records_its_version_and_a_newer_one_is_refused(
    pg_dsn: str, schemas: list[str]
) -> None:
    import psycopg

    from chongming_task.stores.postgres import SCHEMA_VERSION, PostgresTaskStore

    # A newer release migrated it (a column this one does not know, say): this release
    # must not read or write it. Refused when the store opens, in one line.
    newer = SCHEMA_VERSION + 1
    schema = schema_then(
        pg_dsn, schemas, "kept", f"UPDATE {{schema}}.schema_version SET version = {newer}"
    )
    with pytest.raises(StoreError) as refused:
        PostgresTaskStore(pg_dsn, schema=schema)
    message = str(refused.value)
    assert f"version {newer}, made by a newer release" in message
    assert f"reads version {SCHEMA_VERSION}: upgrade chongming-task" in message
    assert "\n" not in message
    # The CLI says the same in one line, exit 1, and the data is untouched.
    cli = [sys.executable, "-m", "chongming_task", "--db", pg_dsn, "--pg-schema", schema]
    shown = subprocess.run([*cli, "ps"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 1, shown.stderr
    assert shown.stderr.count("\n") == 1 and "made by a newer release" in shown.stderr
    assert "Traceback" not in shown.stderr
    migrated = subprocess.run([*cli, "migrate"], capture_output=True, text=True, timeout=60)
    assert migrated.returncode == 1 and "made by a newer release" in migrated.stderr
    assert stored_version(pg_dsn, schema) == [(newer,)]  # never lowered
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f"SELECT task_id FROM {schema}.tasks").fetchall() == [("kept",)]


def test_a_schema_an_older_release_made_is_refused_in_one_line_until_migrated(
    pg_dsn: str, schemas: list[str]
) -> None:
    from chongming_task.stores.postgres import SCHEMA_VERSION, PostgresTaskStore

    # As the releases before the version table made it: version 1, none of version 2's
    # columns and tables.
    schema = schema_then(
        pg_dsn,
        schemas,
        "older",
        "DROP TABLE {schema}.schema_version; DROP TABLE {schema}.late_reports; "
        "ALTER TABLE {schema}.nodes DROP COLUMN health",
    )
    store = PostgresTaskStore(pg_dsn, schema=schema)
    try:
        with pytest.raises(StoreError) as refused:
            store.get("older")
        message = str(refused.value)
        assert "version 1, made by an older release" in message
        assert "run `chongming-task migrate`" in message and "\n" not in message
        # The CLI says the same, in one line, and migrate upgrades it.
        cli = [sys.executable, "-m", "chongming_task", "--db", pg_dsn, "--pg-schema", schema]
        shown = subprocess.run([*cli, "ps"], capture_output=True, text=True, timeout=60)
        assert shown.returncode == 1 and "made by an older release" in shown.stderr
        assert "Traceback" not in shown.stderr
        migrated = subprocess.run([*cli, "migrate"], capture_output=True, text=True, timeout=60)
        assert migrated.returncode == 0, migrated.stderr
    finally:
        store.close()
    assert stored_version(pg_dsn, schema) == [(SCHEMA_VERSION,)]
    again = PostgresTaskStore(pg_dsn, schema=schema)
    try:
        assert again.get("older") is not None  # nothing else changed
    finally:
        again.close()


def test_the_statements_in_postgres_sql_match_the_codec(pg_dsn: str, schemas: list[str]) -> None:
    """The statements live in stores/postgres/queries.sql as SQL; a column the codec has and the SQL
    lacks (or a shifted order) fails here, not as a silently misread row."""
    import re

    import psycopg

    from chongming_task.states import TERMINAL
    from chongming_task.stores import codec
    from chongming_task.stores.sql import load_named

    store = make(pg_dsn, schemas)
    store.close()
    with psycopg.connect(pg_dsn) as conn:
        for table, columns in (
            ("tasks", codec.TASK_COLUMNS),
            ("transitions", codec.TRANSITION_COLUMNS),
            ("commands", codec.COMMAND_COLUMNS),
        ):
            found = [
                r[0]
                for r in conn.execute(
                    "SELECT column_name FROM information_schema.columns"
                    " WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
                    [schemas[-1], table],
                )
            ]
            # outcome_preview is the store's own (generated from the result: no row of the
            # codec's carries it), as seq is.
            assert [c for c in found if c not in ("seq", "outcome_preview")] == list(columns)
    statements = load_named("chongming_task.stores.postgres")
    for name in ("prune", "touch_task", "renew_lease", "write_activity"):
        assert set(re.findall(r"'(\w+)'", statements[name])) == {s.value for s in TERMINAL}
    selected = statements["get_task"].split("FROM")[0].replace("SELECT", "")
    assert [c.strip().removesuffix("::text") for c in selected.split(",")] == list(
        codec.TASK_COLUMNS
    )


def test_a_large_batch_is_one_array_statement_and_all_or_nothing(
    pg_dsn: str, schemas: list[str]
) -> None:
    """Batches from _BULK_FROM tasks go through the array statement (the capability
    contract's three-task batch takes the row-by-row path): every value round-trips,
    and an existing id keeps nothing of the batch."""
    from chongming_task import TaskAlreadyExists, Transition
    from chongming_task.stores.postgres.store import _BULK_FROM

    store = make(pg_dsn, schemas)
    try:

        def item(i: int, prefix: str = "bulk") -> tuple[TaskSnapshot, Transition]:
            task = snapshot(
                f"{prefix}{i:03d}",
                tags=frozenset({"io", f"t{i}"}),
                bucket=i % 7,
                bucket_key=f"k{i}",
                owner="node-a",
                lease_owner="node-a",
                lease_until=T0 + timedelta(seconds=i),
            )
            created = Transition(
                task_id=task.task_id,
                version=1,
                from_status=None,
                to_status=TaskStatus.QUEUED,
                at=T0 + timedelta(milliseconds=i),
                reason="submitted",
                actor="node-a",
            )
            return task, created

        batch = [item(i) for i in range(3 * _BULK_FROM)]
        store.create_many(batch)
        for task, created in batch:
            assert store.get(task.task_id) == task
            assert store.history(task.task_id) == [created]
        clash = [item(i, "new") for i in range(_BULK_FROM)] + [batch[0]]
        with pytest.raises(TaskAlreadyExists):
            store.create_many(clash)
        assert store.get("new000") is None and store.history("new000") == []
    finally:
        store.close()


def test_a_refusal_is_reported_at_once_in_the_servers_words(pg_dsn: str) -> None:
    """A wrong role or database is not an outage: the CLI says the server's reason in
    one line, at once (it used to wait the connect timeout and say "cannot reach")."""
    from psycopg.conninfo import conninfo_to_dict

    from tests.integration.test_postgres_connect_errors import ps

    info = conninfo_to_dict(pg_dsn)
    host, port = info.get("host", "127.0.0.1"), info.get("port", 5432)
    user, db = info.get("user", "postgres"), info.get("dbname", "postgres")
    cases = {
        f"postgresql://chongming_no_such_role@{host}:{port}/{db}": (
            'role "chongming_no_such_role" does not exist'
        ),
        f"postgresql://{user}@{host}:{port}/chongming_no_such_db": (
            'database "chongming_no_such_db" does not exist'
        ),
    }
    for dsn, reason in cases.items():
        result, took = ps(dsn)
        assert result.returncode == 1
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "refused the connection" in lines[0], result.stderr
        assert reason in lines[0]
        assert took < 4.5, f"took {took:.1f}s: waited instead of reporting"


def test_a_command_wakes_its_tasks_holder_and_not_another_node(
    pg_dsn: str, schemas: list[str]
) -> None:
    store = make(pg_dsn, schemas)
    try:
        for task_id, holder in (("a-task", "node-a"), ("b-task", "node-b")):
            store.create(snapshot(task_id, status=TaskStatus.RUNNING, lease_owner=holder))
        woken = {"node-a": 0, "node-b": 0}
        lock = threading.Condition()

        def waker(node: str):  # type: ignore[no-untyped-def]
            def wake() -> None:
                with lock:
                    woken[node] += 1
                    lock.notify_all()

            return wake

        def command(command_id: str, task_id: str) -> Command:
            return Command(
                command_id=command_id,
                task_id=task_id,
                action=CommandAction.STOP,
                created_at=T0,
                issued_by="tester",
            )

        stops = [store.subscribe_commands_for(n, waker(n)) for n in woken]
        try:
            # Both listening once a command of no task's (anyone's) has woken both.
            for i in range(40):
                store.submit_command(command(f"anyone-{i}", f"gone-{i}"))
                with lock:
                    if lock.wait_for(lambda: min(woken.values()) > 0, 0.25):
                        break
            with lock:  # quiet for 0.3 s: the wake-ups of the commands above are spent
                seen: dict[str, int] = {}
                while seen != woken:
                    seen = dict(woken)
                    lock.wait(0.3)
                woken.update({"node-a": 0, "node-b": 0})
            # B's task's command wakes B; anyone's then wakes both and reaches A after B's
            # (one connection delivers in commit order): A slept through B's.
            store.submit_command(command("for-b", "b-task"))
            store.submit_command(command("for-anyone", "gone"))
            with lock:
                assert lock.wait_for(lambda: woken["node-a"] >= 1 and woken["node-b"] >= 2, 10)
            time.sleep(0.2)
            with lock:
                assert woken == {"node-a": 1, "node-b": 2}
        finally:
            for stop in stops:
                if stop is not None:
                    stop()
    finally:
        store.close()
