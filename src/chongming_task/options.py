"""``task.configure(...)``: when and in what order a task runs, checked where the user
hands the options over (docs/design.md, "When and in what order").

``SubmitOptions`` holds them, checked at once: a bad option is an ``InvalidValue`` naming
it, and nothing is stored. They never reach the task's function: ``ConfiguredTask``'s
``submit`` takes the function's own arguments only (``tasks``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Literal

from .errors import InvalidValue
from .limits import MAX_BUCKET_KEY, MAX_CONCURRENCY_KEY, MAX_DEDUPE_KEY, MAX_DURATION
from .values import check_bounded, check_tags

if TYPE_CHECKING:
    pass


__all__ = ["CELERY_NAMES", "CELERY_OPTIONS", "OnDuplicate", "SubmitOptions", "celery_hint"]

OnDuplicate = Literal["return", "raise"]
"""What a submit whose dedupe key is held gets: the holder's handle, or an error."""

_NO_TAGS: frozenset[str] = frozenset()

CELERY_NAMES = {
    "delay": "submit(*args, **kwargs)",
    "apply_async": "configure(delay=..., run_at=..., priority=...).submit(*args, **kwargs)",
    "retry": "raise chongming_task.Retry(after=...) inside the task",
    "s": "a Pipeline (chongming_task.Pipeline) for work that follows other work",
    "si": "a Pipeline (chongming_task.Pipeline) for work that follows other work",
    "signature": "a Pipeline (chongming_task.Pipeline) for work that follows other work",
}
"""The names of a Celery task's methods a user reaches for, and what does that here."""

CELERY_OPTIONS = {
    "countdown": "delay= (seconds from now): task.configure(delay=...).submit(...)",
    "eta": "run_at= (an aware datetime): task.configure(run_at=...).submit(...)",
}
"""The options Celery's ``apply_async`` takes that ours name otherwise."""


def celery_hint(word: str, *, option: bool = False) -> str:
    """`` (Celery's X: here ...)`` for a Celery method's name, or for its option's
    (``option``), else nothing."""
    found = (CELERY_OPTIONS if option else CELERY_NAMES).get(word)
    return "" if found is None else f" (Celery's {word}: here {found})"


PRIORITY_RANGE = range(-(2**31), 2**31)
"""What every store holds in its ``priority`` column (a 32-bit integer)."""


# Not frozen: a frozen dataclass sets each of its ten fields through object.__setattr__,
# 1.34 us a construction against 0.51 here, once a submit where each has its own key.
@dataclass(slots=True, kw_only=True)
class SubmitOptions:
    """How to submit: ``delay`` seconds from now or at ``run_at`` (an aware datetime),
    ``priority`` (higher first), ``dedupe_key`` (with ``on_duplicate`` and
    ``dedupe_window``), ``concurrency_key`` (its definition's ``max_per_key``),
    ``bucket_key`` and extra ``tags``. Read, never changed, once made."""

    delay: float | None = None
    run_at: datetime | None = None
    priority: int = 0
    dedupe_key: str | None = None
    on_duplicate: OnDuplicate = "return"
    dedupe_window: float | None = None
    concurrency_key: str | None = None
    bucket_key: str | None = None
    tags: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if self.delay is not None:
            delay = self.delay
            if isinstance(delay, bool) or not isinstance(delay, int | float):
                raise InvalidValue(f"delay must be a number of seconds, got {delay!r}")
            if not math.isfinite(delay) or not 0 <= delay <= MAX_DURATION:
                raise InvalidValue(
                    f"delay must be a finite number of seconds >= 0, at most "
                    f"{MAX_DURATION:,} (a century), got {delay!r}"
                )
            if self.run_at is not None:
                raise InvalidValue("give delay or run_at, not both")
        if self.run_at is not None:
            if not isinstance(self.run_at, datetime):
                raise InvalidValue(f"run_at must be a datetime, got {self.run_at!r}")
            if self.run_at.tzinfo is None or self.run_at.utcoffset() is None:
                raise InvalidValue(
                    f"run_at must be an aware datetime (with a time zone), got naive "
                    f"{self.run_at.isoformat()}"
                )
            if self.run_at.tzinfo is not UTC:  # stored as is: the snapshot's times are UTC
                try:
                    self.run_at = self.run_at.astimezone(UTC)
                except OverflowError:
                    raise InvalidValue(
                        f"run_at {self.run_at.isoformat()} is before year 1 in UTC"
                    ) from None
        priority = self.priority
        if priority != 0 or type(priority) is not int:  # the default costs one comparison
            if isinstance(priority, bool) or not isinstance(priority, int):
                raise InvalidValue(f"priority must be an int, got {priority!r}")
            if priority not in PRIORITY_RANGE:
                raise InvalidValue(
                    f"priority must fit in 32 bits (-2**31 to 2**31-1), got {priority}"
                )
        if self.dedupe_key is not None:  # the defaults cost one comparison each
            check_bounded(self.dedupe_key, "dedupe_key", MAX_DEDUPE_KEY)
        if self.on_duplicate not in ("return", "raise"):
            raise InvalidValue(
                f"on_duplicate must be 'return' or 'raise', got {self.on_duplicate!r}"
            )
        window = self.dedupe_window
        if window is not None:
            if isinstance(window, bool) or not isinstance(window, int | float):
                raise InvalidValue(f"dedupe_window must be a number of seconds, got {window!r}")
            if not math.isfinite(window) or not 0 < window <= MAX_DURATION:
                raise InvalidValue(
                    f"dedupe_window must be finite and > 0, at most {MAX_DURATION:,} "
                    f"seconds (a century), got {window!r}"
                )
            if self.dedupe_key is None:
                raise InvalidValue("dedupe_window needs a dedupe_key")
        if self.concurrency_key is not None:
            check_bounded(self.concurrency_key, "concurrency_key", MAX_CONCURRENCY_KEY)
        if self.bucket_key is not None:
            check_bounded(self.bucket_key, "bucket_key", MAX_BUCKET_KEY)
        tags = self.tags
        if tags:
            if isinstance(tags, str) or not all(isinstance(t, str) for t in tags):
                raise InvalidValue(f"tags must be an iterable of text, got {tags!r}")
            check_tags(tags, "tag", None)  # the store's rules are checked at submit
            if type(tags) is not frozenset:
                self.tags = frozenset(tags)
        elif type(tags) is not frozenset:
            self.tags = _NO_TAGS

    def stored(
        self, starts: datetime | None
    ) -> tuple[datetime | None, int, str | None, float | None, str | None]:
        """What a task submitted with these options stores: its run-at time (``starts``,
        from ``starts_at``, or a ``run_at`` already past), priority, dedupe key and
        window, and concurrency key."""
        return (
            starts or self.run_at,
            self.priority,
            self.dedupe_key,
            self.dedupe_window,
            self.concurrency_key,
        )

    def starts_at(self, now: datetime) -> datetime | None:
        """The time the task may start, from ``now`` (the node's clock): ``None`` for at
        once (no delay, or a time already past)."""
        if self.delay is not None:
            return now + timedelta(seconds=self.delay) if self.delay > 0 else None
        if self.run_at is not None and self.run_at > now:
            return self.run_at
        return None
