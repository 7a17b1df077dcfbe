"""Who may ask the dashboard anything: the host a request names, the origin a control
comes from, the access token, and how fast a client may guess it; and what ``web``'s
flags may set of these (``answered_hosts``). The headers every answer carries (no
framing, only the dashboard's own scripts) are here too.

- **Host.** A request must name a host the dashboard answers to: its bound address,
  ``localhost`` and the loopback addresses, or one the operator allowed
  (``--allowed-host``: a name, ``.example.com`` for a domain and its subdomains, ``*``
  for any). Anything else is 400: a page elsewhere whose name was made to resolve to
  127.0.0.1 (DNS rebinding) reaches the dashboard under its own name, and is refused.
- **Origin.** A control (any method but GET and HEAD) sent by a browser says where its
  page came from (``Origin``, ``Sec-Fetch-Site``); one from another origin is 403,
  whatever the cookies say. Clients that send neither (curl, scripts) still need the
  CSRF value and the token.
- **Token.** Compared as bytes in constant time (any text compares; none raises).
  A client that sends ``GUESSES`` wrong tokens in ``WINDOW`` seconds is answered 429
  until they age out, so guessing takes years, not seconds. A client is the address
  the request came from, or, from a proxy the operator named (``--trusted-proxy``),
  the address that proxy says it forwarded: forwarding headers from anyone else are
  ignored, so a guesser cannot pose as many clients. A strong token (``MIN_REMOTE_TOKEN``
  characters or more: required off loopback and behind a proxy) is looked at first and
  never refused: others' guesses from the same address cannot lock its holders out,
  and its length, not the limiter, is what keeps it from being guessed. A short one,
  allowed on loopback alone, is not even looked at while its client waits.
- **Cookies** get ``Secure`` when the request came over TLS, or from a trusted proxy
  that says it did (``X-Forwarded-Proto: https``).
"""

from __future__ import annotations

import hmac
import ipaddress
import re
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from ..errors import ConfigurationError
from ..limits import MIN_REMOTE_TOKEN

__all__ = [
    "LOOPBACK",
    "SECURITY_HEADERS",
    "Access",
    "answered_hosts",
    "host_allowed",
    "parse_host",
    "same_origin",
    "trusted_proxies",
]

LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})
"""The names a dashboard answers to wherever it is bound, besides those allowed."""
WILDCARD = frozenset({"0.0.0.0", "::", ""})
"""Addresses that bind every interface: no one name is the dashboard's."""
_HOST_NAME = re.compile(r"\.?[a-z0-9_]([a-z0-9_.:-]*[a-z0-9_])?")
"""A host name, an IP address, or ``.domain`` for a domain and its subdomains."""
GUESSES = 10
"""Wrong tokens one client may send within ``WINDOW`` seconds before it waits."""
WINDOW = 60.0
CLIENTS = 10_000
"""Clients whose wrong guesses are remembered (the oldest forgotten past it)."""

SECURITY_HEADERS = {
    # Only the dashboard's own scripts, styles and event stream; no page may frame it.
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'; "
        "object-src 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    # A first visit's ?token=... must not leave in a Referer to another site. (Not
    # no-referrer: with it, a browser posts a form with "Origin: null".)
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}


def answered_hosts(host: str, token: str | None, allowed: Iterable[str]) -> frozenset[str]:
    """The host names a dashboard bound at ``host`` answers to: the loopback names, its
    own address, and ``allowed``. ``ConfigurationError`` for a token or a binding that
    would leave it open: a blank token; off loopback, no token or one shorter than
    ``MIN_REMOTE_TOKEN``; every address bound and no name allowed."""
    if token is not None and not token.strip():
        raise ConfigurationError("--token (or CHONGMING_WEB_TOKEN) is blank: give a real one")
    if host not in LOOPBACK:
        if not token:
            raise ConfigurationError(
                f"--host {host} is reachable from other machines: give --token "
                "(or CHONGMING_WEB_TOKEN), or bind 127.0.0.1"
            )
        if len(token) < MIN_REMOTE_TOKEN:
            raise ConfigurationError(
                f"--token is {len(token)} characters: off loopback it needs "
                f"{MIN_REMOTE_TOKEN} or more (python -c 'import secrets; "
                "print(secrets.token_urlsafe(24))')"
            )
    names = {h.strip().lower().strip("[]") for h in allowed if h.strip()}
    if host in WILDCARD and not names:
        raise ConfigurationError(
            f"--host {host or '*'} answers on every address: name the host people open it "
            "by with --allowed-host (or '*' behind a proxy that checks it)"
        )
    bad = next((n for n in names if n != "*" and not _HOST_NAME.fullmatch(n)), None)
    if bad is not None:
        raise ConfigurationError(f"--allowed-host {bad!a} is no host name")
    bound = set() if host in WILDCARD else {host.lower().strip("[]")}
    return frozenset(LOOPBACK | bound | names)


def trusted_proxies(given: Iterable[str], token: str | None) -> list[str]:
    """The proxies whose forwarding headers are believed: addresses or networks
    (``127.0.0.1``, ``10.0.0.0/8``). ``ConfigurationError`` for anything else (``*``
    included: anyone could then pose as any client), and for a token shorter than
    ``MIN_REMOTE_TOKEN`` behind one (everyone who reaches the proxy reaches the
    dashboard)."""
    found: list[str] = []
    for item in given:
        item = item.strip()
        if not item:
            continue
        try:
            found.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            raise ConfigurationError(
                f"--trusted-proxy {item!a} is no address or network: name the proxy's "
                "address (127.0.0.1) or its network (10.0.0.0/8)"
            ) from None
    if found and (token is None or len(token) < MIN_REMOTE_TOKEN):
        raise ConfigurationError(
            f"behind a proxy the dashboard needs a token of {MIN_REMOTE_TOKEN}+ characters "
            "(CHONGMING_WEB_TOKEN or --token-file): everyone who reaches the proxy reaches it"
        )
    return found


def parse_host(value: str) -> tuple[str, int | None] | None:
    """A ``Host`` header's name (lower case, an IPv6 address without brackets) and port;
    ``None`` if it is no host."""
    value = value.strip().lower()
    if not value or any(c.isspace() or c in "/\\@?#" for c in value):
        return None
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ("" if not rest else None)
    else:
        name, colon, port_text = value.rpartition(":") if ":" in value else (value, "", "")
        if colon and ":" in name:
            return None  # an IPv6 address needs its brackets
    if port_text is None or not name:
        return None
    if not port_text:
        return name.rstrip("."), None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return None
    return name.rstrip("."), int(port_text)


def host_allowed(name: str, allowed: Iterable[str]) -> bool:
    """Whether ``name`` is one of ``allowed``: an exact name, ``.example.com`` for it and
    its subdomains, or ``*``."""
    for pattern in allowed:
        if pattern == "*" or pattern == name:
            return True
        if pattern.startswith(".") and (name == pattern[1:] or name.endswith(pattern)):
            return True
    return False


_DEFAULT_PORT = {"http": 80, "https": 443}


def same_origin(origin: str, host: str) -> bool:
    """Whether a browser's ``Origin`` is the origin whose ``Host`` header is ``host``: the
    same name, and the same port (a missing one being the scheme's default)."""
    try:
        parts = urlsplit(origin)
        origin_port = parts.port
    except ValueError:
        return False
    named = parse_host(host)
    if parts.scheme not in _DEFAULT_PORT or parts.hostname is None or named is None:
        return False
    default = _DEFAULT_PORT[parts.scheme]
    name, port = named
    return parts.hostname.rstrip(".") == name and (origin_port or default) == (port or default)


class Access:
    """The dashboard's checks of who asks, each answering in constant time."""

    def __init__(
        self,
        *,
        token: str | None,
        allowed_hosts: Iterable[str],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._token = None if token is None else token.encode("utf-8", "surrogatepass")
        self.strong = token is not None and len(token) >= MIN_REMOTE_TOKEN
        """Whether the token is long enough to be looked at before the limiter."""
        self.allowed_hosts = frozenset(h.lower() for h in allowed_hosts)
        self._clock = clock
        self._lock = threading.Lock()
        self._wrong: OrderedDict[str, deque[float]] = OrderedDict()

    @property
    def needs_token(self) -> bool:
        return self._token is not None

    def host_ok(self, host: str | None) -> bool:
        named = None if host is None else parse_host(host)
        return named is not None and host_allowed(named[0], self.allowed_hosts)

    def token_is(self, given: str | None) -> bool:
        """Whether ``given`` is the token (any text compares; a wrong one costs the same
        time whatever it holds)."""
        if self._token is None or given is None:
            return False
        return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), self._token)

    def waiting(self, client: str) -> float:
        """Seconds ``client`` must wait before its next token is even looked at (0: none)."""
        with self._lock:
            times = self._recent(client)
            if times is None or len(times) < GUESSES:
                return 0.0
            return max(0.0, times[0] + WINDOW - self._clock())

    def guessed_wrong(self, client: str) -> None:
        with self._lock:
            times = self._recent(client)
            if times is None:
                times = self._wrong[client] = deque(maxlen=GUESSES)
                if len(self._wrong) > CLIENTS:
                    self._wrong.popitem(last=False)
            times.append(self._clock())

    def _recent(self, client: str) -> deque[float] | None:
        times = self._wrong.get(client)
        if times is not None:
            now = self._clock()
            while times and times[0] + WINDOW <= now:
                times.popleft()
            if not times:
                del self._wrong[client]
                return None
        return times
