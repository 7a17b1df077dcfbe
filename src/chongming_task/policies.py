"""Policies: which bucket a key lands in, and how long to wait before a retry.

``BucketPolicy`` hashes with blake2b, never the built-in ``hash()``: CPython salts ``str``
hashes per process, so the same key would land in different buckets in different
processes, silently.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeAlias

from .errors import ConfigurationError
from .limits import MAX_BUCKETS

__all__ = ["DEFAULT_NUM_BUCKETS", "BucketPolicy", "RetryPolicy", "format_buckets", "parse_buckets"]

DEFAULT_NUM_BUCKETS = 64


class BucketPolicy:
    """Maps a business key to one of ``num_buckets`` buckets, the same everywhere.

    ``num_buckets`` is a deployment-wide agreement: nodes configured with different counts
    put the same key in different buckets without any error.
    """

    __slots__ = ("num_buckets",)

    def __init__(self, num_buckets: int = DEFAULT_NUM_BUCKETS) -> None:
        if (
            isinstance(num_buckets, bool)
            or not isinstance(num_buckets, int)
            or not 1 <= num_buckets <= MAX_BUCKETS
        ):
            raise ConfigurationError(
                f"num_buckets must be a whole number from 1 to {MAX_BUCKETS:,} "
                f"(chongming_task.limits), got {num_buckets!r}"
            )
        self.num_buckets = num_buckets

    def __repr__(self) -> str:
        return f"BucketPolicy(num_buckets={self.num_buckets})"

    def bucket_for(self, key: str) -> int:
        digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
        return int.from_bytes(digest, "big") % self.num_buckets

    def validate(self, buckets: Iterable[int]) -> frozenset[int]:
        """Return ``buckets`` as a set, or raise if any is outside ``0..num_buckets-1``."""
        out = frozenset(buckets)
        bad = sorted(
            b
            for b in out
            if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < self.num_buckets
        )
        if bad:
            raise self.out_of_range(format_buckets(bad))
        return out

    def out_of_range(self, buckets: str) -> ConfigurationError:
        """The error naming ``buckets`` (as ``format_buckets`` writes them) as outside
        ``0..num_buckets-1``."""
        return ConfigurationError(
            f"bucket(s) {buckets} out of range: with num_buckets="
            f"{self.num_buckets} buckets are 0..{self.num_buckets - 1}"
        )


def parse_buckets(spec: str, num_buckets: int) -> frozenset[int]:
    """Parse ``"0-15,20"`` into a bucket set, validated against ``num_buckets`` (each
    range before it is expanded: ``0-99999999999`` is an error, not a set to build)."""
    policy = BucketPolicy(num_buckets)
    buckets: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        if not part:
            raise ConfigurationError(f"empty item in bucket list {spec!r}")
        low, dash, high = part.partition("-")
        try:
            start = int(low)
            end = int(high) if dash else start
        except ValueError:
            raise ConfigurationError(
                f"bad bucket range {part!r} in {spec!r}: use numbers like 0-15,20"
            ) from None
        if end < start:
            raise ConfigurationError(f"bad bucket range {part!r}: {end} < {start}")
        if end >= num_buckets:  # said before the range is built
            bad = max(start, num_buckets)
            raise policy.out_of_range(str(bad) if bad == end else f"{bad}-{end}")
        buckets.update(range(start, end + 1))
    return frozenset(buckets)


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """Which failures are retried, how often and after how long: an exception that is
    one of ``retry_on`` (every ``Exception``, by default) and none of ``give_up_on`` is
    retried up to ``retries`` times; retry ``n`` waits about ``min(max_delay, base_delay
    * factor ** (n - 1))``, spread by ``±jitter`` (a fraction). A single exception class
    may be given for either."""

    retries: int = 0
    base_delay: float = 1.0
    factor: float = 2.0
    max_delay: float = 300.0
    jitter: float = 0.1
    retry_on: tuple[type[Exception], ...] = (Exception,)
    give_up_on: tuple[type[Exception], ...] = ()

    def __post_init__(self) -> None:
        for label in ("retry_on", "give_up_on"):
            object.__setattr__(self, label, exception_classes(label, getattr(self, label)))
        if self.retries < 0:
            raise ConfigurationError(f"retries must be >= 0, got {self.retries}")
        if self.base_delay < 0 or self.max_delay < 0 or self.factor < 1:
            raise ConfigurationError("backoff needs base_delay >= 0, max_delay >= 0, factor >= 1")
        if not 0 <= self.jitter <= 1:
            raise ConfigurationError(f"jitter is a fraction in 0..1, got {self.jitter}")

    def retries_on(self, exc: BaseException) -> bool:
        """Whether ``exc`` is worth another attempt (its count aside)."""
        return isinstance(exc, self.retry_on) and not isinstance(exc, self.give_up_on)

    def why_not(self, exc: BaseException) -> str:
        """Why ``exc`` is not retried, in words (``retries_on`` said no)."""
        if isinstance(exc, self.give_up_on):
            return f"not retried: {type(exc).__name__} is one of give_up_on"
        return f"not retried: {type(exc).__name__} is none of retry_on"

    def delay(self, retry: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (1-based)."""
        raw = min(self.max_delay, self.base_delay * self.factor ** max(0, retry - 1))
        spread = (rng or random).uniform(-self.jitter, self.jitter)
        return max(0.0, raw * (1.0 + spread))


ExceptionClasses: TypeAlias = "type[Exception] | tuple[type[Exception], ...]"
"""What ``retry_on`` and ``give_up_on`` take: one exception class, or a tuple of them."""


def exception_classes(label: str, given: object) -> tuple[type[Exception], ...]:
    """``given`` as a tuple of exception classes (one class alone is allowed);
    ``ConfigurationError`` naming ``label`` for anything else."""
    classes = given if isinstance(given, tuple) else (given,)
    for each in classes:
        if not (isinstance(each, type) and issubclass(each, Exception)):
            raise ConfigurationError(
                f"{label} takes exception classes (subclasses of Exception), got {each!r}"
            )
    return classes


def format_buckets(buckets: Iterable[int]) -> str:
    """``{0, 1, 2, 3, 20}`` -> ``"0-3,20"`` (the inverse of ``parse_buckets``)."""
    ordered = sorted(set(buckets))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)
