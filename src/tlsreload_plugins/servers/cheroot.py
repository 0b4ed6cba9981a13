"""Reload TLS certificates inside cheroot and CherryPy: a reloading builtin SSL adapter.

cheroot's :class:`~cheroot.ssl.builtin.BuiltinSSLAdapter` builds its :class:`ssl.SSLContext` once, in
its constructor, and wraps every accepted connection with it. :class:`ReloadingSSLAdapter` is that
adapter whose context follows the files: its recipe is cheroot's own adapter, built again on each
reload (so ciphers, the client-CA store and the ``SSL_SERVER_*`` WSGI environ are cheroot's), and
the checks run in a daemon thread, never in cheroot's accept loop. cheroot (one process, worker
threads)::

    server = cheroot.wsgi.Server(("0.0.0.0", 8443), app)
    server.ssl_adapter = ReloadingSSLAdapter("/etc/tls/tls.crt", "/etc/tls/tls.key")
    server.safe_start()

CherryPy: importing this module registers the adapter in cheroot's registry of SSL adapters
(``cheroot.server.ssl_adapters``, which CherryPy documents for this) as ``'tlsreload'``::

    import tlsreload_plugins.cheroot  # registers server.ssl_module 'tlsreload'

    cherrypy.config.update({"server.ssl_module": "tlsreload",
                            "server.ssl_certificate": "/etc/tls/tls.crt",
                            "server.ssl_private_key": "/etc/tls/tls.key"})

Mutual TLS as with stock cheroot: the ``certificate_chain`` (CherryPy's ``server.ssl_certificate_chain``)
is the bundle client certificates are verified against, reloaded like the pair; set
``adapter.context.verify_mode = ssl.CERT_REQUIRED`` to require them (every rebuilt context keeps the
verify mode of the adapter's context). A context set from outside (CherryPy's ``server.ssl_context``)
could never follow the files: the adapter refuses it, at start-up.
"""

from __future__ import annotations

import logging
import ssl
import sys
import weakref
from collections.abc import Callable, Iterable
from typing import Any

try:
    from cheroot import server as cheroot_server
    from cheroot.ssl.builtin import BuiltinSSLAdapter
except ImportError as _missing:  # one clear line rather than a traceback into this module
    raise ImportError(
        f"tlsreload_plugins.cheroot needs cheroot ({_missing}): pip install 'tlsreload-plugins[cherrypy]'"
    ) from _missing

from tlsreload_plugins.authorization import Authorizer
from tlsreload_plugins.drivers import ThreadDriver
from tlsreload_plugins.files import TLSFiles
from tlsreload_plugins.reloader import Reloader
from tlsreload_plugins.serving import logs
from tlsreload_plugins.serving.start import CannotServe, Settings, start_reloader
from tlsreload_plugins.settings import resolve_password

__all__ = ["SSL_MODULE", "ReloadingSSLAdapter", "reloaders"]

log: logging.Logger = logging.getLogger("tlsreload_plugins.cheroot")

SSL_MODULE = "tlsreload"
"""The name the adapter is registered under in ``cheroot.server.ssl_adapters`` (CherryPy's ``server.ssl_module``)."""

# Public (CherryPy's docs name it for registering adapters) but missing from cheroot's type stubs.
cheroot_server.ssl_adapters.setdefault(SSL_MODULE, f"{__name__}.ReloadingSSLAdapter")  # type: ignore[attr-defined]

_reloaders: list[Reloader] = []
"""The reloaders of this process's open adapters (for health checks, metrics)."""

_server_environ: weakref.WeakKeyDictionary[ssl.SSLContext, dict[str, Any]] = weakref.WeakKeyDictionary()
"""The ``SSL_SERVER_*`` WSGI environ cheroot computed for each context built: a connection gets its context's."""


def reloaders() -> list[Reloader]:
    """The reloaders of the :class:`ReloadingSSLAdapter` objects open in this process."""
    return list(_reloaders)


class ReloadingSSLAdapter(BuiltinSSLAdapter):
    """cheroot's builtin SSL adapter whose context follows the certificate files on disk.

    Takes cheroot's arguments (what CherryPy passes from ``server.ssl_*``), and tlsreload's.

    Args:
        certificate: the certificate chain (PEM), leaf first.
        private_key: the private key (PEM).
        certificate_chain: the CA bundle client certificates are verified against (as stock cheroot
            loads it), reloaded too.
        ciphers: OpenSSL cipher list, as for stock cheroot.
        private_key_password: the key's password (without it, the first line of
            ``$TLSRELOAD_KEY_PASSWORD_FILE``, read again on every reload).
        crl: a PEM file of CRLs for the CAs of ``certificate_chain``, reloaded with it (default
            ``$TLSRELOAD_CRL``: how an adapter CherryPy builds from its ``server.ssl_*`` settings takes it). It
            refuses only clients asked for a certificate: set the context's verify mode, as for mutual TLS.
        interval: seconds between checks (default ``$TLSRELOAD_INTERVAL``, else 1).
        sni: directories of more identities chosen by server name (default ``$TLSRELOAD_SNI``).
        metrics: export Prometheus metrics (default ``$TLSRELOAD_METRICS``, else off).
        authorize: who may connect, by SPIFFE ID (else ``$TLSRELOAD_SPIFFE_AUTHORIZE``): as ``serving.Settings``.

    Raises:
        CannotServe: the files or settings cannot serve now (one line, also logged as an error).

    Example::

        server.ssl_adapter = ReloadingSSLAdapter("tls.crt", "tls.key", interval=5)
        try:
            server.safe_start()
        finally:
            server.ssl_adapter.close()
    """

    def __init__(
        self,
        certificate: str,
        private_key: str | None,
        certificate_chain: str | None = None,
        ciphers: str | None = None,
        *,
        private_key_password: str | bytes | None = None,
        crl: str | None = None,
        interval: float | None = None,
        sni: Iterable[str] | str | None = None,
        metrics: bool | None = None,
        authorize: Authorizer | Callable[[str], bool] | str | None = None,
    ) -> None:
        # What cheroot's Adapter.__init__ records; BuiltinSSLAdapter.__init__ would build a context we never use.
        self.certificate: str = certificate
        self.private_key: str | None = private_key
        self.certificate_chain: str | None = certificate_chain
        self.ciphers: str | None = ciphers
        self.private_key_password = private_key_password
        self._server_env: dict[str, Any] = {}  # per connection instead: see get_environ()
        _route_logs()
        self._password = resolve_password(private_key_password)
        files = TLSFiles(str(certificate), str(private_key) if private_key else None, certificate_chain or None)
        try:
            self.reloader: Reloader = start_reloader(
                files,
                lambda: self._cheroot_context(files),
                self._cheroot_context,
                password=self._password,
                settings=Settings(interval, sni, metrics, crl, authorize),
            )
        except CannotServe as e:
            log.error("%s", e)
            raise CannotServe(str(e)) from None  # the sentence says it all: a report of a failed start stays short
        self._context: ssl.SSLContext = self.reloader.context
        self._driver = ThreadDriver(self.reloader).start()
        _reloaders.append(self.reloader)

    def _cheroot_context(self, files: TLSFiles) -> ssl.SSLContext:
        """cheroot's own adapter for ``files``: its context, keeping this adapter's verify mode."""
        password: dict[str, Any] = {"private_key_password": self._password} if self._password is not None else {}
        try:
            built = BuiltinSSLAdapter(files.certfile, files.keyfile, files.ca_certs, self.ciphers, **password)
        except TypeError as e:  # cheroot before 11.1 takes no key password
            raise CannotServe(f"this cheroot cannot load an encrypted key ({e}): upgrade to cheroot 11.1+") from e
        context: ssl.SSLContext = built.context
        live: ssl.SSLContext | None = getattr(self, "_context", None)
        if live is not None:
            context.verify_mode = live.verify_mode
        _server_environ[context] = dict(getattr(built, "_server_env", None) or {})
        return context

    @property
    def context(self) -> ssl.SSLContext:
        """The context cheroot wraps connections with, for the adapter's whole life (its ``sni_callback``
        moves each new connection onto the newest certificate)."""
        return self._context

    @context.setter
    def context(self, context: ssl.SSLContext) -> None:
        if context is not self._context:
            raise ValueError(
                "tlsreload's SSL adapter builds its own context from the certificate files; a context set from "
                "outside (CherryPy's server.ssl_context) would never follow them: drop it, or use "
                "server.ssl_module 'builtin'"
            )

    # cheroot's stubs give the abstract Adapter.get_environ() no socket, and BuiltinSSLAdapter's no types.
    def get_environ(self, sock: ssl.SSLSocket) -> dict[str, Any]:  # type: ignore[override]
        """cheroot's WSGI environ entries, with the ``SSL_SERVER_*`` ones of the certificate this connection got."""
        environ: dict[str, Any] = super().get_environ(sock)  # type: ignore[no-untyped-call]
        environ.update(_server_environ.get(sock.context, {}))
        return environ

    def close(self) -> None:
        """Stop the checks (the context keeps serving the certificate it serves now). Idempotent."""
        self._driver.stop()
        if self.reloader in _reloaders:
            _reloaders.remove(self.reloader)


def _route_logs() -> None:
    """Under CherryPy, our lines go to its error log; bare cheroot has no logger of its own."""
    if "cherrypy" in sys.modules:
        logs.forward_to(logging.getLogger("cherrypy.error"))
