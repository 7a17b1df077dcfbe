from __future__ import annotations

from datetime import datetime

import pytest

from chongming_task import IllegalTransition, TaskSnapshot, TaskStatus, states


def test_every_status_has_a_row_and_terminal_ones_lead_nowhere() -> None:
    for status in TaskStatus:
        targets = states.legal_targets(status)
        if status in states.TERMINAL:
            assert targets == frozenset()
        else:
            assert targets, status
            assert TaskStatus.LOST in targets  # reconcile may end any live task


def test_illegal_transitions_raise_and_legal_ones_pass() -> None:
    states.check("t", TaskStatus.RUNNING, TaskStatus.PAUSING)
    with pytest.raises(IllegalTransition, match="t: succeeded -> running"):
        states.check("t", TaskStatus.SUCCEEDED, TaskStatus.RUNNING)
    with pytest.raises(IllegalTransition):
        states.check("t", TaskStatus.QUEUED, TaskStatus.PAUSED)
    with pytest.raises(IllegalTransition):
        states.check("t", TaskStatus.PAUSED, TaskStatus.SUCCEEDED)


def test_naive_datetimes_are_rejected() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        TaskSnapshot(
            task_id="t",
            name="n",
            status=TaskStatus.QUEUED,
            status_version=1,
            created_at=datetime(2026, 1, 1),
        )
