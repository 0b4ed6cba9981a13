"""Reload TLS certificates in any Twisted server: the ``tlsreload:`` endpoint, ``ssl:`` plus live reload.

daphne, ``twistd web`` and every Twisted service listen through endpoint strings; Twisted's ``ssl:``
endpoint caches one ``OpenSSL.SSL.Context`` for the life of the process. ``tlsreload:`` takes the same
string (``daphne -e tlsreload:8443:privateKey=tls.key:certKey=tls.crt app``) and hands each new connection
the newest validated context. Twisted finds the prefix through the plugin ``twisted/plugins/tlsreload_endpoint.py``,
which calls :func:`reloading_endpoint` and which the ``[twisted]`` extra installs (a distribution of its own,
tlsreload-twisted-endpoint). The keywords are exactly those of Twisted's own ``ssl:`` parser (bound to its
signature), plus :data:`EXTRA_KEYWORDS`; ``TLSRELOAD_*`` apply.

Every context is built by Twisted's ``ssl:`` parser itself (same method, options, ciphers, DH parameters,
``extraCertChain``) from the bytes the core's reader read (a key with a password decrypted in memory),
beside a plain :class:`ssl.SSLContext` from the same bytes, which the core's
:class:`~tlsreload_plugins.Reloader` validates and swaps; each ``CertificateOptions`` is kept beside the
``ssl.SSLContext`` it was built with. Checks run in a :class:`~tlsreload_plugins.ThreadDriver` started
when the reactor runs (after ``twistd`` daemonizes) and stopped before it shuts down; the reactor thread
only looks up the newest context per connection. See docs/twisted.md.
"""

from __future__ import annotations

import inspect
import logging
import re
import ssl
import weakref
from collections.abc import Callable
from typing import Any

try:
    from OpenSSL.crypto import X509StoreFlags
    from OpenSSL.SSL import Connection
    from twisted.internet import endpoints
    from twisted.internet.interfaces import IOpenSSLServerConnectionCreator
    from twisted.internet.ssl import Certificate, trustRootFromCertificates
    from twisted.logger import Logger, LogLevel
    from zope.interface import implementer  # type: ignore[import-untyped, unused-ignore]
except ImportError as _missing:  # the [twisted] extra: one clear line instead of a bare ModuleNotFoundError
    raise ImportError(
        f"tlsreload's tlsreload: endpoint needs Twisted with TLS ({_missing}): pip install 'tlsreload-plugins[twisted]'"
    ) from _missing

from tlsreload_plugins.authorization import AUTHORIZE_ENV, resolve_authorizer
from tlsreload_plugins.drivers import ThreadDriver
from tlsreload_plugins.files import Password, TLSFiles, password_bytes, password_file, read_files
from tlsreload_plugins.memory_files import RecipeFor, in_memory_files
from tlsreload_plugins.reloader import Reloader
from tlsreload_plugins.serving.lifespan import register, reloaders
from tlsreload_plugins.serving.start import CannotServe, Settings, start_reloader
from tlsreload_plugins.settings import resolve_password
from tlsreload_plugins.sni import identities as sni
from tlsreload_plugins.sni.discovery import resolve_directories

__all__ = ["NewestContext", "reloaders", "reloading_endpoint"]

log: logging.Logger = logging.getLogger("tlsreload_plugins.twisted")

EXTRA_KEYWORDS = ("interval", "sni", "keyPasswordFile", "caFile", "crlFile")
"""tlsreload's own keywords: seconds between checks, SNI directories (``os.pathsep``-separated, colons escaped
``\\:``), a file holding the key's password, client CAs (client certificates then required), the CRLs of those CAs."""
_LISTEN_KEYWORDS = ("port", "interface", "backlog")
_PEM_KEY = re.compile(rb"-----BEGIN ([A-Z ]*PRIVATE KEY)-----.+?-----END \1-----", re.DOTALL)
_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----\r?\n?", re.DOTALL)

_options: weakref.WeakKeyDictionary[ssl.SSLContext, Any] = weakref.WeakKeyDictionary()
"""The ``CertificateOptions`` built beside each ``ssl.SSLContext`` a recipe returned (kept while the context lives)."""


def _ssl_parser() -> Any:
    """Twisted's own ``ssl:`` parser: what ``serverFromString`` calls for ``ssl:`` (a private name, guarded)."""
    parser = getattr(endpoints, "_serverParsers", {}).get("ssl")
    if not callable(parser):
        raise RuntimeError(
            "this Twisted has no ssl: endpoint parser (twisted.internet.endpoints._serverParsers['ssl']) for "
            "tlsreload: to build its contexts with; tlsreload does not support this Twisted"
        )
    return parser


def _ssl_keywords(args: tuple[str, ...], kwargs: dict[str, str]) -> dict[str, Any]:
    """Every argument of the ``ssl:`` endpoint, by name, defaults applied, bound as Twisted's parser binds them.

    Raises:
        TypeError: a keyword the ``ssl:`` endpoint does not take (or a missing port), as ``ssl:`` raises it.
    """
    parameters = list(inspect.signature(_ssl_parser()).parameters.values())
    bound = inspect.Signature(parameters[1:]).bind(*args, **kwargs)  # the first is strports' leftover factory
    bound.apply_defaults()
    return dict(bound.arguments)


def _key_in_memory(cert: bytes, key: bytes | None, password: Password) -> tuple[bytes, bytes | None]:
    """The certificate and key to hand Twisted: as read, or with the key decrypted (Twisted's ``ssl:`` loads
    no encrypted key) and the certificate file's own key left out."""
    match = _PEM_KEY.search(key if key is not None else cert)
    if password is None or match is None or b"ENCRYPTED" not in match.group(0):
        return cert, key  # as OpenSSL does, a password is ignored for a key that has none
    from cryptography.hazmat.primitives import serialization

    private = serialization.load_pem_private_key(match.group(0), password_bytes(password))
    plain = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return b"".join(_PEM_CERT.findall(cert)), plain


def _recipe_for(
    tls: dict[str, Any],
    port: str,
    password: Password,
    on_server_name: Callable[[Connection], None] | None = None,
    own_chain: bool = False,
) -> RecipeFor:
    """Builds the ``ssl:`` endpoint's ``CertificateOptions`` for some files (``tls``: its other keywords) and a
    plain ``ssl.SSLContext`` from the same bytes, the one returned (the core validates and swaps it).
    ``own_chain`` (SNI identities): the certificates after the leaf in the files' own certificate file are
    the ``extraCertChain``, instead of the configured one (the default identity's)."""
    parse_ssl = _ssl_parser()

    def build(files: TLSFiles) -> ssl.SSLContext:
        snapshot = read_files(files)  # regular files only, size-capped: never a FIFO's endless wait
        cert, key = _key_in_memory(snapshot.cert, snapshot.key, password)
        chain = b"".join(_PEM_CERT.findall(cert)[1:]) if own_chain else b""
        with (
            in_memory_files(cert, key, snapshot.ca, snapshot.crl) as paths,
            in_memory_files(chain, None, None) as extra,
        ):
            keywords = {**tls, "extraCertChain": extra.certfile if chain else None} if own_chain else tls
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(paths.certfile, paths.keyfile)
            (_, _, options), _ = parse_ssl(
                None, port, privateKey=paths.keyfile or paths.certfile, certKey=paths.certfile, **keywords
            )
            if paths.ca_certs:
                context.load_verify_locations(paths.ca_certs)
                context.verify_mode = ssl.CERT_REQUIRED
                cas = [Certificate.loadPEM(pem) for pem in _PEM_CERT.findall(snapshot.ca or b"")]
                # What CertificateOptions(trustRoot=...) sets: peer certificates verified and required.
                trust_root: Any = trustRootFromCertificates  # untyped in Twisted
                options.trustRoot = trust_root(cas)
                options.verify = options.requireCertificate = True
            built = options.getContext()  # built (and cached) here, in the checking thread: never on the reactor
            if paths.crl:  # the ssl: parser takes no CRL: into the store of the context it cached, as ssl does
                built.load_verify_locations(paths.crl)
                built.get_cert_store().set_flags(X509StoreFlags.CRL_CHECK)
            if on_server_name is not None:
                built.set_tlsext_servername_callback(on_server_name)
        _options[context] = options
        return context

    return build


def _sni_router(default: list[Reloader], by_name: bool) -> Callable[[Connection], None]:
    """pyOpenSSL's servername callback (OpenSSL calls it on every ClientHello): moves a connection onto the SNI
    identity serving its server name (``by_name``), else onto the newest context. A connection accepted before a
    reload whose ClientHello comes after it (a straddler) is created on the context that was newest when it was
    accepted; moved, its client certificate is verified against the newest client-CA bundle and CRLs. (Twisted's
    ``ssl:`` contexts keep no sessions: none resumes from the older context.)"""

    def on_server_name(connection: Connection) -> None:
        try:
            context = None
            if by_name:
                name = connection.get_servername()
                identities = sni.for_reloader(default[0]) if default else None
                context = identities.context_for(name.decode("ascii")) if identities is not None and name else None
            if context is None and default:
                context = default[0].newest_context
            if context is not None:
                target = _options[context].getContext()
                if connection.get_context() is not target:
                    connection.set_context(target)
        except Exception:  # the context it was accepted on answers rather than a failed handshake
            log.exception("cannot move a TLS connection onto the newest or its server name's context")

    return on_server_name


@implementer(IOpenSSLServerConnectionCreator)
class NewestContext:
    """Twisted's per-connection seam: each new connection gets the newest validated context, as the ``ssl:``
    endpoint's ``CertificateOptions`` would make it; established connections keep theirs."""

    def __init__(self, reloader: Reloader) -> None:
        self.reloader = reloader

    @property
    def options(self) -> Any:
        """The ``CertificateOptions`` new connections are made from now."""
        return _options[self.reloader.newest_context]

    def serverConnectionForTLS(self, protocol: Any) -> Connection:
        options = self.options
        make = getattr(options, "serverConnectionForTLS", None)  # older Twisted: a context factory only
        return make(protocol) if make is not None else Connection(options.getContext(), None)


def reloading_endpoint(reactor: Any, *args: str, **kwargs: str) -> Any:
    """What ``tlsreload:`` parses to: an ``SSL4ServerEndpoint``, as ``ssl:`` gives, whose connections get the
    newest validated context. The files are loaded now (as ``ssl:`` loads them); checks start when the
    reactor runs and stop before it shuts down.

    Raises:
        TypeError: a keyword neither ``ssl:`` nor tlsreload takes.
        ValueError: a tlsreload keyword's value is not usable (an interval that is not a number).
        SystemExit: nothing usable to serve (after a few reads): one line naming the file, status 1, which is
            how daphne and twistd stop; code of your own may catch it.

    Example::

        endpoint = serverFromString(reactor, "tlsreload:8443:privateKey=tls.key:certKey=tls.crt:interval=5")
        endpoint.listen(site)
    """
    ours = {name: kwargs.pop(name) for name in EXTRA_KEYWORDS if name in kwargs}
    tls = _ssl_keywords(args, kwargs)
    port, interface, backlog = (tls.pop(name) for name in _LISTEN_KEYWORDS)
    private_key, cert_key = tls.pop("privateKey"), tls.pop("certKey")
    files = TLSFiles(cert_key or private_key, private_key if cert_key else None, ours.get("caFile") or None)
    try:
        interval = float(ours["interval"]) if "interval" in ours else None
    except ValueError:
        raise ValueError(f"tlsreload: interval must be a number of seconds, got {ours['interval']!r}") from None
    settings = Settings(interval=interval, sni=ours.get("sni"), crl=ours.get("crlFile"))
    try:
        files = settings.with_crl(files)  # the recipe reads the CRL itself: into Twisted's context too
        if resolve_authorizer(None) is not None:
            raise ValueError(
                f"Twisted makes its handshakes with pyOpenSSL, where ${AUTHORIZE_ENV} cannot refuse a client: unset "
                "it, or check the peer's SPIFFE ID in your protocol (transport.getPeerCertificate())"
            )
    except ValueError as e:
        raise SystemExit(f"tlsreload: cannot serve TLS: {e}") from None
    password = resolve_password(password_file(ours["keyPasswordFile"]) if ours.get("keyPasswordFile") else None)
    _route_logs()
    default: list[Reloader] = []  # filled below: the router reads it on each handshake
    router = _sni_router(default, by_name=bool(resolve_directories(settings.sni)))
    recipe_for = _recipe_for(tls, str(port), password, own_chain=True)
    recipe = _recipe_for(tls, str(port), password, router)
    try:
        reloader = start_reloader(files, lambda: recipe(files), recipe_for, password=password, settings=settings)
    except CannotServe as e:  # what daphne and twistd can do with it: stop, with one line
        raise SystemExit(f"tlsreload: {e}") from None
    default.append(reloader)
    driver = ThreadDriver(reloader)
    register(reloader, driver)  # listed in reloaders()
    reactor.callWhenRunning(driver.start)  # after twistd daemonizes: a thread does not survive its fork
    reactor.addSystemEventTrigger("before", "shutdown", driver.stop)
    ssl_endpoint: Any = endpoints.SSL4ServerEndpoint  # the ssl: endpoint's own class (untyped in Twisted)
    return ssl_endpoint(reactor, int(port), NewestContext(reloader), int(backlog), interface)


# -- logs ------------------------------------------------------------------------------------------

_LEVELS = ((logging.ERROR, LogLevel.error), (logging.WARNING, LogLevel.warn), (logging.INFO, LogLevel.info))


class _ToTwistedLog(logging.Handler):
    """Hands the package's records to Twisted's log (twistd's), which configures no stdlib logging."""

    def emit(self, record: logging.LogRecord) -> None:
        level = next((twisted for number, twisted in _LEVELS if record.levelno >= number), LogLevel.debug)
        Logger(namespace=record.name).emit(level, "{message}", message=f"tlsreload: {record.getMessage()}")


def _route_logs() -> None:
    """Show the package's lines in the server's log: daphne configures stdlib logging (left alone), twistd
    only its own log (the lines go there). Left alone where the package's logger has handlers already."""
    ours = logging.getLogger("tlsreload_plugins")
    if ours.handlers or logging.getLogger().handlers:
        return
    ours.addHandler(_ToTwistedLog())
    ours.setLevel(logging.INFO)
    ours.propagate = False
