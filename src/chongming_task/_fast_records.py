"""Fast builders for the frozen records of ``model``: the one place the records' speed
tricks live.

Every transition copies a ``TaskSnapshot`` and makes a ``Transition``, and every row a
store reads becomes one. The builders here are generated once, at import, for a class
and a set of fields: a function that fills an instance of a mutable twin of the class
(the same slots, in the same order), whose attribute stores the interpreter does in one
step each where a frozen class's are a descriptor call apiece, and then switches the
instance's class to the frozen one (the layouts are the same, so Python allows it).
Each checks only what changes: a datetime given made UTC (a naive one refused), tags
given made a frozenset.

Why: with the plain forms instead (``dataclasses.replace`` and the records' own
constructors), measured side by side with ``bench/throughput_then_now.py`` (4 rounds),
the in-memory row ran at 0.51x, SQLite per call at 0.72x and ``submit_many`` at 0.79x.
A ``dataclasses.replace`` of a snapshot costs 4.2 us, a generated change 0.4 us.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

__all__ = ["make_builder", "make_changer", "make_evolver"]

Utc = Callable[[datetime, str], datetime]


def _given(name: str, times: tuple[str, ...], indent: str = "    ") -> list[str]:
    """Lines storing the changed field ``name`` into ``new``, checked as a change is: a
    datetime made UTC (a naive one refused), tags made a frozenset."""
    if name in times:
        return [
            f"{indent}if {name} is None or {name}.tzinfo is _UTC:",
            f"{indent}    new.{name} = {name}",
            f"{indent}else:",
            f"{indent}    new.{name} = _utc({name}, {name!r})",
        ]
    if name == "tags":
        return [f"{indent}new.tags = tags if isinstance(tags, frozenset) else frozenset(tags)"]
    return [f"{indent}new.{name} = {name}"]


def _compile(
    cls: type, names: tuple[str, ...], lines: list[str], function: str, **scope: Any
) -> Any:
    """Define ``function`` from ``lines``, which fill ``new`` (an instance of the
    mutable twin of ``cls``); once filled, ``new`` becomes a ``cls``."""
    twin = type(f"_Mutable{cls.__name__}", (), {"__slots__": names})
    scope.update(_new=object.__new__, _twin=twin, _cls=cls)
    exec("\n".join([*lines, "    new.__class__ = _cls", "    return new"]), scope)
    return scope[function]


def make_evolver(
    cls: type, names: tuple[str, ...], times: tuple[str, ...], *, utc: Utc, zone: Any
) -> Any:
    """``evolve``, unrolled for ``cls``: one keyword parameter per field (an unknown name
    is Python's own ``TypeError``), each slot copied unless given; a given datetime made
    UTC (``zone``; a naive one refused by ``utc``), given tags a frozenset."""
    lines = [f"def evolve(self, *, {', '.join(f'{n}=_KEEP' for n in names)}):"]
    lines.append("    new = _new(_twin)")
    for name in names:
        lines += [f"    if {name} is _KEEP:", f"        new.{name} = self.{name}", "    else:"]
        lines += _given(name, times, indent="        ")
    evolve = _compile(cls, names, lines, "evolve", _KEEP=object(), _UTC=zone, _utc=utc)
    evolve.__doc__ = (
        "``dataclasses.replace`` for the hot path (every transition makes one): copies "
        "the slots and checks only the fields that change."
    )
    evolve.__qualname__ = f"{cls.__name__}.evolve"
    return evolve


def make_changer(
    cls: type,
    names: tuple[str, ...],
    changed: tuple[str, ...],
    times: tuple[str, ...],
    *,
    utc: Utc,
    zone: Any,
) -> Callable[..., Any]:
    """``evolve`` made for one set of changed fields, their values given positionally
    in ``changed``'s order: no field tested, no keyword parsed (half the work)."""
    unknown = set(changed) - set(names)
    if unknown or len(set(changed)) != len(changed):
        raise ValueError(f"not a set of {cls.__name__} fields: {changed!r}")
    lines = [f"def change(self, {', '.join(changed)}):", "    new = _new(_twin)"]
    for name in names:
        if name in changed:
            lines += _given(name, times)
        else:
            lines.append(f"    new.{name} = self.{name}")
    change = _compile(cls, names, lines, "change", _UTC=zone, _utc=utc)
    change.__qualname__ = f"change({changed!r})"
    return change  # type: ignore[no-any-return]


def make_builder(
    cls: type,
    names: tuple[str, ...],
    *,
    positional: tuple[str, ...] | None = None,
    fixed: Mapping[str, str] | None = None,
) -> Any:
    """A constructor of ``cls`` that skips validation, for values already normalised
    (UTC datetimes, frozenset tags). Keyword-only over ``names``, or positional over
    ``positional`` with every other field set by ``fixed`` (an expression over the
    parameters) or ``None``: a call with nineteen keywords cost more in matching them to
    parameters than in building the record (1.19 against 0.43 us, every submit)."""
    if positional is None:
        lines = [f"def build(*, {', '.join(names)}):", "    new = _new(_twin)"]
        lines += [f"    new.{name} = {name}" for name in names]
    else:
        lines = [f"def build({', '.join(positional)}):", "    new = _new(_twin)"]
        for name in names:
            value = name if name in positional else (fixed or {}).get(name, "None")
            lines.append(f"    new.{name} = {value}")
    return _compile(cls, names, lines, "build")
