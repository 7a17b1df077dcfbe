"""A TCP proxy a test can cut and heal: one node's road to the database server, so the
node is cut off while the others stay connected (a network partition, not an outage).
``deafen()`` first makes every commit in flight one nobody hears: the server still gets
what the client sends, and does it, but its answers are dropped until the cut."""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading


class Proxy:
    """Forwards ``127.0.0.1:port`` to ``target``. ``cut()`` drops every connection and
    refuses new ones; ``heal()`` lets them through again. ``deafen()`` drops what the
    server sends, until the next ``cut()``."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._cut = False
        self._closed = False
        self._deaf = False
        self._deaf_after: bytes | None = None
        self._thread = threading.Thread(target=self._accept, name="test-proxy", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                refused = self._cut or self._closed
            if refused:
                client.close()
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, server))
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        sel.register(a, selectors.EVENT_READ, (b, False))
        sel.register(b, selectors.EVENT_READ, (a, True))
        try:
            while True:
                for key, _ in sel.select(timeout=0.05):
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                    if not data:
                        return
                    to, from_server = key.data
                    marker = self._deaf_after
                    if not from_server and marker is not None and marker in data:
                        self._deaf = True  # what answers this is dropped
                    if not (from_server and self._deaf):
                        to.sendall(data)
                with self._lock:
                    if self._cut or self._closed:
                        return
        except OSError:
            return
        finally:
            sel.close()
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def deafen(self, *, after: bytes | None = None) -> None:
        """Drop what the server sends from now until the next ``cut()``: statements in
        flight, and any sent meanwhile, are carried out unheard. ``after``: only once a
        client has sent these bytes (``b"COMMIT"``: the commit of a transaction of
        several statements is what goes unheard)."""
        with self._lock:
            if after is None:
                self._deaf = True
            else:
                self._deaf_after = after

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            self._deaf = False
            self._deaf_after = None
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for s in pair:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def heal(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self.cut()
        self._listener.close()
        self._thread.join(5)
