"""The one line for any server that takes an :class:`ssl.SSLContext`: a context that stays fresh.

:func:`fresh_context` validates the files, builds the context the server is given once, and checks
the files on an interval in a daemon thread (never on the server's event loop). New connections get
the newest valid certificate; a torn, mismatched or expired pair is reported once and the last good
one keeps serving. :meth:`FreshContext.close` (or leaving the ``with`` block) stops the checks::

    with fresh_context("/etc/tls/tls.crt", "/etc/tls/tls.key") as context:
        serve(ssl_context=context)

Underneath it is the core, assembled: a :class:`~tlsreload_plugins.Reloader` driven by a
:class:`~tlsreload_plugins.ThreadDriver`, with SNI identities (:mod:`tlsreload_plugins.sni.identities`) and
Prometheus metrics (:mod:`tlsreload_plugins.metrics`) when asked for.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable, Iterable
from types import TracebackType

from tlsreload_plugins import metrics as prometheus
from tlsreload_plugins.authorization import Authorizer, resolve_authorizer
from tlsreload_plugins.drivers import ThreadDriver
from tlsreload_plugins.files import TLSFiles
from tlsreload_plugins.files import password_file as password_in_file
from tlsreload_plugins.memory_files import RecipeFor
from tlsreload_plugins.outcome import Status
from tlsreload_plugins.reloader import Reloader
from tlsreload_plugins.resumption import authorized
from tlsreload_plugins.serving.configured import server_context
from tlsreload_plugins.settings import resolve_password
from tlsreload_plugins.sni import identities as sni_identities

__all__ = ["FreshContext", "fresh_context", "reloaders"]

STOP_TIMEOUT = 10.0
"""Seconds :meth:`FreshContext.close` waits for a check in progress to end (a check takes milliseconds)."""


_open: dict[FreshContext, int] = {}
"""Every context :func:`fresh_context` made that is still checked, with the pid that made it."""


def reloaders() -> list[Reloader]:
    """The reloaders of the contexts :func:`fresh_context` made in this process and not closed (for health
    checks and metrics; the glue of servers built on it answers its ``reloaders()`` with this)."""
    pid = os.getpid()
    return [fresh.reloader for fresh, owner in list(_open.items()) if owner == pid]


class FreshContext:
    """A server's :class:`ssl.SSLContext` kept fresh by checks in a daemon thread, until :meth:`close`.

    Made by :func:`fresh_context` (no public constructor). Closing stops the checks only: the context
    keeps serving the last certificate it served.

    Attributes:
        context: the :class:`ssl.SSLContext` to hand to the server, once, for its whole life.
        reloader: the :class:`~tlsreload_plugins.Reloader` behind it (its ``leaf``, ``check()``, callbacks).
    """

    def __init__(self, reloader: Reloader, driver: ThreadDriver) -> None:
        self.reloader = reloader
        self.context: ssl.SSLContext = reloader.context
        self._driver = driver

    def status(self) -> Status:
        """The served certificate and the counters of the checks (:class:`~tlsreload_plugins.Status`);
        never waits for a check in progress. SNI identities have their own:
        ``tlsreload_plugins.sni.identities.for_reloader(fresh.reloader).status()``."""
        return self.reloader.status()

    @property
    def running(self) -> bool:
        """Whether the checking thread is alive."""
        return self._driver.running

    def close(self) -> None:
        """Stop the checks and wait for the checking thread to end. Idempotent; the context keeps
        serving the certificate it serves now."""
        _open.pop(self, None)
        self._driver.stop(STOP_TIMEOUT)

    def __enter__(self) -> ssl.SSLContext:
        return self.context

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def fresh_context(
    certfile: str,
    keyfile: str | None = None,
    *,
    ca_certs: str | None = None,
    crl: str | None = None,
    password_file: str | None = None,
    sni: Iterable[str] | str | None = None,
    interval: float | None = None,
    recipe: RecipeFor | None = None,
    metrics: bool | None = None,
    authorize: Authorizer | Callable[[str], bool] | str | None = None,
) -> FreshContext:
    """An :class:`ssl.SSLContext` for ``certfile`` and ``keyfile`` that stays fresh: hand ``.context``
    to the server; new connections get the newest valid certificate on disk. Checks start at once, in
    a daemon thread; under gevent each check runs in the hub's pool of native threads.

    Args:
        certfile: the certificate chain (PEM), leaf first; may hold the key too.
        keyfile: the private key (PEM), ``None`` when it is in ``certfile``.
        ca_certs: a bundle of CAs client certificates are verified against. Given to a server it means
            mutual TLS: the default recipe sets ``verify_mode = ssl.CERT_REQUIRED`` (a client without a
            certificate is refused). Reloaded like the pair.
        crl: a PEM file of certificate revocation lists for the CAs of ``ca_certs`` (default ``$TLSRELOAD_CRL``):
            client certificates they revoke are refused. Reloaded with the bundle, as one change.
        password_file: a file whose first line is the key's password, read again on each reload (default
            ``$TLSRELOAD_KEY_PASSWORD_FILE``, else none).
        sni: directories of more identities, chosen by the server name a client asks for (a sequence,
            or one ``os.pathsep``-separated string; default ``$TLSRELOAD_SNI``), see :mod:`tlsreload_plugins.sni`.
        interval: seconds between checks, at least 0.1 (default ``$TLSRELOAD_INTERVAL``, else 1).
        recipe: how the server builds a context from a :class:`~tlsreload_plugins.TLSFiles` (ALPN, ciphers,
            protocol bounds, the password if the key has one), called for the configured files, for each SNI
            identity's, and again on every reload. Default: ``ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)``,
            ``load_cert_chain(certfile, keyfile, password)``, and with ``ca_certs``, ``load_verify_locations``
            and ``CERT_REQUIRED``.
        metrics: export Prometheus metrics (:mod:`tlsreload_plugins.metrics`; default ``$TLSRELOAD_METRICS``).
        authorize: which clients may connect, by the SPIFFE ID of their certificate (default
            ``$TLSRELOAD_SPIFFE_AUTHORIZE``, else any the context verifies): an
            :class:`~tlsreload_plugins.authorization.Authorizer` (``authorize_member_of("example.org")``), a
            matcher, or the syntax of :func:`~tlsreload_plugins.authorization.parse_authorizer`. A client refused
            fails its handshake; client certificates are required.

    Returns:
        A :class:`FreshContext`: ``.context``, ``status()``, ``close()``; as a context manager it gives
        the :class:`ssl.SSLContext` and closes on exit.

    Raises:
        InvalidIdentity: the files cannot be used now; one sentence names the file and what is wrong.
        ValueError: a setting is not usable (an interval below 0.1, an SNI directory that does not exist,
            a ``$TLSRELOAD_METRICS`` that is neither true nor false).
        TypeError: ``recipe`` returned something other than an :class:`ssl.SSLContext`.

    Example (aiohttp)::

        fresh = fresh_context("/etc/tls/tls.crt", "/etc/tls/tls.key")

        async def closing(app):
            yield
            fresh.close()

        app.cleanup_ctx.append(closing)
        web.run_app(app, ssl_context=fresh.context)

    Example (``http.server``; ``examples/http_server.py`` does each handshake in its connection's thread)::

        with fresh_context("/etc/tls/tls.crt", "/etc/tls/tls.key") as context:
            server = ThreadingHTTPServer(("0.0.0.0", 8443), Handler)
            server.socket = context.wrap_socket(server.socket, server_side=True)
            server.serve_forever()
    """
    export_metrics = prometheus.wanted(metrics)  # a bad setting fails before anything is read
    password = resolve_password(password_in_file(password_file) if password_file else None)

    def default_recipe(files: TLSFiles) -> ssl.SSLContext:  # a client-CA bundle given to a server: mutual TLS
        return server_context(files, password, verify_mode=ssl.CERT_REQUIRED if files.ca_certs else None)

    authorizer = resolve_authorizer(authorize)
    recipe_for = authorized(recipe or default_recipe, authorizer)
    files = TLSFiles(str(certfile), str(keyfile) if keyfile else None, ca_certs or None)
    reloader = Reloader(
        files.certfile,
        files.keyfile,
        recipe=lambda: recipe_for(files),
        ca_certs=files.ca_certs,
        crl=crl,
        password=password,
        interval=interval,
    )
    _equip(reloader, sni, recipe_for, export_metrics)
    if export_metrics and authorizer is not None:
        prometheus.observe_authorizer(authorizer, "server")
    fresh = FreshContext(reloader, ThreadDriver(reloader).start())
    _open[fresh] = os.getpid()
    return fresh


def _equip(reloader: Reloader, sni: Iterable[str] | str | None, recipe_for: RecipeFor, export_metrics: bool) -> None:
    # Metrics first: SNI identities get metrics when their default reloader has them.
    if export_metrics:
        prometheus.observe(reloader)
    sni_identities.attach_from_settings(reloader, sni, recipe_for)
