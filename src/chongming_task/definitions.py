"""``TaskDefinition``: a node-owned function plus its defaults, and the ``task`` decorator."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigurationError
from .policies import RetryPolicy

TaskFunction = Callable[..., Any]
"""Called as ``func(token, *args, **kwargs)``; returns a JSON-serializable result."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskDefinition:
    """What a node knows how to run. Definitions never leave the node that owns them: the
    store holds states, not recipes, so no other node can run (or re-run) this task.
    """

    name: str
    func: TaskFunction
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeout: float | None = None
    timeout_grace: float = 5.0
    tags: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigurationError("a task definition needs a non-empty name")
        if self.timeout is not None and self.timeout <= 0:
            raise ConfigurationError(f"task {self.name}: timeout must be > 0, got {self.timeout}")
        if self.timeout_grace < 0:
            raise ConfigurationError(f"task {self.name}: timeout_grace must be >= 0")


def define(
    func: TaskFunction,
    *,
    name: str | None = None,
    retries: int = 0,
    backoff: RetryPolicy | None = None,
    timeout: float | None = None,
    timeout_grace: float = 5.0,
    tags: Iterable[str] = (),
) -> TaskDefinition:
    """Build a ``TaskDefinition``; ``backoff`` shapes the delays, ``retries`` counts them."""
    policy = backoff or RetryPolicy()
    if retries != policy.retries:
        policy = RetryPolicy(
            retries=retries,
            base_delay=policy.base_delay,
            factor=policy.factor,
            max_delay=policy.max_delay,
            jitter=policy.jitter,
        )
    return TaskDefinition(
        name=name or f"{func.__module__}.{func.__qualname__}",
        func=func,
        retry=policy,
        timeout=timeout,
        timeout_grace=timeout_grace,
        tags=frozenset(tags),
    )
