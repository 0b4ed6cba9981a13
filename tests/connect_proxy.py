"""A small, real HTTP CONNECT proxy for the client tests: does a client's request to an mTLS server go through a
proxy, as the library alone would send it, and does the client certificate reach the server through the tunnel?

In process and threaded, on 127.0.0.1 with a free port::

    with ConnectProxy() as proxy:
        session.get(url, proxies={"https": proxy.url})
        assert proxy.tunnels == ["localhost:8443"]

It answers ``CONNECT host:port`` with ``200 Connection established`` and then copies bytes both ways until either
side closes (the TLS inside is the client's and the server's: the proxy sees none of it). Anything but CONNECT gets
``405``, a target it cannot reach ``502``. Constructed with ``credentials="user:pass"`` it wants that
``Proxy-Authorization: Basic`` and answers ``407`` otherwise; with ``tls=`` (a server context) it is an HTTPS proxy,
the CONNECT itself sent inside TLS. Its threads are daemon threads; leaving the ``with`` block closes its listening
socket and every open tunnel, and waits (with a deadline) for its threads to end.
"""

from __future__ import annotations

import base64
import contextlib
import selectors
import socket
import ssl
import threading
import time
from types import TracebackType

__all__ = ["ConnectProxy"]

_HEAD_LIMIT = 64 * 1024  # a CONNECT request's head is a line and a few headers: anything longer is refused
_IDLE_TIMEOUT = 60.0  # no tunnel in a test is quiet this long: a stuck one ends rather than holding a thread


class ConnectProxy:
    """An HTTP CONNECT proxy on ``127.0.0.1``, started by ``with`` (or :meth:`start`), stopped at its end (or by
    :meth:`stop`).

    Args:
        credentials: ``"user:pass"``: CONNECTs without ``Proxy-Authorization: Basic`` of these are answered 407.
        tls: a server-side context: the proxy is an HTTPS proxy (:attr:`url` is ``https://``), its clients
            speak TLS to it before sending CONNECT.

    Attributes:
        url: ``http://127.0.0.1:PORT`` (``https://`` with ``tls``), without credentials.
        tunnels: the ``host:port`` targets it opened a tunnel to, in order: appended under a lock by its threads
            (before it answers 200, so complete once the client's request returns); a test may read or clear it.
        authorizations: the ``Proxy-Authorization`` header of every CONNECT it was sent (``None`` when there was
            none), refused or not, in order.
        active: how many tunnels are open now (one ends when either side closes: a client closing its pooled
            connections shows here).

    Example::

        with ConnectProxy(credentials="user:pass") as proxy:
            requests.get(url, proxies={"https": proxy.url_with_credentials})
            assert proxy.tunnels and proxy.authorizations[-1].startswith("Basic ")
    """

    def __init__(self, credentials: str | None = None, tls: ssl.SSLContext | None = None) -> None:
        self.credentials = credentials
        self.tls = tls
        self.tunnels: list[str] = []
        self.authorizations: list[str | None] = []
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()
        self._open: set[socket.socket] = set()
        self._stopping = False
        self._active = 0
        self._listener: socket.socket | None = None
        self._wake_r, self._wake_w = socket.socketpair()  # wakes the accept loop at stop
        self._acceptor: threading.Thread | None = None

    # -- what a test uses ---------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._listener is None:
            raise RuntimeError("the proxy is not started")
        return int(self._listener.getsockname()[1])

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (``https://`` when constructed with ``tls``)."""
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def url_with_credentials(self) -> str:
        """:attr:`url` with ``user:pass@`` in it (the client then sends ``Proxy-Authorization``).

        Raises:
            RuntimeError: constructed without ``credentials``.
        """
        if self.credentials is None:
            raise RuntimeError("ConnectProxy was constructed without credentials")
        scheme, rest = self.url.split("://", 1)
        return f"{scheme}://{self.credentials}@{rest}"

    @property
    def active(self) -> int:
        """How many tunnels are open now."""
        with self._lock:
            return self._active

    def start(self) -> ConnectProxy:
        """Listen on a free port of 127.0.0.1 and accept on a daemon thread. Returns the proxy."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        listener.setblocking(False)
        self._listener = listener
        self._acceptor = threading.Thread(target=self._accept_loop, name="connect-proxy-accept", daemon=True)
        self._acceptor.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Close the listening socket and every open tunnel, and wait up to ``timeout`` seconds for the threads.

        Raises:
            RuntimeError: a thread of the proxy did not end in time.
        """
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
            open_now = list(self._open)
        self._wake_w.send(b"x")
        for sock in open_now:
            # shutdown, not close: it wakes the thread blocked on this socket, which then closes it itself
            # (closing a descriptor another thread waits on wakes nobody on Linux).
            _shutdown(sock)
        deadline = time.monotonic() + timeout
        if self._acceptor is not None:
            self._acceptor.join(max(0.0, deadline - time.monotonic()))
        if self._acceptor is None or not self._acceptor.is_alive():  # nothing selects on them any more
            if self._listener is not None:
                self._listener.close()
            self._wake_r.close()
            self._wake_w.close()
        while True:
            with self._lock:
                alive = [thread for thread in self._threads if thread.is_alive()]
                if self._acceptor is not None and self._acceptor.is_alive():
                    alive.append(self._acceptor)
            if not alive:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"ConnectProxy: {len(alive)} thread(s) still running after {timeout}s")
            alive[0].join(max(0.0, min(0.1, deadline - time.monotonic())))

    def __enter__(self) -> ConnectProxy:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    # -- accepting ------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        assert self._listener is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while True:
                ready = [key.fileobj for key, _ in selector.select()]
                if self._wake_r in ready:
                    return
                try:
                    client, _ = self._listener.accept()
                except (BlockingIOError, InterruptedError):
                    continue  # another wake-up took it, or the client gave up
                except OSError:
                    return
                client.setblocking(True)
                thread = threading.Thread(target=self._serve, args=(client,), name="connect-proxy-tunnel", daemon=True)
                with self._lock:
                    if self._stopping:
                        client.close()
                        return
                    self._threads = {known for known in self._threads if known.is_alive()}
                    self._threads.add(thread)
                    self._open.add(client)
                thread.start()

    def _track(self, sock: socket.socket) -> bool:
        """Count ``sock`` among those :meth:`stop` shuts down; False (and closed) when the proxy is stopping."""
        with self._lock:
            if not self._stopping:
                self._open.add(sock)
                return True
        sock.close()
        return False

    def _forget(self, *socks: socket.socket) -> None:
        with self._lock:
            for sock in socks:
                self._open.discard(sock)
        for sock in socks:
            sock.close()

    # -- one client -----------------------------------------------------------------------------

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        established = False
        try:
            client.settimeout(_IDLE_TIMEOUT)
            if self.tls is not None:
                plain = client
                client = self.tls.wrap_socket(plain, server_side=True, do_handshake_on_connect=False)
                with self._lock:  # the wrapped socket owns the descriptor now: stop() shuts that one down
                    self._open.discard(plain)
                if not self._track(client):
                    return
                client.do_handshake()
            head, rest = _read_head(client)
            if head is None:
                return
            lines = head.decode("latin-1").split("\r\n")
            method, target = [*lines[0].split(" "), "", ""][:2]
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            if method.upper() != "CONNECT":
                _answer(client, "405 Method Not Allowed", "Allow: CONNECT\r\n")
                return
            authorization = headers.get("proxy-authorization")
            with self._lock:
                self.authorizations.append(authorization)
            if self.credentials is not None and authorization != _basic(self.credentials):
                _answer(client, "407 Proxy Authentication Required", 'Proxy-Authenticate: Basic realm="test"\r\n')
                return
            host, _, port = target.rpartition(":")
            try:
                upstream = socket.create_connection((host.strip("[]"), int(port)), timeout=10)
            except (OSError, ValueError):
                _answer(client, "502 Bad Gateway")
                return
            if not self._track(upstream):
                upstream = None
                return
            with self._lock:
                self.tunnels.append(target)
                self._active += 1
                established = True
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            if rest:
                upstream.sendall(rest)
            _splice(client, upstream)
        except (OSError, ValueError):
            pass  # a client or server gone mid-way, or the proxy stopping: the tunnel ends, as a real proxy's would
        finally:
            self._forget(client, *([upstream] if upstream is not None else []))
            if established:
                with self._lock:
                    self._active -= 1


def _basic(credentials: str) -> str:
    return "Basic " + base64.b64encode(credentials.encode()).decode("ascii")


def _read_head(sock: socket.socket) -> tuple[bytes | None, bytes]:
    """The request head up to the blank line, and what was read past it (the start of the tunnel's bytes)."""
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > _HEAD_LIMIT:
            _answer(sock, "431 Request Header Fields Too Large")
            return None, b""
        chunk = sock.recv(4096)
        if not chunk:
            return None, b""
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def _answer(sock: socket.socket, status: str, headers: str = "") -> None:
    sock.sendall(f"HTTP/1.1 {status}\r\n{headers}Content-Length: 0\r\nConnection: close\r\n\r\n".encode())


def _receive(sock: socket.socket) -> bytes:
    data = sock.recv(65536)
    # An SSL socket may hold decrypted bytes the selector cannot see: take them now, or they wait for more traffic.
    while data and isinstance(sock, ssl.SSLSocket) and sock.pending():
        data += sock.recv(sock.pending())
    return data


def _splice(client: socket.socket, upstream: socket.socket) -> None:
    """Copy bytes both ways until either side closes (or errs, or is quiet for ``_IDLE_TIMEOUT``)."""
    peer = {client: upstream, upstream: client}
    with selectors.DefaultSelector() as selector:
        selector.register(client, selectors.EVENT_READ)
        selector.register(upstream, selectors.EVENT_READ)
        while True:
            ready = selector.select(_IDLE_TIMEOUT)
            if not ready:
                return
            for key, _ in ready:
                source = key.fileobj
                assert isinstance(source, socket.socket)
                data = _receive(source)
                if not data:
                    return
                peer[source].sendall(data)


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed by its thread, or never connected
        sock.shutdown(socket.SHUT_RDWR)
