"""Drop-in gunicorn configuration that reloads the TLS certificate in every worker::

    gunicorn -c python:tlsreload_plugins.gunicorn_conf --certfile tls.crt --keyfile tls.key app:app

Your own configuration still applies: the one gunicorn would have read without this ``-c``
(``./gunicorn.conf.py``, or the ``-c`` of ``$GUNICORN_CMD_ARGS``) is read here, as gunicorn
reads it, and reloading is added to its hooks; ``$GUNICORN_CMD_ARGS`` and the command line
then apply over it as usual. The files are checked every ``$TLSRELOAD_INTERVAL`` seconds
(default 1). See :mod:`tlsreload_plugins.servers.gunicorn`.
"""

import sys
from typing import Any

from tlsreload_plugins.hooks import before
from tlsreload_plugins.servers import gunicorn as _glue


def _replaced_config() -> "str | None":
    """The configuration gunicorn would have read had the drop-in not been named (gunicorn/app/base.py,
    ``Application.load_config``: the ``-c`` of the command line, else that of ``$GUNICORN_CMD_ARGS``, else
    ``./gunicorn.conf.py`` when it exists); ``None`` when there is none, or the drop-in was not named with
    ``-c`` (a custom application loads it by itself)."""
    from gunicorn.config import get_default_config_file  # type: ignore[import-untyped]  # optional dependency

    command_line, environment = _glue.config_locations()
    if (command_line or environment) != _glue.DROP_IN:
        return None
    if command_line and environment not in (None, _glue.DROP_IN):
        return environment
    path: str | None = get_default_config_file()
    return path


def _drop_in_settings() -> "dict[str, Any]":
    """The settings of the configuration gunicorn would have read without the drop-in, reloading added to
    its hooks. gunicorn applies ``$GUNICORN_CMD_ARGS`` and the command line over them, as it always does."""
    from gunicorn.app.base import Application  # type: ignore[import-untyped]
    from gunicorn.config import KNOWN_SETTINGS

    # Read by gunicorn's own code: python:MODULE imported, a file run as the module __config__ (an error in it
    # reported as gunicorn reports it: "Failed to read config file: ..." and the traceback, exit 1).
    location = _replaced_config()
    read: dict[str, Any] = {}
    if location is not None and location.startswith("python:"):
        read = dict(Application.get_config_from_module_name(None, location[len("python:") :]))
    elif location is not None:
        read = dict(Application.get_config_from_filename(None, location.removeprefix("file:")))
    names = {setting.name for setting in KNOWN_SETTINGS}
    settings = {name: value for name, value in read.items() if name in names}
    _glue.chained_config = location
    _glue.add_reload(settings, sni=read.get("tls_sni"), metrics=read.get("tls_metrics"))

    # gunicorn reads a configuration *file* again on HUP but imports a python: module once. Forgetting the
    # drop-in once it has been read makes the next HUP read it, and the user's file, again.
    def forget_drop_in(server: Any) -> None:
        sys.modules.pop(__name__, None)

    for hook in ("on_starting", "on_reload"):
        settings[hook] = before(forget_drop_in, settings.get(hook))
    return settings


globals().update(_drop_in_settings())
