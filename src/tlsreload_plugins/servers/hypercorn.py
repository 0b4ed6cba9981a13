"""hypercorn glue: a drop-in command and a ``Config`` subclass whose TLS context follows the files.

* ``tlsreload-hypercorn app:app --certfile C --keyfile K [any hypercorn option]`` is hypercorn's own command
  plus the ``--tls-*`` options; every worker class (asyncio, uvloop, trio), ``--workers`` and ``-c`` work.
* :class:`ReloadingConfig` is ``hypercorn.config.Config`` with a reloading ``create_ssl_context``, for code
  that calls ``hypercorn.asyncio.serve`` or ``hypercorn.trio.serve`` itself.

Where the context is built: hypercorn calls ``create_ssl_context()`` once per worker, inside the worker's
running loop; the recipe is hypercorn's own ``Config.create_ssl_context``, and the checks run from that
loop (:func:`~tlsreload_plugins.drivers.check_from_running_loop`) until it ends. Worker lifecycle: spawned;
the parent checks the files and starts the server's one reader of them (:mod:`tlsreload_plugins.publication`),
whose publication reaches each worker hypercorn starts (start-up, SIGHUP, ``--reload``) on the ``Config``; a worker
with nothing valid waits instead of exiting (on which hypercorn stops the whole server). HTTP/3 is refused: hypercorn
hands aioquic the certificate *files* once.
See docs/hypercorn.md.
"""

from __future__ import annotations

import functools
import importlib
import logging
import signal
import ssl
import sys
from collections.abc import Sequence
from typing import Any

from hypercorn.config import Config

from tlsreload_plugins.drivers import check_from_running_loop
from tlsreload_plugins.errors import InvalidIdentity
from tlsreload_plugins.publication.reader import ReaderProcess
from tlsreload_plugins.serving import logs
from tlsreload_plugins.serving.configured import check_config_at_start, start_from_config
from tlsreload_plugins.serving.lifespan import register, reloaders
from tlsreload_plugins.serving.options import add_options, argparse_settings
from tlsreload_plugins.serving.start import CannotServe, Settings, exit_if_cannot_serve
from tlsreload_plugins.serving.workers import waiting_in_spawned_worker
from tlsreload_plugins.settings import resolve_interval

__all__ = ["ReloadingConfig", "main", "reloaders"]

log: logging.Logger = logging.getLogger("tlsreload_plugins.hypercorn")

_readers: list[ReaderProcess] = []
"""The readers this process started (the parent of hypercorn's workers): each closes at its exit."""

STARTUP_FAILURE = 1
"""Exit status when the certificate files or settings are not usable at start-up."""

NAMES = ("certfile", "keyfile", "ca_certs", "keyfile_password")  # hypercorn's files and key password


class ReloadingConfig(Config):
    """``hypercorn.config.Config`` whose TLS context follows the certificate files on disk.

    Use it wherever a ``Config`` goes: ``ReloadingConfig()``, ``ReloadingConfig.from_toml(path)``,
    ``from_mapping``, ``from_object``. Besides hypercorn's settings it reads
    ``tls_reload_interval`` (seconds between checks; ``None``: ``$TLSRELOAD_INTERVAL``, else 1),
    ``tls_sni`` (directories of more identities chosen by server name; ``None``:
    ``$TLSRELOAD_SNI``; see :mod:`tlsreload_plugins.sni.identities`), ``tls_metrics`` (export Prometheus
    metrics; ``None``: ``$TLSRELOAD_METRICS``, else off; see :mod:`tlsreload_plugins.metrics`) and ``tls_crl`` (a PEM
    file of CRLs for the CAs of ``ca_certs``, reloaded with it; ``None``: ``$TLSRELOAD_CRL``, else none) and
    ``tls_spiffe_authorize`` (which clients may connect, by SPIFFE ID, in the syntax of
    :func:`~tlsreload_plugins.authorization.parse_authorizer`; ``None``: ``$TLSRELOAD_SPIFFE_AUTHORIZE``, else any the
    server's own settings accept). :func:`reloaders` lists the reloaders it made in this process.

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
    tls_crl: str | None = None
    tls_spiffe_authorize: str | None = None
    _tls_publication: str | None = None  # where the parent's reader publishes, for the workers it starts

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
        _route_logs(self.log)
        with exit_if_cannot_serve(STARTUP_FAILURE):
            self._refuse_quic()
            # A worker hypercorn started leaves when hypercorn stops its workers (its shutdown event), or on SIGTERM.
            waiting = waiting_in_spawned_worker(
                stop_event="shutdown_event",
                signals=(signal.SIGTERM,),
                every=resolve_interval(self.tls_reload_interval),
                at_once=True,
            )
            reloader = start_from_config(
                self,
                _hypercorn_context,
                names=NAMES,
                settings=self._settings(),
                waiting=waiting,
                publication=self._tls_publication,
            )
            driver = check_from_running_loop(reloader)
            if driver is None:  # hypercorn has always built it in the worker's loop: else nothing would check
                raise CannotServe(
                    f"create_ssl_context() was called outside a running asyncio or trio loop (hypercorn "
                    f"{_hypercorn_version()}), so nothing could check the certificate files; tlsreload does not "
                    "support this hypercorn"
                )
        register(reloader, driver)
        return reloader.context

    def check_tls_files(self) -> None:
        """Decide now, as the first reload would, whether the TLS files and settings are usable.

        Logs one ERROR line (through hypercorn's error log) and exits with :data:`STARTUP_FAILURE`
        when they are not; warns when no certificate is configured. The drop-in calls it once
        before starting workers.
        """
        self._check_in_parent(spawns=False)

    def _check_in_parent(self, *, spawns: bool) -> None:
        _route_logs(self.logger_class(self))  # not self.log, which would be pickled to the workers
        if not self.ssl_enabled:
            log.warning("no --certfile and --keyfile given: serving without TLS, nothing to reload")
            return
        with exit_if_cannot_serve(STARTUP_FAILURE):
            self._refuse_quic()
            reader = check_config_at_start(
                self, _hypercorn_context, names=NAMES, settings=self._settings(), reader=spawns
            )
            if reader is not None:  # the parent holds it (it is closed at the parent's exit); the workers its path
                _readers.append(reader)
                self._tls_publication = reader.directory

    def _settings(self) -> Settings:
        return Settings(
            self.tls_reload_interval, self.tls_sni, self.tls_metrics, self.tls_crl, self.tls_spiffe_authorize
        )

    def _refuse_quic(self) -> None:
        if self.quic_bind:
            raise CannotServe(
                f"HTTP/3 (--quic-bind {' '.join(self.quic_bind)}) cannot follow certificate reloads: hypercorn "
                "gives aioquic the certificate files once, at start-up. Serve HTTP/3 with stock hypercorn "
                "(restart it to rotate), or drop --quic-bind"
            )


def _hypercorn_context(config: Config) -> ssl.SSLContext:
    context = Config.create_ssl_context(config)  # hypercorn's own, also for a ReloadingConfig
    if context is None:  # ssl_enabled was checked before: the files were unset since
        raise InvalidIdentity("hypercorn built no SSL context: certfile or keyfile is no longer set")
    return context


def _route_logs(hypercorn_logger: Any) -> None:
    logs.forward_to(getattr(hypercorn_logger, "error_logger", None))


def _hypercorn_version() -> str:
    import importlib.metadata  # only for an error message: it imports email, csv and zipfile

    return importlib.metadata.version("hypercorn")


# -- the drop-in command -------------------------------------------------------------------


def _serve(config: Config, *, settings: Settings) -> int:
    """What hypercorn's command runs, given the Config it built: the same, reloading."""
    reloading = ReloadingConfig()
    vars(reloading).update(vars(config))  # every setting, from the command line and -c alike
    if settings.interval is not None:
        reloading.tls_reload_interval = settings.interval
    reloading.tls_sni = list(settings.sni) if settings.sni else reloading.tls_sni
    reloading.tls_metrics = settings.metrics or reloading.tls_metrics
    reloading.tls_crl = settings.crl or reloading.tls_crl
    if isinstance(settings.authorize, str):  # the option's text: pickled to the workers, parsed in each
        reloading.tls_spiffe_authorize = settings.authorize
    # hypercorn starts workers later too (SIGHUP, --reload): each gets the newest valid identity seen here.
    reloading._check_in_parent(spawns=reloading.workers > 0)
    import hypercorn.run

    return hypercorn.run.run(reloading)


def main(args: Sequence[str] | None = None) -> None:
    """``tlsreload-hypercorn``: hypercorn's command line, reloading certificates.

    Example: ``main(["app:app", "--certfile", "tls.crt", "--keyfile", "tls.key", "--workers", "2"])``.
    """
    import argparse

    parser = argparse.ArgumentParser(prog="tlsreload-hypercorn", add_help=False, allow_abbrev=False)
    add_options(parser)
    options, rest = parser.parse_known_args(sys.argv[1:] if args is None else list(args))
    import hypercorn.run  # the command line's: a worker process imports this module without it

    cli: Any = importlib.import_module("hypercorn.__main__")
    if {"-h", "--help"} & set(rest):
        try:
            cli.main(rest)
        finally:
            parser.print_help()
    settings = argparse_settings(parser, options)
    # hypercorn's command parses its options into a Config and hands it to the module global
    # `run`: run that very command with ours in its place, so every option keeps its meaning.
    with exit_if_cannot_serve(STARTUP_FAILURE):
        if cli.run is not hypercorn.run.run or "run" not in cli.main.__code__.co_names:
            _route_logs(Config().log)
            raise CannotServe(
                f"tlsreload-hypercorn does not know how this hypercorn ({_hypercorn_version()}) starts its "
                "server: hypercorn.__main__.main no longer hands its Config to hypercorn.run.run"
            )
    cli.run = functools.partial(_serve, settings=settings)
    if args is None:
        sys.argv[1:] = rest  # hypercorn's main reads sys.argv when given no arguments
    try:
        code = cli.main(rest)
    finally:
        cli.run = hypercorn.run.run
    sys.exit(code)


if __name__ == "__main__":
    # Run the importable module, not this __main__ copy: the workers unpickle the Config by the
    # name of the importable module's ReloadingConfig.
    from tlsreload_plugins.servers.hypercorn import main as _main

    _main()
