"""Reload TLS certificates inside hypercorn: a drop-in command and a ``Config`` subclass.

Two ways, one mechanism:

* ``tlsreload-hypercorn app:app --certfile C --keyfile K [any hypercorn option]`` (or
  ``python -m tlsreload_plugins.hypercorn``) is hypercorn's own command plus
  ``--tls-reload-interval``: every worker class (asyncio, uvloop, trio), ``--workers N`` and
  ``-c`` configuration files work as they do with ``hypercorn``.
* :class:`ReloadingConfig` is ``hypercorn.config.Config`` with a reloading
  :meth:`~ReloadingConfig.create_ssl_context`, for code that builds its own ``Config`` and calls
  ``hypercorn.asyncio.serve`` or ``hypercorn.trio.serve``.

hypercorn calls ``create_ssl_context()`` once per worker (per ``serve()`` call), inside the
worker's running event loop, after the app's lifespan start-up. There, :class:`ReloadingConfig`
builds a :class:`~tlsreload_plugins.Reloader` whose recipe is hypercorn's own
``Config.create_ssl_context`` (so ALPN h2, ciphers, verify mode, CA bundle and key password are
set the same way on every reload), hands hypercorn ``reloader.context``, and checks the files
from that same loop until it ends: an asyncio task, or a trio system task, each running the check
itself in a worker thread. A lifespan extension as for uvicorn is not needed: the checks start
with the context, and stop when the worker's loop does.

HTTP/3 is refused: hypercorn's QUIC server hands the certificate *files* to aioquic once, when it
starts, so ``--quic-bind`` would keep serving the first certificate forever. Combined with
reloading, it stops the server at start-up with one error.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import functools
import importlib
import importlib.metadata
import logging
import ssl
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import hypercorn.run
from hypercorn.config import Config

from . import metrics
from .drivers import AsyncioDriver
from .identity import InvalidIdentity, Password, ReloadError, TLSFiles
from .reloader import (
    INTERVAL_ENV,
    Recipe,
    Reloader,
    load_identity,
    resolve_expiry_warning_days,
    resolve_interval,
    resolve_password,
)

__all__ = ["STARTUP_FAILURE", "ReloadingConfig", "main", "reloaders"]

log = logging.getLogger("tlsreload_plugins.hypercorn")

STARTUP_FAILURE = 1
"""Exit status when the certificate files or settings are not usable at start-up."""

# -- the reloaders of this process ---------------------------------------------------------
# One per create_ssl_context() call: one per worker process, or per serve() call.
_drivers: dict[Reloader, AsyncioDriver | _TrioDriver] = {}
_starting: set[asyncio.Task[AsyncioDriver]] = set()


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
    ``tls_reload_interval`` (seconds between checks; ``None``: ``$TLSRELOAD_INTERVAL``, else 1).

    Example::

        config = ReloadingConfig()
        config.bind = ["0.0.0.0:8443"]
        config.certfile, config.keyfile = "tls.crt", "tls.key"
        config.check_tls_files()  # unusable files: one error line and exit 1, before serving
        asyncio.run(hypercorn.asyncio.serve(app, config))  # or trio.run(hypercorn.trio.serve, app, config)
    """

    tls_reload_interval: float | None = None

    def create_ssl_context(self) -> ssl.SSLContext | None:
        """hypercorn's own context, made to follow the files: called by hypercorn in each worker.

        Unusable files or settings log one ERROR and exit with :data:`STARTUP_FAILURE` (under
        trio, hypercorn's nurseries add a traceback: call :meth:`check_tls_files` before
        serving to fail without one).
        """
        if not self.ssl_enabled:
            return super().create_ssl_context()
        _route_logs(self.log)
        start_checks = _checker_for_this_loop()
        self._refuse_quic()
        password = resolve_password(self.keyfile_password)
        try:
            # The one place this module makes a Reloader.
            reloader = Reloader(
                str(self.certfile),
                str(self.keyfile),
                recipe=self._recipe(password),
                ca_certs=str(self.ca_certs) if self.ca_certs else None,
                password=password,
                interval=self.tls_reload_interval,
            )
        except (ReloadError, ValueError) as e:  # ValueError: a bad interval or expiry setting
            _startup_failure("cannot serve TLS: %s", e)
        metrics.observe(reloader)
        start_checks(reloader)
        return reloader.context

    def check_tls_files(self) -> None:
        """Decide now, as the first reload would, whether the TLS files and settings are usable.

        Logs one ERROR line (through hypercorn's error log) and exits with :data:`STARTUP_FAILURE`
        when they are not; warns when no certificate is configured. The drop-in command calls it
        once before starting workers.
        """
        _route_logs(self.logger_class(self))  # not self.log: that would be pickled to the workers
        if not self.ssl_enabled:
            log.warning("no --certfile and --keyfile given: serving without TLS, nothing to reload")
            return
        self._refuse_quic()
        files = TLSFiles(str(self.certfile), str(self.keyfile), str(self.ca_certs) if self.ca_certs else None)
        password = resolve_password(self.keyfile_password)
        try:
            resolve_interval(self.tls_reload_interval)
            resolve_expiry_warning_days()
            load_identity(files, self._recipe(password), password)
        except (ReloadError, ValueError) as e:
            _startup_failure("cannot serve TLS: %s", e)

    def _recipe(self, password: Password) -> Recipe:
        """hypercorn's own ``Config.create_ssl_context``; with the password of
        ``$TLSRELOAD_KEY_PASSWORD_FILE`` (read again on each call) when ``keyfile_password`` is unset."""

        def hypercorn_context() -> ssl.SSLContext:
            config = self
            if self.keyfile_password is None and password is not None:
                config = copy.copy(self)
                config.keyfile_password = _text(password)
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


def _text(password: Password) -> str | None:
    value = password() if callable(password) else password
    return value.decode() if isinstance(value, bytes) else value


# -- checking from the worker's loop -------------------------------------------------------


def _checker_for_this_loop() -> Callable[[Reloader], None]:
    """How to check a reloader from the event loop running this call, asyncio's or trio's."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        return functools.partial(_start_asyncio, loop)
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            trio.lowlevel.current_trio_token()
        except RuntimeError:
            pass
        else:
            return _start_trio
    # hypercorn has always built the context inside its worker's loop; if a new version does
    # not, nothing would ever check the files: refuse rather than serve a frozen certificate.
    hypercorn_version = importlib.metadata.version("hypercorn")
    _startup_failure(
        "create_ssl_context() was called outside a running asyncio or trio loop (hypercorn %s), so "
        "nothing could check the certificate files; tlsreload does not support this hypercorn",
        hypercorn_version,
    )


def _start_asyncio(loop: asyncio.AbstractEventLoop, reloader: Reloader) -> None:
    driver = AsyncioDriver(reloader)
    _drivers[reloader] = driver
    # start() never suspends; the task it creates is cancelled when the loop shuts down.
    task = loop.create_task(driver.start())
    _starting.add(task)
    task.add_done_callback(_starting.discard)


def _start_trio(reloader: Reloader) -> None:
    import trio

    driver = _TrioDriver(reloader)
    _drivers[reloader] = driver
    # A system task: create_ssl_context() has no nursery to hand. trio cancels it when the main
    # task (trio.run's, hypercorn's worker) returns, and waits for it.
    trio.lowlevel.spawn_system_task(driver.run, name="tlsreload")


class _TrioDriver:
    """Checks ``reloader`` every ``reloader.interval`` seconds from a trio task, in a worker thread.

    Cancelled while a check runs, it waits for that check to end (``to_thread.run_sync`` does not
    abandon its thread), so no check outlives the loop.
    """

    def __init__(self, reloader: Reloader) -> None:
        self.reloader = reloader
        self._errors_logged: set[str] = set()

    async def run(self) -> None:
        import trio

        log.info("%s", self.reloader.describe())
        while True:
            await trio.sleep(self.reloader.interval)
            await trio.to_thread.run_sync(self._check)

    def _check(self) -> None:
        # A bug must not end the task (in a system task it would crash trio): log each distinct error
        # once and keep checking, as the asyncio driver does.
        try:
            self.reloader.check()
        except Exception as e:
            if repr(e) not in self._errors_logged:
                self._errors_logged.add(repr(e))
                log.exception("unexpected error while checking %s; will keep checking", self.reloader.files.describe())


# -- logs ----------------------------------------------------------------------------------


class _ToHypercorn(logging.Handler):
    def __init__(self, error_log: logging.Logger) -> None:
        super().__init__()
        self.error_log = error_log

    def emit(self, record: logging.LogRecord) -> None:
        # hypercorn's format shows no logger name: say whose line it is.
        record = copy.copy(record)
        record.msg = f"tlsreload: {record.msg}"
        self.error_log.handle(record)


def _route_logs(hypercorn_logger: Any) -> None:
    """Show tlsreload's lines in hypercorn's error log: its handlers, its format, its --log-level.

    Left alone when the application configured logging itself (a handler on the root logger or on
    ``tlsreload_plugins``), or when hypercorn's error log is off: the lines then go where logging says.
    """
    error_log = getattr(hypercorn_logger, "error_logger", None)
    ours = logging.getLogger("tlsreload_plugins")
    if not isinstance(error_log, logging.Logger) or ours.handlers or logging.getLogger().handlers:
        return
    ours.addHandler(_ToHypercorn(error_log))
    ours.setLevel(error_log.getEffectiveLevel())
    ours.propagate = False


# -- the drop-in command -------------------------------------------------------------------


def _serve(config: Config, *, interval: float | None) -> int:
    """What hypercorn's command runs, given the Config it built: the same, reloading."""
    reloading = ReloadingConfig()
    vars(reloading).update(vars(config))  # every setting, from the command line and -c alike
    if interval is not None:
        reloading.tls_reload_interval = interval
    reloading.check_tls_files()
    return hypercorn.run.run(reloading)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tlsreload-hypercorn", add_help=False, allow_abbrev=False)
    group = parser.add_argument_group("tlsreload options")
    group.add_argument(
        "--tls-reload-interval",
        type=float,
        metavar="SECONDS",
        help=f"Seconds between checks of the TLS certificate files. Defaults to ${INTERVAL_ENV}, else 1.",
    )
    return parser


def main(args: Sequence[str] | None = None) -> None:
    """``tlsreload-hypercorn``: hypercorn's command line, reloading certificates."""
    parser = _parser()
    options, rest = parser.parse_known_args(sys.argv[1:] if args is None else list(args))
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
        _route_logs(default.logger_class(default))
        _startup_failure(
            "tlsreload-hypercorn does not know how this hypercorn (%s) starts its server: "
            "hypercorn.__main__.main no longer hands its Config to hypercorn.run.run",
            importlib.metadata.version("hypercorn"),
        )
    cli.run = functools.partial(_serve, interval=interval)
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
