"""One vocabulary across every glue: the table of docs/configuration.md ("Every glue's spelling of tlsreload's own
settings") checked against the code both ways (every spelling it names is taken; every setting a glue takes is in
it), and the old names that still work for one release, each warning with the new one."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
SECTION = "## Every glue's spelling of tlsreload's own settings"
SETTINGS = ("interval", "sni", "metrics", "crl", "authorize", "password_file", "recipe")
"""tlsreload's own settings, as function-style glues name them (the table's columns, the key password last but one)."""
OLD_VERBS = {
    "tlsreload_plugins.gunicorn": "add_reload",
    "tlsreload_plugins.websockets": "reloading_ssl",
    "tlsreload_plugins.tornado": "reloading_tls",
    "tlsreload_plugins.sanic": "reload_certificates",
}
"""The entry points renamed ``reloading`` (the one verb where the server's own convention does not name one), by the
module they are imported from: their names before, which warn for one release."""


def table() -> dict[str, list[str]]:
    """The table's rows: the glue (its first column) to its cells."""
    text = DOCS.read_text()
    assert SECTION in text, f"{DOCS} has no section {SECTION!r}"
    rows: dict[str, list[str]] = {}
    for line in text.split(SECTION, 1)[1].split("\n## ", 1)[0].splitlines():
        if line.startswith("| ") and not line.startswith("| Glue") and not line.startswith("|---"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


def spellings(cell: str) -> list[str]:
    """The names a cell gives in backticks."""
    return re.findall(r"`([^`]+)`", cell)


def glues() -> dict[str, Callable[..., Any]]:
    """Each function-style row's entry point."""
    from tlsreload_plugins import aiohttp, gunicorn, sanic, tornado, websockets
    from tlsreload_plugins.cheroot import ReloadingSSLAdapter
    from tlsreload_plugins.fresh import fresh_context
    from tlsreload_plugins.grpc import server_credentials
    from tlsreload_plugins.uvicorn import reloading_ssl_context

    return {
        "`fresh_context` (any server taking an `ssl.SSLContext`)": fresh_context,
        "aiohttp `reloading`": aiohttp.reloading,
        "websockets `reloading`": websockets.reloading,
        "Tornado `reloading`": tornado.reloading,
        "cheroot `ReloadingSSLAdapter`": ReloadingSSLAdapter,
        "Sanic `reloading`": sanic.reloading,
        "gRPC `server_credentials`": server_credentials,
        "uvicorn `reloading_ssl_context`": reloading_ssl_context,
        "gunicorn `reloading`": gunicorn.reloading,
    }


def test_every_function_style_glue_takes_the_spellings_the_table_gives_and_no_other() -> None:
    rows = table()
    for glue, entry in glues().items():
        assert glue in rows, f"no row for {glue} in {DOCS}"
        parameters = inspect.signature(entry).parameters
        given = {name.removesuffix("=") for cell in rows[glue] for name in spellings(cell) if name.endswith("=")}
        missing = sorted(given - set(parameters))
        assert not missing, f"{glue}: the table names {missing}, which it does not take"
        undocumented = sorted(name for name in SETTINGS if name in parameters and name not in given)
        assert not undocumented, f"{glue} takes {undocumented}, which its row of {DOCS} does not name"


def test_the_settings_have_one_type_in_every_glue() -> None:
    types: dict[str, set[str]] = {}
    for entry in glues().values():
        for name, parameter in inspect.signature(entry).parameters.items():
            if name in ("interval", "sni", "metrics", "crl", "authorize", "password_file"):
                types.setdefault(name, set()).add(str(parameter.annotation))
    several = {name: sorted(spelled) for name, spelled in types.items() if len(spelled) > 1}
    assert not several, f"a setting typed differently from glue to glue: {several}"


def test_the_configuration_keys_and_options_the_table_gives_are_read(capsys: pytest.CaptureFixture[str]) -> None:
    from tlsreload_plugins.gunicorn import reloading
    from tlsreload_plugins.hypercorn import ReloadingConfig
    from tlsreload_plugins.servers.twisted import EXTRA_KEYWORDS
    from tlsreload_plugins.serving.options import add_options
    from tlsreload_plugins.uvicorn import main

    rows = table()

    class Recorded(dict[str, Any]):
        """A gunicorn configuration module's namespace that notes each key read."""

        def __init__(self) -> None:
            super().__init__()
            self.asked: set[str] = set()

        def get(self, key: str, default: Any = None) -> Any:
            self.asked.add(key)
            return super().get(key, default)

    namespace = Recorded()
    reloading(namespace)
    gunicorn = rows["gunicorn configuration (with `reloading` or the drop-in)"]
    keys = [name for cell in gunicorn for name in spellings(cell) if name.startswith("tls_")]
    assert keys and [key for key in keys if key not in namespace.asked] == []

    config = ReloadingConfig()
    keys = [name for cell in rows["hypercorn `ReloadingConfig`"] for name in spellings(cell) if name.startswith("tls_")]
    assert keys and [key for key in keys if not hasattr(config, key)] == []

    parser = argparse.ArgumentParser()
    add_options(parser)
    hypercorn_options = parser.format_help()
    with pytest.raises(SystemExit):
        main(["--help"])
    uvicorn_options = capsys.readouterr().out
    options = [name for cell in rows["`tlsreload-uvicorn`, `tlsreload-hypercorn`"] for name in spellings(cell)]
    assert options and all(option.startswith("--tls-") for option in options)
    assert [option for option in options if re.search(f"{option}\\b", uvicorn_options) is None] == []
    assert [option for option in options if re.search(f"{option}\\b", hypercorn_options) is None] == []

    keywords = [name.removesuffix("=") for cell in rows["Twisted's `tlsreload:` endpoint"] for name in spellings(cell)]
    assert [key for key in keywords if key.endswith(("File", "interval", "sni")) and key not in EXTRA_KEYWORDS] == []


def test_old_names_still_work_and_warn_with_the_new_one(tmp_path: Path) -> None:
    from tlsreload_plugins.gunicorn import worker_reloader
    from tlsreload_plugins.sni.identities import SNIIdentities

    for module, old_name in OLD_VERBS.items():
        glue = importlib.import_module(module)
        old = getattr(glue, old_name)
        assert inspect.signature(old) == inspect.signature(glue.reloading)  # the same arguments
        said = rf"{module}\.{old_name} is deprecated: it is reloading now"
        # Called with no arguments, it fails as reloading() would: only the warning before matters here.
        with pytest.warns(DeprecationWarning, match=said), contextlib.suppress(TypeError):
            old()
    with pytest.warns(DeprecationWarning, match=r"worker_reloader\(\) is deprecated: use reloaders\(\)"):
        assert worker_reloader() is None  # not in a gunicorn worker
    with pytest.warns(DeprecationWarning, match=r"export_metrics=\) is deprecated: it is metrics="):
        identities = SNIIdentities(str(tmp_path), recipe_for=lambda files: None, export_metrics=False)  # type: ignore[arg-type, return-value]
    assert identities.export_metrics is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SNIIdentities(str(tmp_path), recipe_for=lambda files: None, metrics=False)  # type: ignore[arg-type, return-value]
