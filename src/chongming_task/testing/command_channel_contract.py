"""The ``CommandChannel`` section of the store contract: wake-ups, claims addressed to
a holder, a task's open commands, finished ones, and holds. Each test runs only where
the store declares the role whole, else raises ``unittest.SkipTest``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from unittest import SkipTest

from ..model import (
    CommandAction,
    TaskStatus,
)
from ..stores.roles import (
    CommandChannel,
)
from .contract_base import ContractBase, at

__all__ = ["CommandChannelContract"]


_QUIET = 0.3
"""Seconds without a wake-up after which the earlier ones are taken as spent."""


def _quiet(woke: threading.Event, deadline: float = 10.0) -> None:
    """Return once ``woke`` has not been set for ``_QUIET`` seconds, cleared."""
    end = time.monotonic() + deadline
    woke.clear()
    while woke.wait(_QUIET):
        woke.clear()
        assert time.monotonic() < end, f"wake-ups kept coming for {deadline} s"


def _quiet_counts(lock: threading.Condition, woken: dict[str, int]) -> None:
    """Return once ``woken`` has not changed for ``_QUIET`` seconds (its wake-ups spent)."""
    with lock:
        seen: dict[str, int] = {}
        end = time.monotonic() + 10
        while seen != woken:
            assert time.monotonic() < end, "wake-ups kept coming for 10 s"
            seen = dict(woken)
            lock.wait(_QUIET)


def _until_woken(woke: threading.Event, poke: Callable[[int], None], what: str) -> None:
    """``poke(i)`` until ``woke`` is set (a subscription may take a moment to start, and
    may wake once when it does), then wait until the wake-ups of the pokes are spent."""
    for i in range(40):
        poke(i)
        if woke.wait(0.25):
            break
    assert woke.is_set(), f"no wake-up within 10 s of {what}"
    _quiet(woke)


class CommandChannelContract(ContractBase):
    def test_capability_command_wakeups_wake_a_subscriber(self) -> None:
        with self._store() as store:
            self._declares(store, CommandChannel, "subscribe_commands()")
            assert isinstance(store, CommandChannel)
            woke = threading.Event()
            unsubscribe = store.subscribe_commands(woke.set)
            if unsubscribe is None:
                raise SkipTest(f"{type(store).__name__} cannot wake a subscriber here")
            try:
                _until_woken(
                    woke,
                    lambda i: store.submit_command(self.command(f"wake-{i}", i)),
                    "submitting commands",
                )
                # Once subscribed, a single command is enough.
                store.submit_command(self.command("wake-once", 100))
                assert woke.wait(5), "a single command woke no subscriber within 5 s"
            finally:
                unsubscribe()

    def test_capability_addressed_wakeups_wake_the_holder(self) -> None:
        with self._store() as store:
            self._declares(store, CommandChannel, "subscribe_commands_for()")
            assert isinstance(store, CommandChannel)
            for task_id, holder in (("a-task", "node-a"), ("b-task", "node-b")):
                store.create(self.snapshot(task_id, status=TaskStatus.RUNNING, lease_owner=holder))
            woken = {"node-a": 0, "node-b": 0}
            lock = threading.Condition()

            def waker(node: str) -> Callable[[], None]:
                def wake() -> None:
                    with lock:
                        woken[node] += 1
                        lock.notify_all()

                return wake

            def wait_for(a: int, b: int) -> None:
                with lock:
                    lock.wait_for(lambda: woken["node-a"] >= a and woken["node-b"] >= b, 10)
                    assert woken["node-a"] >= a and woken["node-b"] >= b, woken

            stops = [store.subscribe_commands_for(n, waker(n)) for n in woken]
            try:
                if None in stops:
                    raise SkipTest(f"{type(store).__name__} cannot wake a subscriber here")
                # Both listening: a command of no task's (anyone's) wakes both.
                for i in range(40):
                    store.submit_command(self.command(f"anyone-{i}", i, task_id=f"gone-{i}"))
                    with lock:
                        if lock.wait_for(lambda: min(woken.values()) > 0, 0.25):
                            break
                wait_for(1, 1)
                _quiet_counts(lock, woken)  # the wake-ups of the commands above are spent
                with lock:
                    woken.update({"node-a": 0, "node-b": 0})
                # B's task's command wakes B; then anyone's wakes both. (Waking A for B's
                # too is allowed; a store that addresses its wake-ups is tested apart.)
                # One command at a time: wake-ups of commands written together may come as
                # one, which the contract allows.
                store.submit_command(self.command("for-b", 50, task_id="b-task"))
                wait_for(0, 1)
                _quiet_counts(lock, woken)
                before = dict(woken)
                store.submit_command(self.command("for-anyone", 51, task_id="gone"))
                wait_for(before["node-a"] + 1, before["node-b"] + 1)
            finally:
                for stop in stops:
                    if stop is not None:
                        stop()

    def test_capability_transition_wakeups_wake_a_subscriber(self) -> None:
        with self._store() as store:
            self._declares(store, CommandChannel, "subscribe_transitions()")
            assert isinstance(store, CommandChannel)
            woke = threading.Event()
            unsubscribe = store.subscribe_transitions(woke.set)
            if unsubscribe is None:
                raise SkipTest(f"{type(store).__name__} wakes no follower")
            try:

                def made(i: int) -> None:
                    store.create(self.snapshot(f"woken-{i}"))
                    store.append(self.transition(f"woken-{i}", 1, TaskStatus.QUEUED))

                _until_woken(woke, made, "appending transitions")
                # Once subscribed, a single append is enough.
                store.append(
                    self.transition(
                        "woken-0", 2, TaskStatus.STARTING, from_status=TaskStatus.QUEUED
                    )
                )
                assert woke.wait(5), "no wake-up within 5 s of one append"
            finally:
                unsubscribe()

    def test_capability_holds_are_kept_replaced_released_and_pruned(self) -> None:
        with self._store() as store:
            self._declares(store, CommandChannel, "holds")
            assert isinstance(store, CommandChannel)
            for task_id in ("h1", "h2", "h3"):
                store.create(self.snapshot(task_id))
            store.hold_task("h1", since=at(5), by="node-a")
            store.hold_task("h2", since=at(3), by="node-a")
            store.hold_task("h1", since=at(7), by="node-b")  # a later hold replaces it
            assert store.holds() == {"h2": at(3), "h1": at(7)}
            assert list(store.holds(limit=1)) == ["h2"]  # the oldest first
            assert store.holds(task_ids=["h1", "h3"]) == {"h1": at(7)}
            assert store.holds(task_ids=[]) == {}
            store.release_hold("h2")
            store.release_hold("h3")  # never held: nothing to do
            assert store.holds() == {"h1": at(7)}
            done = self.snapshot("h1", status=TaskStatus.CANCELLED, ended_at=at(8))
            store.save(done, expect_version=1)
            assert store.prune(keep_terminal=0) == 1
            assert store.holds() == {}

    def test_capability_command_log_lists_finished_commands_by_finish(self) -> None:
        with self._store() as store:
            self._declares(store, CommandChannel, "a command log")
            assert isinstance(store, CommandChannel)
            for name in ("c1", "c2", "c3"):
                store.submit_command(self.command(name, 0))
            store.complete_command("c2", now=at(20), outcome="paused")
            store.complete_command("c1", now=at(30), outcome="already-terminal")
            done = store.finished_commands(after=at(0))
            assert [c.command_id for c in done] == ["c2", "c1"]  # c3 is still open
            assert done[0].finished_at == at(20) and done[0].outcome == "paused"
            assert [c.command_id for c in store.finished_commands(after=at(20))] == ["c1"]
            assert [c.command_id for c in store.finished_commands(after=at(0), limit=1)] == ["c2"]

    def test_capability_pending_commands_lists_a_tasks_open_commands_in_arrival_order(
        self,
    ) -> None:
        with self._store() as store:
            self._declares(store, CommandChannel, "pending commands")
            assert isinstance(store, CommandChannel)
            assert store.pending_commands("t1") == []
            for cid, created, task in (("c2", 2, "t1"), ("x", 0, "t2"), ("c1", 1, "t1")):
                store.submit_command(self.command(cid, created, task))
            assert [c.command_id for c in store.pending_commands("t1")] == ["c2", "c1"]
            store.claim_commands(now=at(10), lease_seconds=30, limit=1)  # c2: leased
            assert [c.command_id for c in store.pending_commands("t1")] == ["c2", "c1"]
            store.complete_command("c2", now=at(11), outcome="pausing")
            pending = store.pending_commands("t1")
            assert [c.command_id for c in pending] == ["c1"]
            assert pending[0].action is CommandAction.STOP and pending[0].issued_by == "tester"

    def test_capability_holder_claim_hands_a_node_only_what_it_may_act_on(self) -> None:
        with self._store() as store:
            self._declares(store, CommandChannel, "claim_commands_for()")
            assert isinstance(store, CommandChannel)
            S = TaskStatus
            tasks = [
                ("mine", S.RUNNING, "node-a"),
                ("theirs", S.RUNNING, "node-b"),
                ("ended", S.SUCCEEDED, "node-b"),  # finished: anyone completes it
                ("unleased", S.QUEUED, None),
            ]
            for task_id, status, holder in tasks:
                store.create(self.snapshot(task_id, status=status, lease_owner=holder))
            order = ["mine", "theirs", "ended", "unleased", "gone", "mine"]
            for i, task_id in enumerate(order):  # "gone": no such task
                store.submit_command(self.command(f"c{i}-{task_id}", i, task_id=task_id))
            claimed = store.claim_commands_for("node-a", now=at(10), lease_seconds=60)
            assert [c.command_id for c in claimed] == [
                "c0-mine",
                "c2-ended",
                "c3-unleased",
                "c4-gone",
                "c5-mine",
            ]
            assert store.claim_commands_for("node-a", now=at(11), lease_seconds=60) == []
            theirs = store.claim_commands_for("node-b", now=at(12), lease_seconds=60)
            assert [c.command_id for c in theirs] == ["c1-theirs"]
