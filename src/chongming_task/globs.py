"""Task-name globs, the one name filter of the CLI, the dashboard and ``TaskQuery``:
``*`` any run of characters, ``?`` one character, ``[abc]``, ``[a-z]`` and ``[!abc]`` a
set, as ``fnmatch.fnmatchcase`` (case-sensitive). A glob without wildcards is an exact
name. Each SQL store is handed the same glob in its own spelling: SQLite's ``GLOB`` and
PostgreSQL's regular expressions."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Glob", "parse"]

_Part = str | tuple[bool, str]
"""A literal character, ``"*"``/``"?"`` as wildcards (a literal ``*`` or ``?`` is a set
of one), or a set: (negated, its members as written)."""


@dataclass(frozen=True, slots=True)
class Glob:
    pattern: str
    parts: tuple[_Part, ...]

    @property
    def exact(self) -> bool:
        """Whether the glob has no wildcard: it names one name."""
        return all(isinstance(p, str) and p not in "*?" for p in self.parts)

    @property
    def head(self) -> str:
        """The literal text every match starts with (an index can find it)."""
        head = []
        for part in self.parts:
            if not isinstance(part, str) or part in "*?":
                break
            head.append(part)
        return "".join(head)

    def sqlite(self) -> str:
        """The glob for SQLite's ``GLOB`` (a set is negated by ``^`` there, not ``!``)."""
        out = []
        for part in self.parts:
            if isinstance(part, str):
                out.append("[[]" if part == "[" else part)
            else:
                negated, members = part
                if not negated and members == "^":
                    out.append("^")  # a literal outside a set; inside, first, it negates
                    continue
                if not negated and members.startswith("^"):
                    members = members[1:] + "^"
                out.append("[" + ("^" if negated else "") + members + "]")
        return "".join(out)

    def regex(self) -> str:
        """The glob as an anchored regular expression PostgreSQL's ``~`` reads."""
        out = ["^"]
        for part in self.parts:
            if part == "*":
                out.append(".*")
            elif part == "?":
                out.append(".")
            elif isinstance(part, str):
                out.append(part if part.isalnum() or part == "_" else "\\" + part)
            else:
                out.append(_set_regex(*part))
        out.append("$")
        return "".join(out)


_NOTHING = "[^\x01-\U0010ffff]"
"""A set no stored name's character is in (PostgreSQL text holds no NUL)."""


def _set_regex(negated: bool, members: str) -> str:
    """A set as a bracket expression, each member escaped. A reversed range (``z-a``)
    holds nothing, as ``fnmatch`` reads it (PostgreSQL would refuse the expression): a
    set left empty matches no character, or any one when negated."""
    items: list[str] = []
    i, n = 0, len(members)
    while i < n:
        if i + 2 < n and members[i + 1] == "-":
            low, high = members[i], members[i + 2]
            i += 3
            if low <= high:
                items.append(_escaped(low) + "-" + _escaped(high))
        else:
            items.append(_escaped(members[i]))
            i += 1
    if not items:
        return "." if negated else _NOTHING
    return "[" + ("^" if negated else "") + "".join(items) + "]"


def _escaped(ch: str) -> str:
    return "\\" + ch if ch in "\\[]^-" else ch


def parse(pattern: str) -> Glob:
    """``pattern`` as ``fnmatch`` reads it: a ``[`` that opens no set is a literal."""
    parts: list[_Part] = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        i += 1
        if ch in "*?":
            if not (ch == "*" and parts and parts[-1] == "*"):
                parts.append(ch)
        elif ch == "[":
            j = i
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            end = pattern.find("]", j)
            if end < 0:
                parts.append("[")
                continue
            members = pattern[i:end]
            negated = members.startswith("!")
            parts.append((negated, members[1:] if negated else members))
            i = end + 1
        else:
            parts.append(ch)
    return Glob(pattern, tuple(parts))
