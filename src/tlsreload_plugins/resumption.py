"""Connections whose handshake refuses a session resumed from before a change of what the server trusts.

A resumed TLS session skips certificate verification, and OpenSSL resumes from the session cache and ticket keys of
the context a connection was *created* on. A connection created before the client-CA bundle or its CRLs changed,
whose ClientHello arrives after the change (a straddler), would resume a session made under the old trust. Its
full handshake is harmless once the ClientHello callback has moved it onto the newest context (the client
certificate is then verified against the newest CA store and CRLs); only a resumed session must be refused.

Whether a session was resumed is known only once the handshake has completed, so the contexts connections are
created on get connection classes (:attr:`ssl.SSLContext.sslsocket_class`, :attr:`ssl.SSLContext.sslobject_class`)
whose ``do_handshake`` checks it before returning: a straddler's resumed session raises :class:`ssl.SSLError` and
the connection is closed before the server reads a byte of it. Their ``read``, ``write`` and ``send`` run
``do_handshake`` first while the handshake is not done, so a server that lets the first read make the handshake
(gunicorn's ``sync`` worker) goes through the same check. A straddler whose handshake is not run by such a
``do_handshake`` (a connection class of someone else's) is refused at its ClientHello instead.

The same check refuses a peer whose SPIFFE ID a context's :class:`~tlsreload_plugins.authorization.Authorizer` does
not accept (:func:`authorize_peers`), on either side: a server's client, a client's server. A resumed session is
judged by the certificate it was made with, which OpenSSL keeps with the session: a peer whose ID has left the
accepted set is refused on its next handshake, resumed or not.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import weakref
from collections.abc import Callable
from typing import Any, ParamSpec

from tlsreload_plugins.authorization import Authorizer

__all__ = [
    "Straddled",
    "Unauthorized",
    "authorize_peers",
    "authorized",
    "authorizer_of",
    "check_handshakes",
    "refuse_if_resumed",
]

P = ParamSpec("P")

log: logging.Logger = logging.getLogger("tlsreload_plugins.resumption")


class Straddled(ssl.SSLError):
    """A session resumed on a connection created before a change of what the server trusts: refused."""


class Unauthorized(ssl.SSLError):
    """A peer whose SPIFFE ID the context's authorizer does not accept: refused in its handshake."""


_authorizers: weakref.WeakKeyDictionary[ssl.SSLContext, Authorizer] = weakref.WeakKeyDictionary()
"""The authorizer of each context whose connections check their peer's SPIFFE ID (:func:`authorize_peers`)."""


class _HandshakeChecked:
    """What the checking connection classes add to a connection class (first in their bases)."""

    _tlsreload_in_handshake = False
    """Whether the handshake runs inside this class's ``do_handshake`` now (the ClientHello callback asks)."""
    _tlsreload_straddler = False
    """Whether the ClientHello callback found the connection created on a context of an older trust."""
    _tlsreload_done = False
    """Whether the handshake has completed and passed the check: reads and writes go straight through."""
    _tlsreload_refused = False

    _tlsreload_on_refused: Callable[[], object] | None = None
    """Called when the check refuses a straddler's resumed session (see :func:`refuse_if_resumed`)."""

    def do_handshake(self, *args: Any, **kwargs: Any) -> Any:
        if self._tlsreload_refused:
            raise Straddled(ssl.SSL_ERROR_SSL, "the handshake was refused")
        created_on = self.context  # type: ignore[attr-defined]  # a ClientHello callback may move it
        self._tlsreload_in_handshake = True
        try:
            result = super().do_handshake(*args, **kwargs)  # type: ignore[misc]
        finally:
            self._tlsreload_in_handshake = False
        if self._tlsreload_straddler and self.session_reused:  # type: ignore[attr-defined]
            log.debug("refused a TLS session resumed on a connection created before the trust changed")
            self._tlsreload_refuse(self._tlsreload_on_refused)
            raise Straddled(ssl.SSL_ERROR_SSL, "a session resumed across a trust change was refused")
        authorizer = _authorizers.get(self.context) or _authorizers.get(created_on)  # type: ignore[attr-defined]
        if authorizer is not None:
            peer = self.getpeercert()  # type: ignore[attr-defined]  # a resumed session's: the one it was made with
            reason = authorizer.refusal(peer)
            if reason is not None:
                side = "the server" if self.server_side else "the client"  # type: ignore[attr-defined]
                self._tlsreload_refuse(lambda: authorizer.count_refusal(peer, reason, side))
                raise Unauthorized(ssl.SSL_ERROR_SSL, f"SPIFFE authorization refused the peer: {reason}")
        self._tlsreload_done = True
        return result

    def _tlsreload_refuse(self, on_refused: Callable[[], object] | None) -> None:
        """Refuse the connection whose handshake just completed: reads and writes fail from now on."""
        self._tlsreload_refused = True
        if on_refused is not None:
            on_refused()
        # A socket is shut down, not closed: the peer sees the end at once, and the descriptor stays the server's
        # to close on the error. Closed here, its number could go to the next accepted connection while the server
        # still watches it for this one (Tornado: "fd added twice", and that connection lost). An SSLObject's
        # transport is closed by its server on the error.
        shutdown = getattr(self, "shutdown", None)
        if shutdown is not None:
            with contextlib.suppress(OSError):  # the peer went first
                shutdown(socket.SHUT_RDWR)

    def _tlsreload_handshake_first(self) -> None:
        # A read or write before the handshake completed would make it inside OpenSSL, unchecked.
        if not self._tlsreload_done:
            self.do_handshake()

    def read(self, *args: Any, **kwargs: Any) -> Any:
        self._tlsreload_handshake_first()
        return super().read(*args, **kwargs)  # type: ignore[misc]

    def write(self, *args: Any, **kwargs: Any) -> Any:
        self._tlsreload_handshake_first()
        return super().write(*args, **kwargs)  # type: ignore[misc]


class _SocketChecked(_HandshakeChecked):
    """What the checking socket classes add: ``send`` writes without ``write`` (CPython's, gevent's)."""

    def send(self, *args: Any, **kwargs: Any) -> Any:
        self._tlsreload_handshake_first()
        return super().send(*args, **kwargs)  # type: ignore[misc]


_checking: dict[type, type] = {}
"""The checking subclass made for each connection class (gevent's SSLContext has its own socket class)."""
_checking_lock = threading.Lock()


def _checking_class(base: type, mixin: type) -> type:
    if issubclass(base, _HandshakeChecked):
        return base
    with _checking_lock:
        made = _checking.get(base)
        if made is None:
            made = _checking[base] = type(f"HandshakeChecked{base.__name__}", (mixin, base), {})
        return made


def check_handshakes(context: ssl.SSLContext) -> None:
    """Have the connections ``context`` creates check, once their handshake completed, that a straddler did not
    resume a session (see :func:`refuse_if_resumed`): its connection classes become checking subclasses of its
    current ones (made once per class). Idempotent; quick.

    Args:
        context: a context connections are created on (a reloader's newest, Sanic's certificate selector).

    Example::

        context = recipe()
        check_handshakes(context)
        create_connections_on(server_context, lambda: context)
    """
    socket_class = context.sslsocket_class
    if not issubclass(socket_class, _HandshakeChecked):
        context.sslsocket_class = _checking_class(socket_class, _SocketChecked)
    object_class = context.sslobject_class
    if not issubclass(object_class, _HandshakeChecked):
        context.sslobject_class = _checking_class(object_class, _HandshakeChecked)


def refuse_if_resumed(conn: Any, on_refused: Callable[[], object] | None = None) -> bool:
    """For a ClientHello callback that found ``conn`` created on a context of an older trust (a straddler): have
    its handshake refuse it if it resumes a session, once the handshake completed, before a byte is read.

    Args:
        conn: the connection the ClientHello callback was given (an SSLObject or SSLSocket).
        on_refused: called, in the thread making the handshake, if its resumed session is refused (to count it).

    Returns:
        ``True`` when its handshake will be checked so (the callback may move it onto the newest context, where a
        full handshake is verified against the newest trust); ``False`` when its handshake does not run inside a
        checking ``do_handshake`` (another connection class): the callback must refuse it itself.

    Example::

        if straddler and not refuse_if_resumed(conn):
            return ssl.ALERT_DESCRIPTION_HANDSHAKE_FAILURE
    """
    if not isinstance(conn, _HandshakeChecked) or not conn._tlsreload_in_handshake:
        return False
    conn._tlsreload_straddler = True
    conn._tlsreload_on_refused = on_refused
    return True


def authorize_peers(context: ssl.SSLContext, authorizer: Authorizer, *, server_side: bool) -> ssl.SSLContext:
    """Have every connection ``context`` creates, and every connection a ClientHello callback moves onto it, refuse
    in its handshake a peer whose SPIFFE ID ``authorizer`` does not accept (:class:`Unauthorized`; counted and said
    once per peer ID by the authorizer), before a byte of it is read or written. Resumed sessions are judged by the
    certificate they were made with.

    The peer's certificate is required (``CERT_REQUIRED``): an authorizer decides on a verified SVID. On a client,
    its SPIFFE ID is checked instead of its host name (``check_hostname`` off: an SVID's names mean nothing).

    Args:
        context: a context built by a server's recipe or for a client.
        authorizer: who may be on the other end.
        server_side: whether ``context`` accepts connections (its peers are clients).

    Returns:
        ``context``.

    Example::

        context = authorize_peers(recipe(), authorize_member_of("example.org"), server_side=True)
    """
    if not server_side:
        context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    _authorizers[context] = authorizer
    check_handshakes(context)
    return context


def authorizer_of(context: ssl.SSLContext) -> Authorizer | None:
    """The authorizer :func:`authorize_peers` gave ``context``, else ``None``."""
    return _authorizers.get(context)


def authorized(
    recipe: Callable[P, ssl.SSLContext], authorizer: Authorizer | None, *, server_side: bool = True
) -> Callable[P, ssl.SSLContext]:
    """``recipe``, whose every context refuses peers whose SPIFFE ID ``authorizer`` does not accept, in their
    handshake (:func:`authorize_peers`); ``recipe`` itself when ``authorizer`` is ``None``. Every context a
    reloader serves or routes to (the default identity, SNI identities, the last good) is its recipe's, and every
    context a client identity presents is its recipe's, so wrapping the recipe reaches all of them.

    ``server_side``: the contexts accept connections (client certificates are then required); ``False``: a
    client's (the server's SPIFFE ID is checked instead of its host name).

    Example: ``recipe, recipe_for = authorized(recipe, authorizer), authorized(recipe_for, authorizer)``.
    """
    if authorizer is None:
        return recipe

    def build(*args: P.args, **kwargs: P.kwargs) -> ssl.SSLContext:
        context = recipe(*args, **kwargs)
        if isinstance(context, ssl.SSLContext):  # anything else is build_context's to report
            authorize_peers(context, authorizer, server_side=server_side)
        return context

    return build
