"""The baseline of the Python benchmarks: a round trip over a Unix socket pair to a thread
of the same process that echoes what it is sent."""

import socket
import threading


class EchoSocket:
    """``with EchoSocket() as echo: echo.round_trip()`` sends 32 bytes and waits for them
    back, with blocking reads on both sides."""

    def __enter__(self) -> "EchoSocket":
        self._a, self._b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._thread = threading.Thread(target=self._echo, daemon=True)
        self._thread.start()
        return self

    def _echo(self) -> None:
        while True:
            data = self._b.recv(64)
            if not data:
                return
            self._b.sendall(data)

    def round_trip(self) -> None:
        self._a.sendall(b"p" * 32)
        self._a.recv(64)

    def __exit__(self, *exc: object) -> None:
        self._a.close()
        self._thread.join()
        self._b.close()
