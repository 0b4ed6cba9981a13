"""The package is typed as a library should be: ``pyright --verifytypes tlsreload_plugins --ignoreexternal`` finds
every public symbol's type known and unambiguous (a completeness score of 1.0), so that a user's type checker sees
the same types whichever checker it is. Names from the package's dependencies are left out (``--ignoreexternal``):
their typing is theirs.

Pyright comes with the test extra (its PyPI package carries its own JavaScript, and ``pyright[nodejs]`` a Node.js
runtime): a run without it fails here rather than skipping. The twisted-endpoint distribution's module
(``twisted.plugins.tlsreload_endpoint``) lies outside the package and is not verified here; mypy --strict checks it.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "tlsreload_plugins"
SHOWN = 40
"""Offending symbols named in a failure at most (the count says how many more)."""


def _verify(python_dir: Path) -> dict[str, Any]:
    """Pyright's ``--verifytypes`` report on the package as this interpreter imports it (its JSON output)."""
    # --verifytypes ignores --pythonpath: it asks the first `python3` on PATH (else `python`) where packages are.
    # That must be the interpreter running the tests, whose environment holds the package and the test extra, and
    # which may have neither name beside it: a two-line script of each name runs it.
    for name in ("python3", "python"):
        script = python_dir / name
        script.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
        script.chmod(0o755)
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(python_dir), os.environ.get("PATH", "")]),
        "PYRIGHT_PYTHON_IGNORE_WARNINGS": "1",  # no look-up of a newer pyright on the package index
    }
    command = [sys.executable, "-m", "pyright", "--verifytypes", PACKAGE, "--ignoreexternal", "--outputjson"]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    # Exit 1 is pyright's "the score is below 1.0": its report says why. No JSON at all is a broken run.
    assert result.stdout.lstrip().startswith("{"), (
        f"{shlex.join(command)}: exit {result.returncode}, no report (pyright and its Node.js come with the test "
        f"extra, as pyright[nodejs])\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
    )
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def _where(diagnostic: dict[str, Any]) -> str:
    """``file.py:line`` of a diagnostic (only the file when pyright gives no range)."""
    name = Path(diagnostic.get("file") or "?").name
    line = diagnostic.get("range", {}).get("start", {}).get("line")
    return name if line is None else f"{name}:{line + 1}"


def _offenders(completeness: dict[str, Any]) -> list[str]:
    """The symbols whose type is unknown or ambiguous, or that pyright faults, each with its reasons. Those missing an
    annotation come first: they are the causes, and a symbol that uses one of them is "partially unknown" after it."""
    lines = []
    for symbol in completeness.get("symbols", []):
        errors = [d for d in symbol.get("diagnostics", []) if d.get("severity") == "error"]
        if symbol.get("isTypeKnown") and not symbol.get("isTypeAmbiguous") and not errors:
            continue
        reasons = "; ".join(f"{_where(d)}: {' '.join(d.get('message', '').split())}" for d in errors)
        lines.append(f"{symbol.get('name')}: {reasons or 'type unknown or ambiguous'}")
    return sorted(lines, key=lambda line: "missing type annotation" not in line)


def test_public_surface_is_fully_typed(tmp_path: Path) -> None:
    report = _verify(tmp_path)
    completeness = report["typeCompleteness"]
    problems = [d.get("message", "") for d in report.get("generalDiagnostics", []) if d.get("severity") == "error"]
    assert completeness.get("pyTypedPath"), f"pyright found no typed package {PACKAGE}: {problems}"
    score = completeness["completenessScore"]
    if score != 1.0:
        offenders = _offenders(completeness)
        shown = "\n".join(offenders[:SHOWN]) + (
            f"\n... and {len(offenders) - SHOWN} more" if len(offenders) > SHOWN else ""
        )
        raise AssertionError(
            f"pyright --verifytypes {PACKAGE}: completeness {score:.1%}, not 100%; "
            f"{len(offenders)} symbols' types are unknown or ambiguous (annotate them):\n{shown}\n{problems}"
        )
