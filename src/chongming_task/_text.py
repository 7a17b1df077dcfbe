"""The one test of "is this str valid UTF-8 text": Python turns undecodable bytes (file
names, arguments, environment) into lone surrogates that no store can encode. Every
boundary asks this one function (values, queries, the CLI, the SQLite batch check)."""

from __future__ import annotations

__all__ = ["utf8_fault"]


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
