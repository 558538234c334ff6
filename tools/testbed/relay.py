"""A TCP relay that records every byte it carries: what someone on the path between a
client and a published port sees (tests of what crosses the network in clear)."""

from __future__ import annotations

import contextlib
import socket
import threading

from tools.testbed.broker import free_port

__all__ = ["Relay"]


class Relay:
    """Listens on a free loopback port and relays each connection to (host, port),
    keeping the bytes of both directions in ``seen``."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = free_port()
        self._lock = threading.Lock()
        self._seen = bytearray()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def seen(self) -> bytes:
        with self._lock:
            return bytes(self._seen)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=30)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                with self._lock:
                    self._seen += data
                sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
