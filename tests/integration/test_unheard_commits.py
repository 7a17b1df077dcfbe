"""A commit nobody heard, on a real PostgreSQL behind a TCP proxy: the proxy drops the
server's answers (``deafen``) while a write is in flight, then cuts the connection, so
the write is done by the server but its caller gets ``StoreUnavailable``. What the node
then does, once the store answers again: a submit told it failed never runs and is not
left waiting (ended ``cancelled``, "submit reported as failed; never started"); a retry
with its dedupe key creates a task that runs; a command that landed is answered
"accepted"; a transition that landed is taken as written, not as another writer's."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from chongming_task import CancellationToken, Controller, StoreUnavailable, TaskStatus
from chongming_task.control import StoreControl
from chongming_task.model import Command, CommandAction, ControlOutcome, TaskQuery
from chongming_task.node.submission import NEVER_STARTED
from chongming_task.stores.postgres import PostgresTaskStore
from chongming_task.testing.proxy import Proxy
from tests.conftest import wait_until
from tests.integration.postgres_support import pg_dsn as pg_dsn
from tests.integration.postgres_support import schema as schema

S = TaskStatus


class Road:
    """A store reached through a proxy, and one reached directly (the test's eyes)."""

    def __init__(self, dsn: str, schema: str) -> None:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
        host = str(info.get("host") or "127.0.0.1")
        self.proxy = Proxy((host, int(info.get("port") or 5432)))
        via = psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1", port=self.proxy.port)
        self.proxied = PostgresTaskStore(via, schema=schema, connect_timeout=2)
        self.direct = PostgresTaskStore(dsn, schema=schema)

    def unheard(
        self,
        call: Callable[[], Any],
        *,
        landed: Callable[[], bool],
        after: bytes | None = None,
    ) -> Any:
        """Run ``call`` on a thread while the server's answers are dropped (from the
        first ``after`` a client sends, if given) until the server has carried it out
        (``landed``, seen on the direct road) or 5 s have passed (nothing was sent: a
        connection's handshake went unheard), then cut and heal the road: what ``call``
        returned or raised."""
        got: list[Any] = []

        def target() -> None:
            try:
                got.append(call())
            except BaseException as exc:
                got.append(exc)

        self.proxy.deafen(after=after)
        thread = threading.Thread(target=target)
        thread.start()
        deadline = time.monotonic() + 5.0
        while not landed() and time.monotonic() < deadline:
            thread.join(0.01)
        self.proxy.cut()
        self.proxy.heal()  # the server can be asked again (a call may, before it returns)
        thread.join(30)
        assert not thread.is_alive(), "the call never returned"
        self.ready()
        return got[0]

    def ready(self) -> None:
        """Until the proxied store answers again (it says it is away, at once, for a
        moment after an outage)."""

        def answers() -> bool:
            try:
                self.proxied.get("0" * 32)
            except StoreUnavailable:
                return False
            return True

        wait_until(answers, timeout=30, what="the store through the proxy again")

    def landed_unheard(
        self, submit: Callable[[str, int], Any], *, after: bytes | None = None
    ) -> tuple[str, int]:
        """``submit(tag)`` made unheard until the server has carried it out unheard (an
        attempt can meet a connection still opening, whose handshake goes unheard: then
        nothing was sent, or it was sent after the heal and heard). Returns the tag of
        the attempt whose tasks landed while its caller was told it failed, and its
        number (each attempt's own, for the arguments it submits)."""
        for attempt in range(8):
            tag = f"attempt-{attempt}"
            got = self.unheard(
                lambda tag=tag, n=attempt: submit(tag, n),
                landed=lambda tag=tag: bool(self.direct.query(TaskQuery(tag=tag))),
                after=after,
            )
            if not isinstance(got, BaseException):
                continue  # it waited for a connection, made after the heal: heard
            assert isinstance(got, StoreUnavailable), got
            if self.direct.query(TaskQuery(tag=tag)):
                return tag, attempt
        raise AssertionError("no attempt's create reached the server")

    def close(self) -> None:
        self.proxied.close()
        self.direct.close()
        self.proxy.close()


@pytest.fixture
def road(pg_dsn: str, schema: str) -> Iterator[Road]:
    made = Road(pg_dsn, schema)
    yield made
    made.close()


@pytest.fixture
def node(road: Road) -> Iterator[tuple[Controller, set[int]]]:
    ran: set[int] = set()
    node = Controller(road.proxied, owner="node-a", lease_ttl=5.0, activity_interval=0.05)

    @node.task(name="call")
    def call(token: CancellationToken, n: int) -> int:
        ran.add(n)
        return n

    node.tasks["call"].submit(-1).result(timeout=30)  # a warm connection: the next one is heard
    yield node, ran
    node.close(timeout=5)


def tagged(road: Road, tag: str) -> list[Any]:
    return road.direct.query(TaskQuery(tag=tag))


def test_a_submit_told_it_failed_is_ended_cancelled_and_never_runs(
    road: Road, node: tuple[Controller, set[int]]
) -> None:
    c, ran = node
    tag, n = road.landed_unheard(lambda tag, n: c.tasks["call"].configure(tags={tag}).submit(n))
    (stored,) = tagged(road, tag)  # the server did carry out the create
    wait_until(
        lambda: road.direct.get(stored.task_id).status is S.CANCELLED,  # type: ignore[union-attr]
        timeout=20,
        what="the doubtful create resolved",
    )
    trail = road.direct.history(stored.task_id)
    assert [t.to_status for t in trail] == [S.QUEUED, S.CANCELLED]
    assert trail[-1].reason == NEVER_STARTED and trail[-1].actor == "node-a"
    assert n not in ran
    # Nothing left for a reconcile to call lost, nothing waiting.
    assert c.reconcile().lost == ()


def test_a_batch_told_it_failed_is_ended_cancelled_whole(
    road: Road, node: tuple[Controller, set[int]]
) -> None:
    c, ran = node
    tag, n = road.landed_unheard(
        lambda tag, n: (
            c.tasks["call"].configure(tags={tag}).submit_many([(10 * n + i,) for i in range(3)])
        ),
        after=b"COMMIT",  # a transaction of several statements: its commit goes unheard
    )
    assert len(tagged(road, tag)) == 3
    wait_until(
        lambda: {s.status for s in tagged(road, tag)} == {S.CANCELLED},
        timeout=20,
        what="the batch resolved",
    )
    assert not ran & {10 * n, 10 * n + 1, 10 * n + 2}


def test_a_retry_with_the_dedupe_key_runs_in_place_of_the_unheard_one(
    road: Road, node: tuple[Controller, set[int]]
) -> None:
    c, _ = node
    tag, _ = road.landed_unheard(
        lambda tag, n: c.tasks["call"].configure(dedupe_key=tag, tags={tag}).submit(7)
    )
    # The caller retries at once: the key's holder is the unheard create, which never
    # started; it is ended, and the retry is a task that runs. (A pooled connection the
    # cut left dead can fail a retry too, as it would fail a caller's: it retries.)
    for _ in range(10):
        try:
            again = c.tasks["call"].configure(dedupe_key=tag, tags={tag}).submit(7)
            break
        except StoreUnavailable:
            time.sleep(0.2)
    assert again.result(timeout=30) == 7
    tasks = {s.task_id: s for s in tagged(road, tag)}
    assert len(tasks) >= 2
    others = [s for t, s in tasks.items() if t != again.task_id]
    wait_until(
        lambda: all(road.direct.get(s.task_id).status is S.CANCELLED for s in others),  # type: ignore[union-attr]
        timeout=20,
        what="every unheard create ended",
    )
    for s in others:
        assert road.direct.history(s.task_id)[-1].reason == NEVER_STARTED
    assert [road.direct.get(t).status for t in tasks].count(S.SUCCEEDED) == 1  # type: ignore[union-attr]


def test_a_command_that_landed_unheard_is_answered_accepted(
    road: Road, node: tuple[Controller, set[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    c, _ = node
    task = c.tasks["call"].configure(delay=3600).submit(99)  # waits: another's to control
    control = StoreControl(road.proxied, owner="cli:test")
    unheard: list[str] = []  # the command writes that raised
    write = road.proxied.submit_command

    def watched(command: Command) -> None:
        try:
            write(command)
        except StoreUnavailable:
            unheard.append(command.command_id)
            raise

    monkeypatch.setattr(road.proxied, "submit_command", watched)
    began = c.clock.now() - timedelta(minutes=1)

    def stored() -> set[str]:
        """Still open, or already carried out by the node (a pause of a waiting task is
        answered at once)."""
        return {c.command_id for c in road.direct.pending_commands(task.task_id)} | {
            c.command_id for c in road.direct.finished_commands(after=began)
        }

    for _ in range(8):
        before = stored()
        got = road.unheard(
            lambda: control.queue(task.task_id, CommandAction.PAUSE, "unheard", status=S.QUEUED),
            landed=lambda before=before: stored() != before,  # type: ignore[misc]
            after=b"COMMIT",  # stored and announced in one transaction: its commit unheard
        )
        now_stored = stored()
        if not isinstance(got, BaseException):
            assert got.outcome is ControlOutcome.ACCEPTED and got.command_id in now_stored
            if got.command_id in unheard:
                return  # its write raised, and it was answered by what the store holds
        else:  # nothing stored: the failure is the truth
            assert isinstance(got, StoreUnavailable) and unheard
            assert unheard[-1] not in now_stored
    raise AssertionError("no command write landed unheard in 8 attempts")


def test_a_transition_that_landed_unheard_is_the_runs_own_not_another_writers(
    road: Road, node: tuple[Controller, set[int]]
) -> None:
    c, _ = node
    go = threading.Event()

    @c.task(name="gate")
    def gate(token: CancellationToken) -> str:
        while not go.is_set():
            token.sleep(0.01)
        return "through"

    run = c.tasks["gate"].submit()
    wait_until(lambda: road.direct.get(run.task_id).status is S.RUNNING)  # type: ignore[union-attr]

    def finish() -> str:
        go.set()  # its success is written while nobody hears the server
        return str(run.result(timeout=30))

    def succeeded() -> bool:
        stored = road.direct.get(run.task_id)
        return stored is not None and stored.status is S.SUCCEEDED

    assert road.unheard(finish, landed=succeeded) == "through"
    wait_until(
        lambda: road.direct.get(run.task_id).status is S.SUCCEEDED,  # type: ignore[union-attr]
        timeout=20,
        what="the success in the store",
    )
    time.sleep(0.5)  # a window for the catch-up's pass after the heal: no desync in it
    assert not run.desynced
    assert c.health().desynced == 0
    statuses = [t.to_status for t in road.direct.history(run.task_id)]
    assert statuses[-1] is S.SUCCEEDED and statuses.count(S.SUCCEEDED) == 1
