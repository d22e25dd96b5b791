"""TCP forwarders in front of the live server, for transfers that break or go wrong in transit: each
subclass decides what one direction's bytes become (`_pump`), the accepting and wiring is here once."""
from __future__ import annotations

import socket
import struct
import threading


def reset(s: socket.socket) -> None:
    """Close with RST: a socket only shut down still takes the server's bytes into its buffer until
    that is full, and the server's thread (and its database session) would then wait forever."""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()


class Forwarder:
    """Forwards every connection to the live server on `upstream` unchanged; both directions of one
    connection share the state `_connection()` makes. Subclasses set their own attributes before calling this
    constructor, which starts accepting at once."""

    def __init__(self, upstream: int):
        self.upstream, self.sockets = ("127.0.0.1", upstream), []
        self.listener = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _connection(self):
        return None

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self.sockets += [client, server]
            shared = self._connection()
            threading.Thread(target=self._pump, args=(client, server, shared, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, shared, True), daemon=True).start()

    def _pump(self, source, sink, shared, answers: bool):
        """One direction as it is; subclasses change or cut the bytes on the way."""
        try:
            while data := source.recv(1 << 16):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            reset(source)
            reset(sink)

    def close(self):
        """Stops accepting and resets every connection it carried: the server's threads for them end
        now, not when the worker that opened them stops."""
        self.listener.close()
        for s in self.sockets:
            reset(s)
