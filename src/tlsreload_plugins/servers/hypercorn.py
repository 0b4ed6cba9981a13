"""hypercorn glue: a drop-in command and a ``Config`` subclass whose TLS context follows the files.

* ``tlsreload-hypercorn app:app --certfile C --keyfile K [any hypercorn option]`` is hypercorn's own command
  plus the ``--tls-*`` options; every worker class (asyncio, uvloop, trio), ``--workers`` and ``-c`` work.
* :class:`ReloadingConfig` is ``hypercorn.config.Config`` with a reloading ``create_ssl_context``, for code
  that calls ``hypercorn.asyncio.serve`` or ``hypercorn.trio.serve`` itself.

Where the context is built: hypercorn calls ``create_ssl_context()`` once per worker, inside the worker's
running loop; the recipe is hypercorn's own ``Config.create_ssl_context``, and the checks run from that
loop (:func:`~tlsreload_plugins.drivers.check_from_running_loop`) until it ends. Worker lifecycle: spawned;
the parent checks the files and keeps the newest valid identity in a
:class:`~tlsreload_plugins.lastgood.SharedStore` on the ``Config``, which hypercorn passes to each worker
it starts (start-up, SIGHUP, ``--reload``); a worker with nothing valid waits instead of exiting (on which
hypercorn stops the whole server). HTTP/3 is refused: hypercorn hands aioquic the certificate *files* once.
See docs/hypercorn.md.
"""

from __future__ import annotations

import copy
import functools
import importlib
import logging
import multiprocessing
import os
import signal
import ssl
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from hypercorn.config import Config

from .. import logs
from ..drivers import AsyncioDriver, TrioDriver, check_from_running_loop
from ..identity import InvalidIdentity, Password, TLSFiles, password_text
from ..lastgood import SharedStore
from ..reloader import Recipe, Reloader, resolve_expiry_warning_days, resolve_interval, resolve_password
from ..serving import CannotServe, Settings, Waiting, add_options, check_at_start, keep_for_workers, start_reloader

__all__ = ["STARTUP_FAILURE", "ReloadingConfig", "main", "reloaders"]

if TYPE_CHECKING:
    import argparse  # the command line's: not imported in the worker processes, which import this module too

log = logging.getLogger("tlsreload_plugins.hypercorn")

STARTUP_FAILURE = 1
"""Exit status when the certificate files or settings are not usable at start-up."""

# -- the reloaders of this process ---------------------------------------------------------
# One per create_ssl_context() call: one per worker process, or per serve() call.
_drivers: dict[Reloader, AsyncioDriver | TrioDriver] = {}


def reloaders() -> list[Reloader]:
    """The reloaders :class:`ReloadingConfig` made in this process (for health checks, metrics)."""
    return list(_drivers)


def _startup_failure(message: str, *args: object) -> NoReturn:
    log.error(message, *args)
    sys.exit(STARTUP_FAILURE)


# -- the configuration ---------------------------------------------------------------------


class ReloadingConfig(Config):
    """``hypercorn.config.Config`` whose TLS context follows the certificate files on disk.

    Use it wherever a ``Config`` goes: ``ReloadingConfig()``, ``ReloadingConfig.from_toml(path)``,
    ``from_mapping``, ``from_object``. Besides hypercorn's settings it reads
    ``tls_reload_interval`` (seconds between checks; ``None``: ``$TLSRELOAD_INTERVAL``, else 1),
    ``tls_sni`` (directories of more identities chosen by server name; ``None``:
    ``$TLSRELOAD_SNI``; see :mod:`tlsreload_plugins.sni`) and ``tls_metrics`` (export Prometheus
    metrics; ``None``: ``$TLSRELOAD_METRICS``, else off; see :mod:`tlsreload_plugins.metrics`).

    Example::

        config = ReloadingConfig()
        config.bind = ["0.0.0.0:8443"]
        config.certfile, config.keyfile = "tls.crt", "tls.key"
        config.check_tls_files()  # unusable files: one error line and exit 1, before serving
        asyncio.run(hypercorn.asyncio.serve(app, config))  # or trio.run(hypercorn.trio.serve, app, config)
    """

    tls_reload_interval: float | None = None
    tls_sni: list[str] | None = None
    tls_metrics: bool | None = None
    _tls_last_good: SharedStore | None = None  # see _last_good()

    def create_ssl_context(self) -> ssl.SSLContext | None:
        """hypercorn's own context, made to follow the files: called by hypercorn in each worker.

        Unusable files are served from the last good identity kept on this config (see the module
        docstring); with none valid, a worker hypercorn started waits for usable files. Otherwise,
        unusable files or settings log one ERROR and exit with :data:`STARTUP_FAILURE` (under trio,
        hypercorn's nurseries add a traceback: call :meth:`check_tls_files` before serving to fail
        without one).
        """
        if not self.ssl_enabled:
            return super().create_ssl_context()
        logs.forward_to(getattr(self.log, "error_logger", None))
        self._refuse_quic()
        password = resolve_password(self.keyfile_password)
        stopping = _hypercorn_shutdown_event()
        # A worker hypercorn started waits for usable files rather than exit non-zero, on which hypercorn's
        # parent stops the whole server; it leaves when hypercorn stops its workers, or on SIGTERM.
        waiting = Waiting(
            leave=_leave_now,
            every=resolve_interval(self.tls_reload_interval),
            signals=(signal.SIGTERM,),
            stopped=stopping.is_set if stopping is not None else lambda: False,
        )
        try:
            reloader = start_reloader(
                self._files(),
                self._recipe(password),
                lambda other: self._recipe(password, other)(),
                password=password,
                settings=self._settings(),
                store=self._last_good(),
                waiting=waiting if stopping is not None else None,
            )
        except (CannotServe, ValueError) as e:  # ValueError: a bad interval
            _startup_failure("%s", e if isinstance(e, CannotServe) else f"cannot serve TLS: {e}")
        driver = check_from_running_loop(reloader)
        if driver is None:
            # hypercorn has always built the context inside its worker's loop; if a new version does
            # not, nothing would ever check the files: refuse rather than serve a frozen certificate.
            _startup_failure(
                "create_ssl_context() was called outside a running asyncio or trio loop (hypercorn %s), so "
                "nothing could check the certificate files; tlsreload does not support this hypercorn",
                _hypercorn_version(),
            )
        _drivers[reloader] = driver
        return reloader.context

    def check_tls_files(self) -> None:
        """Decide now, as the first reload would, whether the TLS files and settings are usable.

        Logs one ERROR line (through hypercorn's error log) and exits with :data:`STARTUP_FAILURE`
        when they are not; warns when no certificate is configured. The drop-in command calls it
        once before starting workers.
        """
        logs.forward_to(getattr(self.logger_class(self), "error_logger", None))  # not self.log: pickled to workers
        if not self.ssl_enabled:
            log.warning("no --certfile and --keyfile given: serving without TLS, nothing to reload")
            return
        self._refuse_quic()
        password = resolve_password(self.keyfile_password)
        try:
            check_at_start(self._files(), self._recipe(password), password, self._settings(), self._last_good())
        except CannotServe as e:
            _startup_failure("%s", e)

    def _settings(self) -> Settings:
        return Settings(self.tls_reload_interval, self.tls_sni, self.tls_metrics)

    def _files(self) -> TLSFiles:
        return TLSFiles(str(self.certfile), str(self.keyfile), str(self.ca_certs) if self.ca_certs else None)

    def _last_good(self) -> SharedStore:
        """The last good identity, kept on this config: shared with each worker hypercorn starts."""
        if self._tls_last_good is None:
            self._tls_last_good = SharedStore()
        return self._tls_last_good

    def _recipe(self, password: Password, files: TLSFiles | None = None) -> Recipe:
        """hypercorn's own ``Config.create_ssl_context``, on this config's files or on ``files``; with the
        password of ``$TLSRELOAD_KEY_PASSWORD_FILE`` (read again on each call) when ``keyfile_password`` is unset."""

        def hypercorn_context() -> ssl.SSLContext:
            config = self
            if files is not None or (self.keyfile_password is None and password is not None):
                config = copy.copy(self)
            if files is not None:
                config.certfile, config.keyfile, config.ca_certs = files.certfile, files.keyfile, files.ca_certs
            if self.keyfile_password is None and password is not None:
                config.keyfile_password = password_text(password)
            context = Config.create_ssl_context(config)
            if context is None:  # ssl_enabled was checked before: the files were unset since
                raise InvalidIdentity("hypercorn built no SSL context: certfile or keyfile is no longer set")
            return context

        return hypercorn_context

    def _refuse_quic(self) -> None:
        if self.quic_bind:
            _startup_failure(
                "HTTP/3 (--quic-bind %s) cannot follow certificate reloads: hypercorn gives aioquic the "
                "certificate files once, at start-up. Serve HTTP/3 with stock hypercorn (restart it to "
                "rotate), or drop --quic-bind",
                " ".join(self.quic_bind),
            )


# -- a worker with nothing valid to serve --------------------------------------------------


def _hypercorn_shutdown_event() -> Any | None:
    """The event hypercorn's parent sets to stop its workers (SIGHUP, ``--reload``, shutdown), or ``None``
    outside a worker it started. hypercorn hands it only to the worker function, as the keyword argument
    ``shutdown_event`` of the process (``asyncio_worker(config, sockets, shutdown_event)``), which the
    process object keeps."""
    kwargs = getattr(multiprocessing.current_process(), "_kwargs", None)
    event = kwargs.get("shutdown_event") if isinstance(kwargs, dict) else None
    return event if callable(getattr(event, "is_set", None)) else None


def _leave_now() -> NoReturn:
    # Not sys.exit(): under trio, hypercorn's nurseries turn SystemExit into an exception group, status 1.
    # The app's lifespan shutdown does not run (its start-up did: hypercorn builds the context after it).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# -- the drop-in command -------------------------------------------------------------------


def _serve(
    config: Config, *, interval: float | None, sni_directories: list[str] | None = None, metrics: bool | None = None
) -> int:
    """What hypercorn's command runs, given the Config it built: the same, reloading."""
    reloading = ReloadingConfig()
    vars(reloading).update(vars(config))  # every setting, from the command line and -c alike
    if interval is not None:
        reloading.tls_reload_interval = interval
    if sni_directories:
        reloading.tls_sni = sni_directories
    if metrics:
        reloading.tls_metrics = True
    reloading.check_tls_files()
    if reloading.ssl_enabled and reloading.workers > 0:
        # hypercorn starts workers later too (SIGHUP, --reload): each gets the newest valid pair seen here.
        password = resolve_password(reloading.keyfile_password)
        keep_for_workers(reloading._files(), password, reloading._settings(), reloading._last_good())
    import hypercorn.run

    return hypercorn.run.run(reloading)


def _hypercorn_version() -> str:
    import importlib.metadata  # only for an error message: it costs a worker about 2 MiB (email, csv, zipfile)

    return importlib.metadata.version("hypercorn")


def _parser() -> argparse.ArgumentParser:
    import argparse

    parser = argparse.ArgumentParser(prog="tlsreload-hypercorn", add_help=False, allow_abbrev=False)
    add_options(parser)
    return parser


def main(args: Sequence[str] | None = None) -> None:
    """``tlsreload-hypercorn``: hypercorn's command line, reloading certificates."""
    parser = _parser()
    options, rest = parser.parse_known_args(sys.argv[1:] if args is None else list(args))
    import hypercorn.run  # the command line's: a worker process imports this module without it

    cli: Any = importlib.import_module("hypercorn.__main__")
    if {"-h", "--help"} & set(rest):
        try:
            cli.main(rest)
        finally:
            parser.print_help()
    try:
        interval = options.tls_reload_interval
        resolve_interval(interval)
        resolve_expiry_warning_days()
    except ValueError as e:
        parser.error(f"argument --tls-reload-interval: {e}" if interval is not None else str(e))
    # hypercorn's command parses its options into a Config and hands it to the module global
    # `run`: run that very command with ours in its place, so every option keeps its meaning.
    if cli.run is not hypercorn.run.run or "run" not in cli.main.__code__.co_names:
        default = Config()
        logs.forward_to(getattr(default.logger_class(default), "error_logger", None))
        _startup_failure(
            "tlsreload-hypercorn does not know how this hypercorn (%s) starts its server: "
            "hypercorn.__main__.main no longer hands its Config to hypercorn.run.run",
            _hypercorn_version(),
        )
    cli.run = functools.partial(_serve, interval=interval, sni_directories=options.tls_sni, metrics=options.tls_metrics)
    if args is None:
        sys.argv[1:] = rest  # hypercorn's main reads sys.argv when given no arguments
    try:
        code = cli.main(rest)
    finally:
        cli.run = hypercorn.run.run
    sys.exit(code)


if __name__ == "__main__":
    # Run the importable module, not this __main__ copy: the workers unpickle the Config by the
    # name tlsreload_plugins.hypercorn.ReloadingConfig.
    from tlsreload_plugins.hypercorn import main as _main

    _main()
