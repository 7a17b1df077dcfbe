"""``TransitionFeed`` (what ``watch`` and the dashboard follow): every transition once,
even when a task's trail is read ahead of its row."""

from __future__ import annotations

from chongming_task import TaskStatus
from chongming_task.feed import TransitionFeed
from chongming_task.stores.memory import InMemoryTaskStore
from chongming_task.testing.contract_base import ContractBase

S = TaskStatus
make = ContractBase.snapshot
step = ContractBase.transition


def test_a_transition_read_ahead_of_its_tasks_row_is_shown_once() -> None:
    store = InMemoryTaskStore()
    store.create(make("t1", status=S.RUNNING, status_version=3))
    feed = TransitionFeed(store)
    assert feed.poll().transitions == []  # the first refresh starts from now
    # The row says pausing (4) while the trail already holds paused (5): a refresh
    # that reads the row, then the trail, between the two writes of one acknowledgement.
    store.save(make("t1", status=S.PAUSING, status_version=4), expect_version=3)
    store.append(step("t1", 4, S.PAUSING, from_status=S.RUNNING))
    store.append(step("t1", 5, S.PAUSED, from_status=S.PAUSING))
    assert [t.version for t in feed.poll().transitions] == [4, 5]
    store.save(make("t1", status=S.PAUSED, status_version=5), expect_version=4)
    assert feed.poll().transitions == []  # 5 was shown already
    store.save(make("t1", status=S.RUNNING, status_version=6), expect_version=5)
    store.append(step("t1", 6, S.RUNNING, from_status=S.PAUSED))
    assert [t.version for t in feed.poll().transitions] == [6]
