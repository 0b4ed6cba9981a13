"""Drop-in gunicorn configuration that reloads the TLS certificate in every worker::

    gunicorn -c python:tlsreload_plugins.gunicorn_conf --certfile tls.crt --keyfile tls.key app:app

Your own configuration still applies: the one gunicorn would have read without this ``-c``
(``./gunicorn.conf.py``, or the ``-c`` of ``$GUNICORN_CMD_ARGS``) is read here, as gunicorn
reads it, and reloading is added to its hooks; ``$GUNICORN_CMD_ARGS`` and the command line
then apply over it as usual. The files are checked every ``$TLSRELOAD_INTERVAL`` seconds
(default 1). See :mod:`tlsreload_plugins.servers.gunicorn`.
"""

import importlib
import importlib.machinery
import importlib.util
import os
import sys
import traceback
from typing import Any

from tlsreload_plugins.servers import gunicorn as _glue


def _replaced_config() -> "str | None":
    """The configuration gunicorn would have read had the drop-in not been named (gunicorn/app/base.py,
    ``Application.load_config``: the ``-c`` of the command line, else that of ``$GUNICORN_CMD_ARGS``, else
    ``./gunicorn.conf.py`` when it exists); ``None`` when there is none, or the drop-in was not named with
    ``-c`` (a custom application loads it by itself)."""
    from gunicorn.config import get_default_config_file  # type: ignore[import-untyped]  # optional dependency

    command_line, environment = _glue.config_locations()
    if command_line == _glue.DROP_IN:
        return environment if environment not in (None, _glue.DROP_IN) else get_default_config_file()
    if command_line is None and environment == _glue.DROP_IN:
        path: str | None = get_default_config_file()
        return path
    return None


def _read_config(location: str) -> "dict[str, Any]":
    """A configuration's names, read as gunicorn reads them (gunicorn/app/base.py): ``python:MODULE`` is
    imported; a file is executed as the module ``__config__``, and an error in it is reported as gunicorn
    reports it (``Failed to read config file: ...`` and the traceback, exit 1)."""
    if location.startswith("python:"):
        return dict(vars(importlib.import_module(location[len("python:") :])))
    filename = location[len("file:") :] if location.startswith("file:") else location
    if not os.path.exists(filename):
        raise RuntimeError(f"{filename!r} doesn't exist")
    try:
        loader = importlib.machinery.SourceFileLoader("__config__", filename)
        spec = importlib.util.spec_from_file_location("__config__", filename, loader=loader)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["__config__"] = module
        loader.exec_module(module)
    except Exception:
        print(f"Failed to read config file: {filename}", file=sys.stderr)
        traceback.print_exc()
        sys.stderr.flush()
        sys.exit(1)
    return dict(vars(module))


def _drop_in_settings() -> "dict[str, Any]":
    """The settings of the configuration gunicorn would have read without the drop-in, reloading added to
    its hooks. gunicorn applies ``$GUNICORN_CMD_ARGS`` and the command line over them, as it always does."""
    from gunicorn.config import KNOWN_SETTINGS

    names = {setting.name for setting in KNOWN_SETTINGS}
    location = _replaced_config()
    read = {} if location is None else _read_config(location)
    settings = {k: v for k, v in read.items() if k in names}
    _glue.chained_config = location
    _glue.add_reload(settings, sni=read.get("tls_sni"), metrics=read.get("tls_metrics"))
    on_starting, on_reload = settings.get("on_starting"), settings.get("on_reload")

    # gunicorn reads a configuration *file* again on HUP but imports a python: module once. Forgetting the
    # drop-in once it has been read makes the next HUP read it, and the user's file, again.
    def forget_drop_in_on_starting(server: Any) -> None:
        sys.modules.pop(__name__, None)
        if on_starting is not None:
            on_starting(server)

    def forget_drop_in_on_reload(server: Any) -> None:
        sys.modules.pop(__name__, None)
        if on_reload is not None:
            on_reload(server)

    settings["on_starting"] = forget_drop_in_on_starting
    settings["on_reload"] = forget_drop_in_on_reload
    return settings


globals().update(_drop_in_settings())
