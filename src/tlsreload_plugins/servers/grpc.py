"""Reload TLS certificates inside gRPC servers (``grpc.server``, ``grpc.aio.server``): one line.

gRPC's TLS is in its C core, which takes PEM bytes, not an :class:`ssl.SSLContext`. Its seam for new certificates
is ``grpc.dynamic_ssl_server_credentials(initial, fetcher)``: the C core calls ``fetcher()`` before *every* new
connection's handshake. :func:`server_credentials` gives it a fetcher that does no I/O and parses nothing: the
newest validated configuration once, when there is one, else ``None``. The files are checked by the core (a
:class:`~tlsreload_plugins.Reloader` on a :class:`~tlsreload_plugins.ThreadDriver`, off any event loop) by the rules
of every server: a torn, mismatched, expired or hostile pair never reaches gRPC; the last good keeps serving; the
failure is reported once, file named, counted in ``status()`` and metrics.

The reloader's recipe builds a plain :class:`ssl.SSLContext` (OpenSSL's verdict on the files). gRPC gets exactly the
bytes the reloader validated and put in service (:attr:`Reloader.served <tlsreload_plugins.Reloader.served>`): the
configured pair first (what a handshake naming no listed server gets), then each SNI identity's (gRPC picks by server
name), and the client-CA bundle.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import threading
from collections.abc import Callable, Iterable

try:
    import grpc  # type: ignore[import-untyped, import-not-found, unused-ignore]
except ImportError as _missing:  # the [grpc] extra: one clear line instead of a bare ModuleNotFoundError
    raise ImportError(
        f"tlsreload_plugins.grpc needs grpcio, which is not installed ({_missing}): "
        "pip install 'tlsreload-plugins[grpc]'"
    ) from _missing

from tlsreload_plugins.authorization import AUTHORIZE_ENV, Authorizer, resolve_authorizer
from tlsreload_plugins.drivers import ThreadDriver
from tlsreload_plugins.files import Parts, Password, TLSFiles, password_bytes
from tlsreload_plugins.files import password_file as password_in_file
from tlsreload_plugins.outcome import Outcome, Status
from tlsreload_plugins.reloader import Reloader
from tlsreload_plugins.serving.configured import server_context
from tlsreload_plugins.serving.start import Settings, equip, retry_at_start
from tlsreload_plugins.settings import CRL_ENV, resolve_crl, resolve_password
from tlsreload_plugins.sni import identities as sni

__all__ = ["ReloadingCredentials", "reloaders", "server_credentials"]

log: logging.Logger = logging.getLogger("tlsreload_plugins.grpc")

STOP_TIMEOUT = 10.0
"""Seconds :meth:`ReloadingCredentials.close` waits for a check in progress to end (a check takes milliseconds)."""

# What reloaders() lists: the open credentials' reloaders, each with the pid that made it (a fork has no checker).
_open: dict[Reloader, int] = {}
_open_lock = threading.Lock()

_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----.+?-----END \1-----\r?\n?", re.DOTALL)


def reloaders() -> list[Reloader]:
    """The reloaders of the :func:`server_credentials` made in this process and not closed (health checks, metrics)."""
    with _open_lock:
        return [reloader for reloader, pid in _open.items() if pid == os.getpid()]


class ReloadingCredentials(grpc.ServerCredentials):  # type: ignore[misc, unused-ignore]
    """``grpc.ServerCredentials`` whose certificate follows the files: pass it to ``add_secure_port``.

    Made by :func:`server_credentials` (no public constructor). :meth:`close` (or leaving the ``with`` block) stops
    the checks; the server keeps the certificate it serves.

    Attributes:
        reloader: the :class:`~tlsreload_plugins.Reloader` checking the configured files (its SNI identities:
            ``tlsreload_plugins.sni.identities.for_reloader(credentials.reloader)``).
        configurations: how many gRPC configurations were built (the first included).
        handed: how many new configurations gRPC took since start-up (each for the connections accepted after it).
    """

    def __init__(self, reloader: Reloader, require_client_auth: bool) -> None:
        self.reloader = reloader
        self._lock = threading.Lock()  # one build at a time: a reload_now's callbacks may overlap the ticker's
        self._served = _served(reloader)
        self._refused: list[tuple[str, Parts]] | None = None
        self._newest = _configuration(self._served, reloader.password)
        self._handed = self._newest  # gRPC takes the initial configuration itself
        self.configurations: int = 1  # configurations built (the first one included)
        self.handed: int = 0  # configurations handed to gRPC
        made = grpc.dynamic_ssl_server_credentials(
            self._newest, self.fetch_configuration, require_client_authentication=require_client_auth
        )
        inner = getattr(made, "_credentials", None)
        if inner is None:  # grpc.ServerCredentials has held its C credentials there since grpcio 1.0
            raise RuntimeError(f"tlsreload does not support this grpcio ({grpc.__version__}): its credentials changed")
        super().__init__(inner)
        reloader.add_callbacks(on_check=self._after_check)
        self._driver = ThreadDriver(reloader)

    def fetch_configuration(self) -> grpc.ServerCertificateConfiguration | None:
        """What gRPC calls before each handshake: the newest validated configuration once, else ``None``.
        No I/O, no parsing, no lock (two connections racing may both get it: gRPC builds it twice)."""
        newest = self._newest
        if newest is self._handed:
            return None
        self._handed = newest
        self.handed += 1
        return newest

    def _after_check(self, outcome: Outcome, status: Status) -> None:
        # In the checking thread, after the SNI identities were checked too (their callback came first).
        served = _served(self.reloader)
        if served == self._served or served == self._refused:  # the usual tick: the same bytes objects
            return
        with self._lock:
            try:
                self._newest = _configuration(served, self.reloader.password)
            except Exception as e:  # the key's password changed since it was validated, say
                self._refused = served
                log.error("cannot hand gRPC the new certificate (%s): it keeps serving the previous one", e)
                return
            self._served = served
            self.configurations += 1
        log.debug("gRPC gets %d identities for new connections: %s", len(served), [name for name, _ in served])

    def status(self) -> Status:
        """The configured identity's certificate and counters (:class:`~tlsreload_plugins.Status`); never waits."""
        return self.reloader.status()

    @property
    def running(self) -> bool:
        """Whether the checking thread is alive."""
        return self._driver.running

    def close(self) -> None:
        """Stop the checks and wait for the checking thread to end. Idempotent; the server keeps its certificate."""
        self._driver.stop(STOP_TIMEOUT)
        with _open_lock:
            _open.pop(self.reloader, None)

    def __enter__(self) -> ReloadingCredentials:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def server_credentials(
    certfile: str,
    keyfile: str | None = None,
    *,
    ca_certs: str | None = None,
    require_client_auth: bool | None = None,
    password_file: str | None = None,
    sni: Iterable[str] | str | None = None,
    interval: float | None = None,
    metrics: bool | None = None,
    crl: str | None = None,
    authorize: Authorizer | Callable[[str], bool] | str | None = None,
) -> ReloadingCredentials:
    """Server credentials for ``add_secure_port`` that follow ``certfile`` and ``keyfile`` on disk.

    The files are read and validated now (twice more, half a second apart, if they cannot be used: a rotation
    may be under way), then checked every ``interval`` in a daemon thread. The same call serves ``grpc.server``
    and ``grpc.aio.server``; one call per ``add_secure_port`` (gRPC hands a dynamic credentials' first
    configuration to one port only).

    Args:
        certfile: the certificate chain (PEM), leaf first; may hold the key too.
        keyfile: the private key (PEM), ``None`` when it is in ``certfile``.
        ca_certs: a bundle of CAs client certificates are verified against (mutual TLS), reloaded like the pair.
        require_client_auth: refuse clients without a certificate from ``ca_certs``; default: when ``ca_certs``
            is given. ``False`` with ``ca_certs``: client certificates are not asked for.
        password_file: a file whose first line is the key's password, read again on each reload (default
            ``$TLSRELOAD_KEY_PASSWORD_FILE``, else none). gRPC gets the key decrypted, in memory.
        sni: directories of more identities, chosen by gRPC by the server name a client asks for (a sequence, or
            one ``os.pathsep``-separated string; default ``$TLSRELOAD_SNI``).
        interval: seconds between checks, at least 0.1 (default ``$TLSRELOAD_INTERVAL``, else 1).
        metrics: export Prometheus metrics (:mod:`tlsreload_plugins.metrics`; default ``$TLSRELOAD_METRICS``).
        crl: taken as in every glue, and refused (``ValueError``): gRPC's server credentials take no certificate
            revocation list from Python. So is ``$TLSRELOAD_CRL``.
        authorize: taken as in every glue, and refused (``ValueError``): gRPC makes its handshakes in its own TLS
            stack, where Python cannot refuse a client; check the caller's SPIFFE ID in a server interceptor
            instead. So is ``$TLSRELOAD_SPIFFE_AUTHORIZE``.

    Returns:
        :class:`ReloadingCredentials`: a ``grpc.ServerCredentials`` with ``status()`` and ``close()``; as a
        context manager it gives itself and closes on exit.

    Raises:
        InvalidIdentity: the files cannot be used now; one sentence names the file and what is wrong.
        ValueError: a setting is not usable (an interval below 0.1, an SNI directory that does not exist,
            ``require_client_auth`` without ``ca_certs``, a bad ``$TLSRELOAD_METRICS``, ``crl`` or a
            ``$TLSRELOAD_CRL``: gRPC's server credentials take no CRL from Python), ``authorize`` or a
            ``$TLSRELOAD_SPIFFE_AUTHORIZE`` (its handshakes are made by gRPC's own TLS stack).

    Example::

        server = grpc.server(ThreadPoolExecutor(max_workers=8))
        with server_credentials("/etc/tls/tls.crt", "/etc/tls/tls.key") as credentials:
            server.add_secure_port("[::]:8443", credentials)
            server.start()
            server.wait_for_termination()
    """
    settings = Settings(interval, sni, metrics, crl, authorize)
    settings.check()
    crl_file = resolve_crl(crl)
    if crl_file:
        where = f"crl ({crl_file})" if crl else f"${CRL_ENV} ({crl_file})"
        raise ValueError(
            f"gRPC's server credentials take no certificate revocation list from Python, so {where} "
            "cannot be served: leave it out, or serve mutual TLS with revocation through another server"
        )
    if require_client_auth and not ca_certs:
        raise ValueError("require_client_auth needs ca_certs: the CAs client certificates are verified against")
    if resolve_authorizer(settings.authorize) is not None:
        where = "authorize" if authorize is not None else f"${AUTHORIZE_ENV}"
        raise ValueError(
            f"gRPC's server makes its handshakes in its own TLS stack, out of Python's reach, so {where} "
            "cannot refuse a client there: leave it out, and check the caller's SPIFFE ID in a server interceptor "
            "(context.auth_context()['x509_subject_alternative_name'])"
        )
    password = resolve_password(password_in_file(password_file) if password_file else None)
    files = TLSFiles(str(certfile), str(keyfile) if keyfile else None, str(ca_certs) if ca_certs else None)
    recipe_for = functools.partial(server_context, password=password)  # OpenSSL's verdict on files, never served
    reloader = retry_at_start(
        lambda: Reloader(
            files.certfile,
            files.keyfile,
            recipe=lambda: recipe_for(files),
            ca_certs=files.ca_certs,
            password=password,
            interval=interval,
        )
    )
    equip(reloader, settings, recipe_for)
    require = bool(ca_certs) if require_client_auth is None else require_client_auth
    credentials = ReloadingCredentials(reloader, require)
    with _open_lock:
        _open[reloader] = os.getpid()
    credentials._driver.start()
    return credentials


def _served(reloader: Reloader) -> list[tuple[str, Parts]]:
    """The bytes each identity's reloader validated and serves now, by name, the configured one first (named "")."""
    identities = sni.for_reloader(reloader)
    named = identities.reloaders() if identities is not None else {}
    return [("", reloader.served.parts), *((name, each.served.parts) for name, each in named.items())]


def _configuration(served: list[tuple[str, Parts]], password: Password) -> grpc.ServerCertificateConfiguration:
    """gRPC's configuration for validated bytes: each identity's (key, chain), the client CAs of the first."""
    pairs = [_key_and_chain(parts, password) for _, parts in served]
    return grpc.ssl_server_certificate_configuration(pairs, root_certificates=served[0][1][2])


def _key_and_chain(parts: Parts, password: Password) -> tuple[bytes, bytes]:
    cert, key = parts[:2]
    if key is None:  # the key in the certificate file, as ssl allows: gRPC takes them apart
        blocks = [(m.group(1), m.group(0)) for m in _PEM_BLOCK.finditer(cert)]
        key = b"".join(block for kind, block in blocks if kind.endswith(b"PRIVATE KEY"))
        cert = b"".join(block for kind, block in blocks if kind == b"CERTIFICATE")
    if password is not None and b"ENCRYPTED" in key:  # gRPC takes no password: decrypt in memory
        from cryptography.hazmat.primitives import serialization

        private = serialization.load_pem_private_key(key, password_bytes(password))
        key = private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    return key, cert
