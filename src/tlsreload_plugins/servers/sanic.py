"""Reload TLS certificates inside Sanic: its worker manager, its command line, its several certificates.

One line where the app is made (each worker imports that module too): ``reloading(app)``; then Sanic as
usual (``app.run(ssl=..., workers=N)``, ``sanic app:app --cert C --key K``, ``--tls DIR``). Each worker builds its
context through the app's ``certloader_class``: :class:`ReloadingCertLoader` uses Sanic's own ``CertSimple``
(ciphers, ALPN, TLS 1.2 floor, names read from the certificate) and checks the files in a thread. Workers Sanic
starts or restarts (``app.m.restart()``, its inspector, auto-reload) keep the last good certificate: before they
start (``main_process_start``) the main process checks each certificate and starts its one reader
(:mod:`tlsreload_plugins.publication`), whose publication reaches every worker through ``app.shared_ctx``. Several
certificates (a list) are each reloaded on their own, Sanic's ``CertSelector`` picking the newest context of each
by server name (stock Sanic cannot pickle its selector for its workers: they get the list of settings instead).
"""

from __future__ import annotations

import functools
import logging
import ssl
from collections.abc import Callable, Iterable
from typing import Any

try:
    from sanic import Sanic
    from sanic.http.tls.context import CertSelector, CertSimple
    from sanic.worker.loader import CertLoader
except ImportError as _missing:  # one clear line rather than a traceback into this module
    raise ImportError(
        f"tlsreload_plugins.sanic needs sanic ({_missing}): pip install 'tlsreload-plugins[sanic]'"
    ) from _missing

from tlsreload_plugins.authorization import Authorizer
from tlsreload_plugins.drivers import ThreadDriver
from tlsreload_plugins.examine import keep_fixed_settings
from tlsreload_plugins.files import Password, TLSFiles, password_text
from tlsreload_plugins.identity import Leaf
from tlsreload_plugins.publication.reader import ReaderProcess
from tlsreload_plugins.reloader import Reloader, create_connections_on
from tlsreload_plugins.renamed import renamed
from tlsreload_plugins.resumption import check_handshakes, refuse_if_resumed
from tlsreload_plugins.serving import logs
from tlsreload_plugins.serving.lifespan import register, reloaders
from tlsreload_plugins.serving.start import CannotServe, Settings, check_at_start, exit_if_cannot_serve, start_reloader
from tlsreload_plugins.serving.workers import waiting_in_spawned_worker
from tlsreload_plugins.settings import resolve_password
from tlsreload_plugins.sni.discovery import resolve_directories

__all__ = ["ReloadingCertLoader", "reloading", "reloaders"]

log: logging.Logger = logging.getLogger("tlsreload_plugins.sanic")

STARTUP_FAILURE = 1
"""Exit status when the certificates or settings cannot serve at start-up (Sanic's own on a failed start)."""

PUBLICATIONS = "tlsreload_publications"
"""The attribute of ``app.shared_ctx`` holding where each certificate's reader publishes, for the workers."""
_readers: list[ReaderProcess] = []
"""The readers Sanic's main process started (each closes at its exit)."""

Entry = dict[
    str, Any
]  # one certificate's settings as Sanic keeps them: cert, key, password, names (ca_certs, crl: ours)

_settings: dict[str, Settings] = {}  # by app name: a worker imports the app's module, which gives them again


def reloading(
    app: Sanic[Any, Any],
    *,
    interval: float | None = None,
    sni: Iterable[str] | str | None = None,
    metrics: bool | None = None,
    authorize: Authorizer | Callable[[str], bool] | str | None = None,
) -> None:
    """Make ``app``'s certificates follow their files in every worker: sets ``app.certloader_class`` and a
    ``main_process_start`` listener. Call it where the app is made. Each certificate's settings (a dict) may
    name a ``"ca_certs"`` bundle (tlsreload's): client certificates signed by it are then required; and beside it a
    ``"crl"`` file (PEM CRLs for the CAs of that bundle, else ``$TLSRELOAD_CRL``), reloaded with it.

    Args:
        app: the Sanic app.
        interval: seconds between checks (default ``$TLSRELOAD_INTERVAL``, else 1).
        sni: directories of more identities chosen by server name (default ``$TLSRELOAD_SNI``); not beside
            a list of certificates.
        metrics: export Prometheus metrics (default ``$TLSRELOAD_METRICS``, else off).
        authorize: who may connect, by SPIFFE ID (else ``$TLSRELOAD_SPIFFE_AUTHORIZE``): as ``serving.Settings``.

    Example::

        app = Sanic("app")
        reloading(app, interval=5)
        app.run(ssl={"cert": "tls.crt", "key": "tls.key"}, workers=4)
    """
    _settings[app.name] = Settings(interval, sni, metrics, authorize=authorize)
    app.certloader_class = ReloadingCertLoader
    app.register_listener(_before_workers, "main_process_start")


class ReloadingCertLoader(CertLoader):
    """Sanic's certificate loader (``certloader_class``), reloading: :func:`reloading` sets it."""

    def __init__(self, ssl_data: Any) -> None:
        super().__init__(ssl_data)
        self.tls_data = ssl_data

    def load(self, app: Sanic[Any, Any]) -> ssl.SSLContext | None:
        """The context of this worker (Sanic calls it before its loop runs), its checks started."""
        if isinstance(self.tls_data, dict) and self.tls_data.get("creator"):
            log.info("Sanic makes a development certificate: it is not reloaded")
            return super().load(app)  # type: ignore[no-any-return]
        _route_logs()
        publications: list[str] | None = getattr(app.shared_ctx, PUBLICATIONS, None)
        with exit_if_cannot_serve(STARTUP_FAILURE):
            found = _identities(self.tls_data)
            if found is None:
                return None
            strict, entries = found
            settings = _settings.get(app.name, Settings())
            _refuse_sni_beside_a_list(settings, strict or len(entries) > 1)
            made = [
                _reloader(entry, settings, publications[i] if publications else None) for i, entry in enumerate(entries)
            ]
            context = made[0].context if len(made) == 1 and not strict else _selector(made, strict)
        for reloader in made:
            register(reloader, ThreadDriver(reloader).start())
        return context


def _before_workers(app: Sanic[Any, Any]) -> None:
    """In Sanic's main process, before its workers start: check each certificate, keep it for the workers, and
    hand them its settings (and the stores, with ``app.shared_ctx``) in a form that pickles."""
    _route_logs()
    with exit_if_cannot_serve(STARTUP_FAILURE):
        try:  # Sanic's internal: it passes these settings to each worker it starts
            server: dict[str, Any] = app.state.server_info[0].settings
        except (AttributeError, IndexError) as e:
            where = "the settings this Sanic hands its workers (state.server_info)"
            raise CannotServe(f"tlsreload cannot find {where}: {e!r}") from e
        found = _identities(server.get("ssl"))
        if found is None:
            log.warning("no certificate given to Sanic: serving without TLS, nothing to reload")
            return
        if server.get("version") == 3:
            raise CannotServe("HTTP/3 cannot follow certificate reloads: Sanic gives aioquic the files once")
        strict, entries = found
        settings = _settings.get(app.name, Settings())
        _refuse_sni_beside_a_list(settings, strict or len(entries) > 1)
        publications = [_read_for_workers(entry, settings) for entry in entries]
    server["ssl"] = [None, *entries] if strict else entries if len(entries) > 1 else entries[0]
    # Sanic warns of any object in shared_ctx that is not multiprocessing's or ctypes': these are paths, which pickle.
    vars(app.shared_ctx)[PUBLICATIONS] = publications


def _read_for_workers(entry: Entry, settings: Settings) -> str:
    """``entry``'s files checked now, and read for the workers by a reader of their own (closed at this process's
    exit): where it publishes."""
    files, password = _files(entry), resolve_password(entry.get("password"))
    recipe = functools.partial(_sanic_context, entry, files, password)
    reader = check_at_start(files, recipe, password, settings, reader=True)
    assert reader is not None
    _readers.append(reader)
    return reader.directory


def _identities(data: Any) -> tuple[bool, list[Entry]] | None:
    """Sanic's TLS setting, as Sanic or :func:`_before_workers` left it: (no fallback certificate, entries)."""
    if not data:
        return None
    if isinstance(data, CertSelector):
        return data.sanic_fallback is None, [_entry(getattr(context, "sanic", {})) for context in data.sanic_select]
    if isinstance(data, ssl.SSLContext):
        sanic = getattr(data, "sanic", None)
        if not isinstance(sanic, dict):
            raise CannotServe(
                "Sanic was given an ssl.SSLContext, which cannot follow its files: give Sanic the files "
                "(ssl={'cert': ..., 'key': ...}, a directory, a list of them, --cert/--key, --tls)"
            )
        return False, [_entry(sanic)]  # CertSimple: a single process, which Sanic hands its context
    if isinstance(data, dict):
        return False, [data]
    entries = list(data)
    return entries[0] is None, [entry for entry in entries if entry is not None]


def _entry(sanic: Entry) -> Entry:
    """A certificate's settings from what Sanic keeps on its context (the subject's fields too): names are kept
    only when they are not the ones Sanic reads from the certificate (they were given)."""
    entry: Entry = {key: sanic[key] for key in ("cert", "key", "password", "ca_certs", "crl") if key in sanic}
    try:
        read = getattr(_sanic_context(entry, _files(entry), entry.get("password")), "sanic", {}).get("names")
    except Exception:  # unusable now: keep the names Sanic found
        read = None
    if "names" in sanic and sanic["names"] != read:
        entry["names"] = sanic["names"]
    return entry


def _refuse_sni_beside_a_list(settings: Settings, several: bool) -> None:
    directories = resolve_directories(settings.sni) if several else []  # ValueError: a bad setting
    if directories:  # SNI routing is the reloader's own context's, which a list of certificates never serves
        raise CannotServe(f"cannot serve TLS: put the identities of {', '.join(directories)} in Sanic's list instead")


def _files(entry: Entry) -> TLSFiles:
    ca_certs, crl = (str(entry[key]) if entry.get(key) else None for key in ("ca_certs", "crl"))
    return TLSFiles(str(entry["cert"]), str(entry["key"]), ca_certs, crl)


def _sanic_context(entry: Entry, files: TLSFiles, password: Password) -> ssl.SSLContext:
    """Sanic's own context for ``files`` (``CertSimple``), with ``entry``'s names when given."""
    names = {"names": entry["names"]} if "names" in entry else {}
    key, secret = files.keyfile or files.certfile, password_text(password)
    context: ssl.SSLContext = CertSimple(files.certfile, key, password=secret, **names)  # type: ignore[no-untyped-call]
    if files.ca_certs:
        context.load_verify_locations(files.ca_certs)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _reloader(entry: Entry, settings: Settings, publication: str | None) -> Reloader:
    files, password = _files(entry), resolve_password(entry.get("password"))
    # A worker Sanic restarts while nothing valid exists waits for usable files; Sanic stops a worker with
    # SIGTERM (a restart) or SIGINT (shutdown).
    return start_reloader(
        files,
        lambda: _sanic_context(entry, files, password),
        lambda other: _sanic_context(entry, other, password),
        password=password,
        settings=settings,
        waiting=waiting_in_spawned_worker() if publication is not None else None,
        publication=publication,
    )


class _Selector(CertSelector):
    """Sanic's ``CertSelector`` made a server context (Sanic's own is ``ssl.SSLContext()``, which warns)."""

    def __new__(cls, contexts: Any) -> _Selector:
        return ssl.SSLContext.__new__(cls, ssl.PROTOCOL_TLS_SERVER)


def _selector(made: list[Reloader], strict: bool) -> ssl.SSLContext:
    """Sanic's ``CertSelector`` over the newest context of each reloader, following each reload. A connection
    keeps its first context's protocol bounds, options and verify mode: the first certificate's, here.

    Each reload makes a new selector that new connections are created on (its own session cache: no session made
    before the reload resumes after it, whatever the client-CA bundles became). A connection created on the one it
    replaces whose ClientHello comes after the reload gets the newest selector's context, and its handshake refuses
    a session resumed from the old selector's cache (:mod:`tlsreload_plugins.resumption`)."""
    # Sanic raises ValueError for a certificate with no names to select it by: a failed start, one line.
    first = _Selector([None] * strict + [reloader.newest_context for reloader in made])
    current, select = [first], first.sni_callback  # Sanic's: picks the context by server name

    def follow(old: Leaf, new: Leaf) -> None:
        following = _Selector.__new__(_Selector, None)  # not __init__: Sanic would log its vhosts on every reload
        following.sni_callback = select
        following.sanic_select = [reloader.newest_context for reloader in made]
        following.sanic_fallback = None if strict else following.sanic_select[0]
        keep_fixed_settings(made[0].newest_context, following)
        check_handshakes(following)
        replaced, current[0] = current[0], following
        replaced.sni_callback = straddled

    def straddled(conn: ssl.SSLObject, server_name: str, replaced: ssl.SSLContext) -> int | None:
        """The ClientHello callback of a selector a reload replaced: a connection created on it before the reload."""
        if select is None or not refuse_if_resumed(conn):
            return ssl.ALERT_DESCRIPTION_HANDSHAKE_FAILURE
        result: int | None = select(conn, server_name, current[0])
        return result

    keep_fixed_settings(made[0].newest_context, first)
    check_handshakes(first)
    create_connections_on(first, lambda: current[0])
    for reloader in made:
        reloader.add_callbacks(on_reload=follow)
    return first


def _route_logs() -> None:
    logs.forward_to(logging.getLogger("sanic.error"))


reload_certificates: Callable[..., None] = renamed(reloading, "reload_certificates", "tlsreload_plugins.sanic")
"""Deprecated: :func:`reloading` (the name of an earlier release, for one more; it warns)."""
