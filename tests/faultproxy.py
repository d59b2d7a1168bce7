"""A TCP proxy to the test PostgreSQL that loses the answer to a COMMIT, on demand.

Armed, it passes the next ``COMMIT`` to the server, lets the server commit it, and drops both
connections before the answer reaches the client: the one failure a client cannot tell from
a transaction that never committed. The server is real; only the wire between is cut.
"""

from __future__ import annotations

import socket
import threading
import time


class CommitAnswerLost:
    """Listen on a free loopback port and forward every connection to ``target``."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.armed = threading.Event()
        self.dropped = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        """Stop accepting connections."""
        self._closing = True
        self._listener.close()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            held = threading.Event()  # set once a COMMIT went up: no answer comes back down
            threading.Thread(target=self._up, args=(client, upstream, held), daemon=True).start()
            threading.Thread(target=self._down, args=(upstream, client, held), daemon=True).start()

    def _up(self, client: socket.socket, upstream: socket.socket, held: threading.Event) -> None:
        try:
            while data := client.recv(65536):
                commit = self.armed.is_set() and data[:1] == b"Q" and b"COMMIT" in data.upper()
                if commit:
                    self.armed.clear()
                    held.set()
                upstream.sendall(data)
                if commit:
                    time.sleep(0.5)  # the server commits; its answer is swallowed by _down
                    break
        except OSError:
            pass
        for sock in (client, upstream):
            _close(sock)
        if held.is_set():
            self.dropped.set()

    def _down(self, upstream: socket.socket, client: socket.socket, held: threading.Event) -> None:
        try:
            while data := upstream.recv(65536):
                if not held.is_set():
                    client.sendall(data)
        except OSError:
            pass


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
