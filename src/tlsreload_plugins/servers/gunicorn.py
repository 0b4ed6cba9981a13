"""gunicorn glue: reload the TLS certificate inside every worker, whatever the worker class (see docs/gunicorn.md).

How it is configured: ``-c python:tlsreload_plugins.gunicorn_conf`` (the drop-in), or ``reloading(globals())`` last in
your ``gunicorn.conf.py`` (your hooks still run); gunicorn's ``certfile``, ``keyfile``, ``ca_certs``; ``tls_sni``,
``tls_metrics``; ``$TLSRELOAD_KEY_PASSWORD_FILE``; ``tls_spiffe`` (or ``$TLSRELOAD_SPIFFE``): the identity from
SPIFFE's Workload API, followed by the arbiter, its files gunicorn's ``certfile``, ``keyfile`` and ``ca_certs``
(``tls_spiffe_id``, ``tls_spiffe_federation``: which SVID, which federated bundles); ``tls_spiffe_authorize`` (or
``$TLSRELOAD_SPIFFE_AUTHORIZE``): which clients may connect, by SPIFFE ID.
Where the context is built: your ``ssl_context`` hook on gunicorn's default factory is the recipe; the hook then
hands out the worker's reloading context (``sync`` and ``gthread`` ask per connection, the others once;
``UvicornWorker`` never asks: see :mod:`tlsreload_plugins.servers.gunicorn_worker_classes`).
Worker lifecycle: forked. The arbiter checks the files in ``on_starting``, before it binds, and starts the server's one
reader of them (:mod:`tlsreload_plugins.publication`; again on HUP and before a worker starts, if it has gone); each
worker makes its reloader on what the reader published in ``post_worker_init`` (after gevent's patching) and stops it
in ``worker_exit``.
"""

from __future__ import annotations

import copy
import functools
import logging
import os
import shlex
import ssl
import sys
import warnings
from collections.abc import Callable, Iterable, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from tlsreload_plugins.authorization import Authorizer, resolve_authorizer
from tlsreload_plugins.examine import Recipe
from tlsreload_plugins.files import Password, TLSFiles
from tlsreload_plugins.memory_files import RecipeFor
from tlsreload_plugins.publication.reader import ReaderProcess
from tlsreload_plugins.reloader import Reloader
from tlsreload_plugins.renamed import renamed
from tlsreload_plugins.servers.gunicorn_worker_classes import WORKER_CLASSES
from tlsreload_plugins.serving import logs
from tlsreload_plugins.serving.configured import server_context
from tlsreload_plugins.serving.hooks import Aside, after, before, imported_again_on, made_by, option_value, still_ours
from tlsreload_plugins.serving.options import spiffe_choice
from tlsreload_plugins.serving.start import CannotServe, Settings, check_at_start, exit_if_cannot_serve
from tlsreload_plugins.serving.workers import glue_for, prepare_worker_class, running_here, serve_in_worker, stop_here
from tlsreload_plugins.serving.workers import reloaders_here as reloaders
from tlsreload_plugins.settings import resolve_password, resolve_spiffe

if TYPE_CHECKING:  # imported where SPIFFE is configured, not by every worker
    from tlsreload_plugins.sources.source_process import SourceProcess

__all__ = ["reloading", "reloaders"]

log: logging.Logger = logging.getLogger("tlsreload_plugins.gunicorn")

STARTUP_FAILURE = 1
"""The arbiter's exit status when the TLS files or settings are unusable at start (gunicorn's configuration error)."""

DROP_IN = "python:tlsreload_plugins.gunicorn_conf"
"""The drop-in configuration, as given to ``-c``."""

SSLContextHook = Callable[[Any, Callable[[], ssl.SSLContext]], ssl.SSLContext]

_building = Aside()
"""Set while a reload calls gunicorn's factory, so that our own hook hands it the user's context."""

_reader: ReaderProcess | None = None
"""The server's one reader of the files (a child process of the arbiter); the workers load what it publishes."""
"""The newest identity any worker served, shared by the arbiter and every worker (created before the first fork).
Not the arbiter reading the files in a thread: a fork() while a thread is inside OpenSSL could leave locks held."""

_spiffe: SourceProcess | None = None
"""The arbiter's SPIFFE source process, when the identity comes from the Workload API (the arbiter runs no thread;
workers never open a stream)."""

_spiffe_again: Callable[[], SourceProcess] | None = None
"""Starts another source process as the first was started: a HUP does when the first has gone."""

chained_config: str | None = None
"""The configuration the drop-in applied besides itself (``./gunicorn.conf.py``, ...), for the start-up log."""


def worker_reloader() -> Reloader | None:
    """Deprecated: :func:`reloaders`, the one way every glue lists a process's reloaders (this worker's, or none).

    Returns:
        This worker's :class:`~tlsreload_plugins.Reloader`; ``None`` in the arbiter, without TLS, or not yet built.
    """
    warnings.warn(
        "tlsreload_plugins.gunicorn.worker_reloader() is deprecated: use reloaders(), as in every glue",
        DeprecationWarning,
        stacklevel=2,
    )
    return running_here()


def reloading(
    namespace: MutableMapping[str, Any],
    *,
    interval: float | None = None,
    sni: Iterable[str] | str | None = None,
    metrics: bool | None = None,
    crl: str | None = None,
    spiffe: str | bool | None = None,
    spiffe_id: str | None = None,
    federation: bool | str | Sequence[str] | None = None,
    authorize: Authorizer | Callable[[str], bool] | str | None = None,
) -> None:
    """Add certificate reloading to a gunicorn configuration module; calling it twice changes nothing.

    Args:
        namespace: the module's ``globals()``; its hooks are wrapped (those it lacks, defined).
        interval: seconds between checks: else the module's ``tls_reload_interval``, else ``$TLSRELOAD_INTERVAL``,
            else 1.
        sni: directories of more identities chosen by server name: else the module's ``tls_sni``, else
            ``$TLSRELOAD_SNI``.
        metrics: export Prometheus metrics: else the module's ``tls_metrics``, else ``$TLSRELOAD_METRICS``, else off.
        crl: a PEM file of CRLs for the CAs of gunicorn's ``ca_certs``, reloaded with it: else the module's
            ``tls_crl``, else ``$TLSRELOAD_CRL``.
        spiffe: serve the SVID of SPIFFE's Workload API (``True``: at ``$SPIFFE_ENDPOINT_SOCKET``; a string: at
            that socket) in place of ``certfile``, ``keyfile`` and ``ca_certs``: else the module's ``tls_spiffe``,
            else ``$TLSRELOAD_SPIFFE``. The arbiter follows the stream; workers read its files.
        spiffe_id: with ``spiffe``, the SVID to serve: else the module's ``tls_spiffe_id``, else the Workload API's
            first.
        federation: with ``spiffe``, trust federated trust domains' bundles too (``True``: all; or a list, or one
            comma-separated string, of trust domains): else the module's ``tls_spiffe_federation``, else none.
        authorize: accept only clients whose SPIFFE ID this accepts (an
            :class:`~tlsreload_plugins.authorization.Authorizer`, a matcher, or the syntax of
            :func:`~tlsreload_plugins.authorization.parse_authorizer`): else the module's ``tls_spiffe_authorize``,
            else ``$TLSRELOAD_SPIFFE_AUTHORIZE``; client certificates are then required.

    Example: at the end of ``gunicorn.conf.py``, after your hooks: ``reloading(globals())``.
    """
    if made_by(namespace.get("ssl_context"), reloading):
        return
    interval = interval if interval is not None else namespace.get("tls_reload_interval")
    sni = sni if sni is not None else namespace.get("tls_sni")
    metrics = metrics if metrics is not None else namespace.get("tls_metrics")
    crl = crl if crl is not None else namespace.get("tls_crl")
    from_spiffe = resolve_spiffe(spiffe if spiffe is not None else namespace.get("tls_spiffe"))
    authorize = authorize if authorize is not None else namespace.get("tls_spiffe_authorize")
    spiffe_id = spiffe_id if spiffe_id is not None else namespace.get("tls_spiffe_id")
    federation = federation if federation is not None else namespace.get("tls_spiffe_federation")
    settings = Settings(interval, sni, metrics, crl, authorize)
    chosen = (spiffe_id, federation)
    # The user's ssl_context hook, else gunicorn's default one (its default factory, as it is).
    user_ssl_context: SSLContextHook = namespace.get("ssl_context") or (lambda conf, factory: factory())

    def reloading_ssl_context(conf: Any, default_ssl_context_factory: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
        reloader = running_here()
        if reloader is not None and not _building:
            return reloader.context
        password = resolve_password(None)  # gunicorn's factory loads the key with none (OpenSSL would prompt on a tty)
        factory = default_ssl_context_factory if password is None else lambda: _default_context(conf, password)
        return user_ssl_context(conf, factory)

    namespace["ssl_context"] = reloading_ssl_context
    namespace["on_starting"] = before(
        lambda server: _check_at_start(server, settings, from_spiffe, chosen), namespace.get("on_starting")
    )
    if from_spiffe is not None:  # a HUP reads the configuration again: the SVID's files are set again before workers
        namespace["on_reload"] = before(lambda server: _use_source(server.cfg), namespace.get("on_reload"))
        namespace["on_exit"] = after(namespace.get("on_exit"), lambda server: _close_source())
    # The reader: read again on HUP (the files may have moved), brought back before a worker starts if it has gone.
    namespace["on_reload"] = after(namespace.get("on_reload"), lambda server: _read_again(server, settings))
    namespace["pre_fork"] = before(lambda server, worker: _reader_back(), namespace.get("pre_fork"))
    namespace["on_exit"] = after(namespace.get("on_exit"), lambda server: _close_reader())
    # Ours first: the user's hook can then reach the reloader through reloaders().
    namespace["post_worker_init"] = before(
        lambda worker: _start_worker(worker, user_ssl_context, settings), namespace.get("post_worker_init")
    )
    namespace["worker_exit"] = after(namespace.get("worker_exit"), lambda server, worker: stop_here())


def config_locations() -> tuple[str | None, str | None]:
    """The ``-c`` of the command line and the ``-c`` of ``$GUNICORN_CMD_ARGS`` (each ``None`` when absent)."""
    environment = shlex.split(os.environ.get("GUNICORN_CMD_ARGS") or "")
    return option_value(sys.argv[1:], "-c", "--config"), option_value(environment, "-c", "--config")


def drop_in_settings(module: str) -> dict[str, Any]:
    """The drop-in's settings (``module``): the configuration gunicorn would have read without it, with reloading
    added to its hooks; gunicorn applies ``$GUNICORN_CMD_ARGS`` and the command line over them, as always."""
    from gunicorn.app.base import Application  # type: ignore[import-untyped]
    from gunicorn.config import KNOWN_SETTINGS  # type: ignore[import-untyped]

    global chained_config
    chained_config = location = _replaced_config()
    # Read by gunicorn's own code: python:MODULE imported, a file run as the module __config__ (an error in it
    # reported as gunicorn reports it: "Failed to read config file: ..." and the traceback, exit 1).
    read: dict[str, Any] = {}
    if location is not None and location.startswith("python:"):
        read = dict(Application.get_config_from_module_name(None, location[len("python:") :]))
    elif location is not None:
        read = dict(Application.get_config_from_filename(None, location.removeprefix("file:")))
    names = {setting.name for setting in KNOWN_SETTINGS}
    settings = {name: value for name, value in read.items() if name in names}
    reloading(
        settings,
        interval=read.get("tls_reload_interval"),
        sni=read.get("tls_sni"),
        metrics=read.get("tls_metrics"),
        crl=read.get("tls_crl"),
        spiffe=read.get("tls_spiffe"),
        spiffe_id=read.get("tls_spiffe_id"),
        federation=read.get("tls_spiffe_federation"),
        authorize=read.get("tls_spiffe_authorize"),
    )
    # gunicorn imports a python: module once, but reads a configuration file again on HUP: so should the drop-in.
    imported_again_on(settings, module, "on_starting", "on_reload")
    return settings


def _replaced_config() -> str | None:
    """What gunicorn would read without the drop-in (``load_config``: the command line's ``-c``, else that of
    ``$GUNICORN_CMD_ARGS``, else ``./gunicorn.conf.py``); ``None``: none, or the drop-in not given with ``-c``."""
    from gunicorn.config import get_default_config_file

    command_line, environment = config_locations()
    if (command_line or environment) != DROP_IN:
        return None
    if command_line and environment not in (None, DROP_IN):
        return environment
    return cast("str | None", get_default_config_file())


def _check_at_start(
    arbiter: Any, settings: Settings, spiffe: str | None, chosen: tuple[str | None, bool | str | Sequence[str] | None]
) -> None:
    """In the arbiter, before it binds: one error line and a halt when a setting or the files cannot serve."""
    global _reader
    logs.share_handlers(getattr(arbiter.log, "error_log", None))
    if chained_config is not None:
        log.info("the drop-in configuration also applies %s, as gunicorn would without it", chained_config)
    cfg = arbiter.cfg
    reason = "the TLS certificate files or settings are not usable"
    halt = functools.partial(arbiter.halt, reason=reason, exit_status=STARTUP_FAILURE)
    with exit_if_cannot_serve(halt):
        spiffe_id, federation = spiffe_choice(*chosen, names=("tls_spiffe_id", "tls_spiffe_federation"))
        if spiffe is None and (spiffe_id or federation):
            key = "tls_spiffe_id" if spiffe_id else "tls_spiffe_federation"
            raise CannotServe(f"cannot serve TLS: {key} chooses what comes from SPIFFE's Workload API: set tls_spiffe")
        if settings.authorize is not None:
            try:
                resolve_authorizer(settings.authorize)
            except ValueError as e:
                raise CannotServe(f"cannot serve TLS: tls_spiffe_authorize: {e}") from None
        if spiffe is not None:
            _start_source(cfg, spiffe, spiffe_id, federation)
    if not cfg.is_ssl:
        log.warning("no --certfile given: serving without TLS, nothing to reload")
        return
    with exit_if_cannot_serve(halt):
        if not cfg.certfile:
            raise CannotServe(
                f"cannot serve TLS: --keyfile {cfg.keyfile} is set but --certfile is not: give --certfile "
                "(the key may be in the certificate file, not the other way round)"
            )
        prepare_worker_class(cfg.worker_class, cfg.worker_class_str, WORKER_CLASSES)
        _reader = check_at_start(_files(cfg), lambda: _context_of(cfg), resolve_password(None), settings, reader=True)


def _start_source(cfg: Any, spiffe: str, spiffe_id: str | None, federation: bool | list[str]) -> None:
    """Follow SPIFFE's Workload API in the arbiter (once, before any worker) and make its files gunicorn's."""
    global _spiffe, _spiffe_again
    given = [name for name in ("certfile", "keyfile", "ca_certs") if getattr(cfg, name)]
    if given:
        raise CannotServe(f"tls_spiffe takes the certificate, key and CA bundle from SPIFFE: drop {given[0]}")
    from tlsreload_plugins.serving.spiffe import start_source  # the source process: only where SPIFFE is used

    _spiffe_again = functools.partial(start_source, spiffe, spiffe_id=spiffe_id, federation=federation)
    _spiffe = _spiffe or _spiffe_again()
    _use_source(cfg)


def _use_source(cfg: Any) -> None:
    """Set gunicorn's ``certfile``, ``keyfile`` and ``ca_certs`` to the SPIFFE source's files (on a HUP, those of a
    new source process if the first has gone)."""
    global _spiffe
    if _spiffe is not None and not _spiffe.alive() and _spiffe_again is not None:
        log.warning("the SPIFFE source process %d has gone: starting another", _spiffe.pid)
        _spiffe.close()
        try:
            _spiffe = _spiffe_again()
        except CannotServe as e:
            log.error("%s; the workers keep serving the last SVID until it expires", e)
    if _spiffe is not None:
        files = _spiffe.files
        for name, path in (("certfile", files.certfile), ("keyfile", files.keyfile), ("ca_certs", files.ca_certs)):
            cfg.set(name, path)


def _close_source() -> None:
    global _spiffe
    if _spiffe is not None:
        _spiffe.close()
        _spiffe = None


def _read_again(arbiter: Any, settings: Settings) -> None:
    """On HUP, in the arbiter: the reader of the files gunicorn's configuration names now (a new one when they
    moved; the old one keeps publishing when the new files cannot serve)."""
    global _reader
    cfg = arbiter.cfg
    if _reader is None or not cfg.is_ssl:
        return
    files = settings.with_crl(_files(cfg))
    if files == _reader.files:
        _reader_back()
        return
    try:
        new = check_at_start(files, lambda: _context_of(cfg), resolve_password(None), settings, reader=True)
    except CannotServe as e:
        log.error("%s; the workers keep serving what the reader of %s published", e, _reader.files.describe())
        return
    _close_reader()
    _reader = new


def _reader_back() -> None:
    """Start the reader again when it has gone (killed, crashed): before each worker starts."""
    if _reader is not None:
        _reader.again()


def _close_reader() -> None:
    global _reader
    if _reader is not None:
        _reader.close()
        _reader = None


def _files(cfg: Any) -> TLSFiles:
    return TLSFiles(cfg.certfile, cfg.keyfile, cfg.ca_certs)


def _start_worker(worker: Any, user_ssl_context: SSLContextHook, settings: Settings) -> None:
    logs.share_handlers(getattr(worker.log, "error_log", None))
    cfg = worker.cfg
    if not cfg.is_ssl:
        return

    def serve(recipe: Recipe, recipe_for: RecipeFor) -> Reloader:  # with nothing valid, waits (telling the arbiter)
        return serve_in_worker(
            _files(cfg),
            recipe,
            recipe_for,
            settings=settings,
            between=worker.notify,
            boot_error=3,  # gunicorn's WORKER_BOOT_ERROR, on which the arbiter stops ("Worker failed to boot.")
            publication=_reader.directory if _reader is not None else None,
        )

    def serve_through_hook(recipe: Recipe, recipe_for: RecipeFor) -> Reloader:  # a worker class's own recipes
        return serve(
            lambda: user_ssl_context(worker.cfg, recipe),
            lambda files: user_ssl_context(with_files(worker.cfg, files), lambda: recipe_for(files)),
        )

    glue = glue_for(type(worker), WORKER_CLASSES)
    if glue is not None and glue.serve is not None:
        glue.serve(worker, serve_through_hook)
    elif still_ours(cfg.ssl_context, reloading, "ssl_context", log):
        serve(lambda: _context_of(cfg), lambda files: _context_of(with_files(cfg, files)))


def _context_of(cfg: Any) -> ssl.SSLContext:
    """gunicorn's own path to its context (its default factory through the user's hook), ours stepping aside."""
    from gunicorn import sock  # type: ignore[import-untyped]  # here: gunicorn is an optional dependency

    with _building:
        return cast(ssl.SSLContext, sock.ssl_context(cfg))


def _default_context(conf: Any, password: Password) -> ssl.SSLContext:
    """What gunicorn's default factory builds (gunicorn/sock.py ``ssl_context``), the key loaded with ``password``."""
    from gunicorn import sock

    alpn = getattr(sock, "_get_alpn_protocols", None)
    if alpn is None and getattr(conf, "http_protocols", None) not in (None, ["h1"]):
        raise RuntimeError(
            "this gunicorn moved its ALPN set-up (gunicorn.sock._get_alpn_protocols): an encrypted key "
            "cannot be combined with --http-protocols"
        )
    protocols = alpn(conf) if alpn is not None else None
    return server_context(_files(conf), password, verify_mode=conf.cert_reqs, ciphers=conf.ciphers, alpn=protocols)


def with_files(cfg: Any, files: TLSFiles) -> Any:
    """A copy of gunicorn's configuration ``cfg`` naming other certificate, key and CA files."""
    conf = copy.copy(cfg)
    conf.settings = dict(cfg.settings)
    for name, path in (("certfile", files.certfile), ("keyfile", files.keyfile), ("ca_certs", files.ca_certs)):
        conf.settings[name] = copy.copy(cfg.settings[name])
        conf.settings[name].value = path
    return conf


def _refuse_as_configuration() -> None:
    """Refuse ``-c python:tlsreload_plugins.gunicorn`` (the library: no reloading) with gunicorn's config error."""
    command_line, environment = config_locations() if "gunicorn.app.base" in sys.modules else (None, None)
    wrong = "python:tlsreload_plugins.gunicorn"
    if (command_line or environment) == wrong:  # as gunicorn reads -c: the command line's, else $GUNICORN_CMD_ARGS'
        raise RuntimeError(
            f"{wrong} is tlsreload's library and sets nothing, so certificates would not be reloaded: "
            f"use -c {DROP_IN}, or reloading(globals()) at the end of your own configuration file"
        )


_refuse_as_configuration()


add_reload: Callable[..., None] = renamed(reloading, "add_reload", "tlsreload_plugins.gunicorn")
"""Deprecated: :func:`reloading` (the name of an earlier release, for one more; it warns)."""
