"""Tornado glue: ``HTTPServer(app, ssl_options=reloading(ssl_options).context())``, alone or forked.

How it is configured: Tornado's own ``ssl_options`` dictionary (``certfile``, ``keyfile``, ``ca_certs``,
``cert_reqs``, ``ciphers``, ``ssl_version``), plus tlsreload's settings as keyword arguments and the
``TLSRELOAD_*`` variables. Where its context is built: Tornado's ``tornado.netutil.ssl_options_to_context``
is the recipe, so the verify mode, ciphers and protocol are Tornado's on every reload (the key is
loaded with the password of ``password_file`` or ``$TLSRELOAD_KEY_PASSWORD_FILE``, which the
dictionary has no key for). Tornado wraps each accepted connection with the context it was given: new
connections get the newest valid certificate, established ones keep theirs.

Worker lifecycle: :func:`reloading` checks the files once, in the process that starts the server. Under
``tornado.process.fork_processes`` that is the parent: just before its first ``fork()`` (an ``os.register_at_fork``
hook) it starts the server's one reader of the files (:mod:`tlsreload_plugins.publication`), and no thread runs
there. Each process that serves then calls :meth:`ReloadingTLS.context` before its event loop starts; it gets a
reloader checked in a daemon thread, which loads only what the reader published (a process that never forked reads
the files itself, and pays for no reader). A child ``fork_processes`` restarts (one that crashed or was killed) serves
the newest identity the reader published, whatever the files hold then; the reader, gone meanwhile, is started again
before that fork.
"""

from __future__ import annotations

import logging
import os
import ssl
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn

from tlsreload_plugins.authorization import Authorizer
from tlsreload_plugins.drivers import ThreadDriver
from tlsreload_plugins.files import Password, TLSFiles
from tlsreload_plugins.files import password_file as password_in_file
from tlsreload_plugins.memory_files import RecipeFor
from tlsreload_plugins.publication.reader import ReaderFailed, ReaderProcess
from tlsreload_plugins.reloader import Reloader
from tlsreload_plugins.renamed import renamed
from tlsreload_plugins.serving.start import Settings, Waiting, check_at_start, start_reader, start_reloader
from tlsreload_plugins.settings import resolve_password

__all__ = ["ReloadingTLS", "reloaders", "reloading"]

log: logging.Logger = logging.getLogger("tlsreload_plugins.tornado")

SSL_OPTIONS = ("ssl_version", "certfile", "keyfile", "cert_reqs", "ca_certs", "ciphers")
"""The keys of Tornado's ``ssl_options`` dictionary (``tornado.netutil.ssl_options_to_context``)."""

MISSING_EXTRA = "pip install 'tlsreload-plugins[tornado]'"


class ReloadingTLS:
    """The TLS identity of one Tornado server, checked at start, kept for every process that serves it.

    Made by :func:`reloading` (no public constructor). :meth:`context` in each serving process.
    """

    def __init__(self, files: TLSFiles, recipe_for: RecipeFor, password: Password, settings: Settings) -> None:
        self.files = files
        self._recipe_for = recipe_for
        self._password = password
        self._settings = settings
        self._serving: dict[int, tuple[Reloader, ThreadDriver]] = {}
        self._starter = os.getpid()
        self._reader: ReaderProcess | None = None

    def before_fork(self) -> None:
        """Start the server's reader of the files, or start it again when it has gone: called just before every
        ``fork()`` of the process that made this object (``fork_processes`` starting or restarting a child), as
        long as that process serves nothing itself. Never raises: a reader that cannot start is one ERROR line,
        and the children then read the files themselves."""
        if os.getpid() != self._starter or os.getpid() in self._serving:
            return
        try:
            if self._reader is not None:
                self._reader.again()
                return
            self._reader = start_reader(self.files, self._password, self._settings)
        except (ReaderFailed, ValueError) as e:
            log.error("cannot start the TLS reader (each process reads the TLS files itself): %s", e)
        except Exception:  # in a fork hook, where nothing may stop the fork
            log.exception("cannot start the TLS reader (each process reads the TLS files itself)")

    def context(self, stopped: Callable[[], bool] = lambda: False) -> ssl.SSLContext:
        """This process's :class:`ssl.SSLContext`, checked in a daemon thread until :meth:`close`; the same
        one on every call in a process. Call it in each process that serves, before its event loop runs
        (it reads the files, and may wait for usable ones), and never in a parent before
        ``fork_processes`` (a thread running across ``fork()`` can leave OpenSSL's locks held in the child).

        Args:
            stopped: while this process waits for usable files (restarted with nothing valid to serve),
                a stop request to look at every 0.1 s besides SIGTERM, SIGINT and SIGQUIT: true, it exits
                with status 0.

        Raises:
            CannotServe: nothing valid to serve, in the files nor in what the reader published (a bad setting):
                one line.
        """
        pid = os.getpid()
        serving = self._serving.get(pid)
        if serving is not None:
            return serving[0].context
        files = self.files
        reloader = start_reloader(
            files,
            lambda: self._recipe_for(files),
            self._recipe_for,
            password=self._password,
            settings=self._settings,
            waiting=Waiting(leave=_leave, stopped=stopped),
            publication=self._reader.directory if self._reader is not None else None,
        )
        driver = ThreadDriver(reloader).start()
        self._serving = {pid: (reloader, driver)}  # a forked child inherits its parent's entries, not their threads
        return reloader.context

    def reloader(self) -> Reloader | None:
        """This process's :class:`~tlsreload_plugins.Reloader`, or ``None`` before :meth:`context`."""
        serving = self._serving.get(os.getpid())
        return serving[0] if serving is not None else None

    def close(self) -> None:
        """Stop this process's checks (the context keeps serving its certificate). Idempotent."""
        serving = self._serving.pop(os.getpid(), None)
        if serving is not None:
            serving[1].stop()


_made: list[ReloadingTLS] = []


def reloaders() -> list[Reloader]:
    """The reloaders serving TLS in this process (for health checks, metrics)."""
    return [reloader for tls in _made if (reloader := tls.reloader()) is not None]


def _leave() -> NoReturn:
    log.info("process %s stops without having served", os.getpid())
    sys.exit(0)  # fork_processes restarts a child that exits non-zero


def _tornado_recipe(ssl_options: Mapping[str, Any], password: Password) -> RecipeFor:
    """Tornado's ``ssl_options_to_context`` with the files of each call, the key loaded with ``password``."""
    try:
        from tornado.netutil import ssl_options_to_context
    except ImportError as e:
        raise ImportError(f"Tornado is not installed: {MISSING_EXTRA}") from e
    fixed = {key: value for key, value in ssl_options.items() if key not in ("certfile", "keyfile", "ca_certs")}

    def tornado_context(files: TLSFiles) -> ssl.SSLContext:
        options = {**fixed, "ca_certs": files.ca_certs} if files.ca_certs else dict(fixed)
        context = ssl_options_to_context(options, server_side=True)
        context.load_cert_chain(files.certfile, files.keyfile, password)
        return context

    return tornado_context


def reloading(
    ssl_options: Mapping[str, Any],
    *,
    crl: str | None = None,
    password_file: str | None = None,
    sni: Iterable[str] | str | None = None,
    interval: float | None = None,
    metrics: bool | None = None,
    authorize: Authorizer | Callable[[str], bool] | str | None = None,
) -> ReloadingTLS:
    """Check Tornado's ``ssl_options`` files now and keep them for every process that serves.

    Call it once where the server starts: before ``tornado.process.fork_processes`` when forking. Then
    ``HTTPServer(app, ssl_options=tls.context())`` in each serving process, before its loop runs.

    Args:
        ssl_options: Tornado's dictionary; ``certfile`` is required, ``keyfile`` and ``ca_certs`` are
            reloaded with it (``ca_certs`` with ``cert_reqs=ssl.CERT_REQUIRED`` is mutual TLS).
        crl: a PEM file of CRLs for the CAs of ``ca_certs``, reloaded with it (default ``$TLSRELOAD_CRL``): client
            certificates they revoke are refused (Tornado's ``ssl_options`` has no key for it).
        password_file: a file whose first line is the key's password, read again on each reload (default
            ``$TLSRELOAD_KEY_PASSWORD_FILE``, else none).
        sni: directories of more identities, chosen by server name (default ``$TLSRELOAD_SNI``).
        interval: seconds between checks, at least 0.1 (default ``$TLSRELOAD_INTERVAL``, else 1).
        metrics: export Prometheus metrics (default ``$TLSRELOAD_METRICS``, else off).
        authorize: who may connect, by SPIFFE ID (else ``$TLSRELOAD_SPIFFE_AUTHORIZE``): as ``serving.Settings``.

    Returns:
        A :class:`ReloadingTLS`: ``context()`` in each serving process, ``close()`` when it stops.

    Raises:
        CannotServe: the files or a setting cannot serve now: one line naming the file and what is wrong.
        ValueError: ``ssl_options`` has no ``certfile``, or a key Tornado does not know.

    Example::

        tls = reloading({"certfile": "/etc/tls/tls.crt", "keyfile": "/etc/tls/tls.key"})
        sockets = tornado.netutil.bind_sockets(8443)
        tornado.process.fork_processes(2)  # or not: the same lines serve one process
        server = HTTPServer(app, ssl_options=tls.context())
        server.add_sockets(sockets)
    """
    unknown = sorted(set(ssl_options) - set(SSL_OPTIONS))
    if unknown:
        raise ValueError(f"ssl_options has keys Tornado does not know: {', '.join(unknown)} (it knows {SSL_OPTIONS})")
    if not ssl_options.get("certfile"):
        raise ValueError("ssl_options has no certfile: there is no certificate to serve")
    keyfile, ca_certs = ssl_options.get("keyfile"), ssl_options.get("ca_certs")
    files = TLSFiles(
        str(ssl_options["certfile"]),
        str(keyfile) if keyfile else None,
        str(ca_certs) if ca_certs else None,
    )
    password = resolve_password(password_in_file(password_file) if password_file else None)
    recipe_for = _tornado_recipe(ssl_options, password)
    settings = Settings(interval, sni, metrics, crl, authorize)
    check_at_start(files, lambda: recipe_for(files), password, settings)
    tls = ReloadingTLS(files, recipe_for, password, settings)
    os.register_at_fork(before=tls.before_fork)  # fork_processes forks with os.fork(), and has no hook of its own
    _made.append(tls)
    return tls


reloading_tls: Callable[..., ReloadingTLS] = renamed(reloading, "reloading_tls", "tlsreload_plugins.tornado")
"""Deprecated: :func:`reloading` (the name of an earlier release, for one more; it warns)."""
