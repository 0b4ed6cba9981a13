"""What a spawned worker does with the last good store it was passed: run in a process that
multiprocessing starts with ``spawn`` (as uvicorn's and hypercorn's workers are), by test_lastgood.
Imports nothing that loads ``cryptography``, so the child can tell whether the core loaded it."""

from __future__ import annotations

import json
import ssl
import sys
import time
from pathlib import Path

from tls_server import make_recipe
from tlsreload_plugins import Outcome, Reloader, TLSFiles
from tlsreload_plugins.lastgood.last_good import LastGood
from tlsreload_plugins.lastgood.store import DEFAULT, SharedStore


def _recipe_for(files: TLSFiles) -> ssl.SSLContext:
    return make_recipe(files.certfile, files.keyfile)()


def serve_and_reload(store: SharedStore, cert: str, key: str, out: str) -> None:
    """Start a reloader on ``cert``/``key`` with ``store``; write what it served at start to ``out``
    (``.start``), then check until ``out.step`` names a step: ``reload`` (check until a reload) or
    ``bad`` (check until a failure is reported), writing each result; ``stop`` ends the process."""
    results = Path(out)
    reloader = Reloader(cert, key, recipe=make_recipe(cert, key), last_good=LastGood(store, _recipe_for))

    def report(step: str, outcome: Outcome | None) -> None:
        record = {
            "serial": reloader.leaf.serial,
            "outcome": outcome.value if outcome else None,
            "cryptography": "cryptography" in sys.modules,
            "kept": store.read(DEFAULT) is not None,
        }
        # Written whole, then renamed: the test polls for the file and must never read half of it.
        partial = results.with_suffix(f".{step}.partial")
        partial.write_text(json.dumps(record))
        partial.replace(results.with_suffix(f".{step}"))

    report("start", None)
    done: set[str] = set()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        step_file = results.with_suffix(".step")
        step = step_file.read_text() if step_file.exists() else ""
        if step == "stop":
            return
        if step and step not in done:
            wanted = Outcome.RELOADED if step == "reload" else Outcome.FAILED
            outcome = reloader.check(settle=False)
            if outcome is wanted:
                done.add(step)
                report(step, outcome)
        time.sleep(0.02)
