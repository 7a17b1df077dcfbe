"""Text at the edges: the one test of "is this str valid UTF-8 text" (Python turns
undecodable bytes of file names, arguments and the environment into lone surrogates that
no store can encode; every boundary asks ``utf8_fault``), and text made safe for a
terminal (``printable``: a task's name is anybody's text)."""

from __future__ import annotations

import re

__all__ = ["json_for_terminal", "printable", "utf8_fault"]


def utf8_fault(text: str) -> UnicodeEncodeError | None:
    """Why ``text`` is not UTF-8 (the encoder's error, naming the bad characters and
    where they are), or ``None``. ASCII, the common case, costs one C call."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc
    return None


# Control characters (C0, DEL, C1) and the bidirectional overrides that reorder what a
# terminal shows ("Trojan source"): a name holding them could retitle the terminal, move
# the cursor, split a table's row or disguise itself.
_DEL_C1_BIDI = "\x7f-\x9f\u202a-\u202e\u2066-\u2069"
_UNPRINTABLE = re.compile(f"[\x00-\x1f{_DEL_C1_BIDI}]")
_UNPRINTABLE_BUT_NEWLINE = re.compile(f"[\x00-\x09\x0b-\x1f{_DEL_C1_BIDI}]")


def _escaped(found: re.Match[str]) -> str:
    code = ord(found.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` safe to write to a terminal: every control character (and every bidi
    override) escaped as Python writes it (``\\x1b``), newlines too unless ``lines``.
    Printable text, the common case, is returned as it is after one C call."""
    if text.isprintable():
        return text
    return (_UNPRINTABLE_BUT_NEWLINE if lines else _UNPRINTABLE).sub(_escaped, text)


_BEYOND_JSON = re.compile(f"[{_DEL_C1_BIDI}]")


def json_for_terminal(text: str) -> str:
    """JSON text (``ensure_ascii=False``, which escapes C0 in strings already) with DEL,
    C1 controls and bidi overrides escaped too (``\\u009b``): still the same JSON."""
    if text.isascii() and "\x7f" not in text:
        return text
    return _BEYOND_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
