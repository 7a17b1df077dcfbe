"""What a ``--db`` value names, how to print it without its secrets, and which
PostgreSQL schema names a store may use.

A PostgreSQL DSN comes in libpq's two forms: a URL (``postgresql://`` or
``postgres://``) and key=value words (``host=db dbname=ops password=...``). Both are
parsed as libpq parses them (psycopg's ``conninfo_to_dict``, where the driver is
installed; a parser of the same rules otherwise), and shown as
``postgresql://user@host:port/dbname``: a password, wherever it was written (after the
user, as ``?password=``, as ``password=``), never appears, nor any other parameter.
Any other ``scheme://`` is refused by name; everything else is a SQLite path.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qsl, unquote

from ..errors import ConfigurationError
from ..limits import MAX_SCHEMA_NAME

__all__ = [
    "IDENTIFIER",
    "check_schema_name",
    "check_target",
    "is_postgres_dsn",
    "password_of",
    "shown_dsn",
    "where_of",
]

_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://")
_POSTGRES_SCHEMES = ("postgresql", "postgres")
# libpq's connection keywords: a value starting with one of them and "=" is key=value.
_KEYWORDS = (
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "passfile",
    "channel_binding",
    "connect_timeout",
    "client_encoding",
    "options",
    "application_name",
    "fallback_application_name",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
    "replication",
    "gssencmode",
    "sslmode",
    "requiressl",
    "sslcompression",
    "sslcert",
    "sslkey",
    "sslpassword",
    "sslcertmode",
    "sslrootcert",
    "sslcrl",
    "sslcrldir",
    "sslsni",
    "requirepeer",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "krbsrvname",
    "gsslib",
    "gssdelegation",
    "service",
    "target_session_attrs",
    "load_balance_hosts",
)
_KEY_VALUE = re.compile(r"^\s*(?:" + "|".join(_KEYWORDS) + r")\s*=")


def is_postgres_dsn(target: str | Path) -> bool:
    """A PostgreSQL DSN in either of libpq's forms."""
    if not isinstance(target, str):
        return False
    found = _URL.match(target)
    if found is not None:
        return found["scheme"].lower() in _POSTGRES_SCHEMES
    return _KEY_VALUE.match(target) is not None


def check_target(target: str | Path) -> None:
    """``ConfigurationError`` for a URL of a scheme no store speaks (``mysql://``)."""
    if isinstance(target, str):
        found = _URL.match(target)
        if found is not None and found["scheme"].lower() not in _POSTGRES_SCHEMES:
            raise ConfigurationError(
                f"unsupported scheme {found['scheme']}: give a SQLite file path or a "
                "postgresql:// DSN"
            )


def password_of(target: str) -> str | None:
    """The password a PostgreSQL DSN carries, wherever it is written in it (``None``
    for none, for a DSN that does not parse, and for a SQLite path)."""
    if not is_postgres_dsn(target):
        return None
    try:
        return _parsed(target).get("password") or None
    except ValueError:
        return None


def shown_dsn(dsn: str) -> str:
    """``dsn`` safe to print: ``postgresql://user@host:port/dbname``, nothing else of it.
    A DSN that does not parse shows as ``postgresql://(unparsable DSN)``."""
    try:
        info = _parsed(dsn)
    except ValueError:
        return "postgresql://(unparsable DSN)"
    user = info.get("user")
    return f"postgresql://{user + '@' if user else ''}{where_of(info)}"


def where_of(info: dict[str, str]) -> str:
    """``host:port/dbname`` of a parsed DSN (``conninfo_to_dict``'s), safe to print."""
    host = info.get("host") or info.get("hostaddr") or "localhost"
    if "@" in host:  # libpq ends the user part at the first "@": the rest of a password
        host = "***" + host[host.rindex("@") :]  # with an "@" in it (write it %40)
    if ":" in host and "," not in host:
        host = f"[{host}]"  # an IPv6 address
    port = info.get("port")
    return f"{host}:{port}/{info.get('dbname', '')}" if port else f"{host}/{info.get('dbname', '')}"


def _parsed(dsn: str) -> dict[str, str]:
    """libpq's reading of ``dsn`` (``ValueError`` if it does not parse)."""
    try:
        from psycopg import conninfo
    except ImportError:
        return _parse_url(dsn) if _URL.match(dsn) else _parse_words(dsn)
    try:
        return {k: str(v) for k, v in conninfo.conninfo_to_dict(dsn).items() if v is not None}
    except Exception as exc:  # psycopg.ProgrammingError: its text may quote the DSN
        raise ValueError("the DSN does not parse") from exc


def _parse_url(dsn: str) -> dict[str, str]:
    """libpq's URL rules: the user part ends at the first ``@`` before any ``/``."""
    rest = dsn.split("://", 1)[1]
    info: dict[str, str] = {}
    stop = next((i for i, c in enumerate(rest) if c in "@/"), len(rest))
    if stop < len(rest) and rest[stop] == "@":
        user = rest[:stop].split(":", 1)[0]
        if user:
            info["user"] = unquote(user)
        rest = rest[stop + 1 :]
    rest, _, query = rest.partition("?")
    netloc, _, dbname = rest.partition("/")
    if netloc.startswith("["):  # an IPv6 address
        host, _, port = netloc[1:].partition("]")
        port = port.lstrip(":")
    else:
        host, _, port = netloc.rpartition(":") if ":" in netloc else (netloc, "", "")
    if host:
        info["host"] = unquote(host)
    if port:
        info["port"] = port
    if dbname:
        info["dbname"] = unquote(dbname)
    for key, value in parse_qsl(query, keep_blank_values=True):
        info[key] = value
    return info


def _parse_words(dsn: str) -> dict[str, str]:
    """libpq's key=value rules: values bare, or in single quotes with ``\\`` escapes."""
    info: dict[str, str] = {}
    i, n = 0, len(dsn)
    while True:
        while i < n and dsn[i].isspace():
            i += 1
        if i >= n:
            return info
        eq = dsn.find("=", i)
        if eq < 0:
            raise ValueError("missing '='")
        key = dsn[i:eq].strip()
        i = eq + 1
        while i < n and dsn[i].isspace():
            i += 1
        value: list[str] = []
        if i < n and dsn[i] == "'":
            i += 1
            while True:
                if i >= n:
                    raise ValueError("unterminated quoted string")
                if dsn[i] == "\\" and i + 1 < n:
                    value.append(dsn[i + 1])
                    i += 2
                elif dsn[i] == "'":
                    i += 1
                    break
                else:
                    value.append(dsn[i])
                    i += 1
        else:
            while i < n and not dsn[i].isspace():
                if dsn[i] == "\\" and i + 1 < n:
                    value.append(dsn[i + 1])
                    i += 2
                else:
                    value.append(dsn[i])
                    i += 1
        info[key] = "".join(value)


IDENTIFIER = re.compile(rf"[a-z_][a-z0-9_]{{0,{MAX_SCHEMA_NAME - 1}}}")
"""What a schema name must match in full (it is written into statements, and into two
channel names of at most 63 bytes)."""
_RESERVED = re.compile(r"pg_.*|information_schema")


def check_schema_name(schema: object) -> str:
    """``schema`` if it may name the store's schema; else ``ConfigurationError``: it must
    match ``[a-z_][a-z0-9_]*`` in full, within ``MAX_SCHEMA_NAME`` characters, and not
    be one of PostgreSQL's own (``pg_*``, ``information_schema``)."""
    if not isinstance(schema, str) or IDENTIFIER.fullmatch(schema) is None:
        raise ConfigurationError(
            f"schema name {schema!r} must be [a-z_][a-z0-9_]* in full, of at most "
            f"{MAX_SCHEMA_NAME} characters"
        )
    if _RESERVED.fullmatch(schema):
        raise ConfigurationError(
            f"schema name {schema!r} is PostgreSQL's own (pg_*, information_schema): "
            "choose a schema of chongming-task's own"
        )
    return schema
