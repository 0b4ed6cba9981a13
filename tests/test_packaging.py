"""What the wheels install, in fresh virtual environments: tlsreload-plugins alone leaves no ``twisted`` package
importable (code that probes for Twisted with ``find_spec("twisted")`` is not fooled), and with the ``[twisted]``
extra, which pulls in the second distribution of this repository (``twisted-endpoint/``: Twisted's plugin for
the ``tlsreload:`` endpoint), a real ``twistd web`` serves and reloads through ``tlsreload:``.

Both wheels are built from a clean copy of this tree (setuptools copies whatever a previous build left in
``build/`` into the next wheel) and installed as a user installs them, the endpoint found through
``--find-links``; Twisted and cryptography come from the index, through pip's cache. This module runs in the
newest suite only (tox.ini's lowest list leaves it out): it checks what the wheels hold, not a dependency's floor.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import trustme

from tlstest import HOST, KubeletLayout, client_context, free_port, issue, run_server, wait_for_serial

ROOT = Path(__file__).resolve().parent.parent
ENDPOINT = ROOT / "twisted-endpoint"
PLUGIN = Path("twisted", "plugins", "tlsreload_endpoint.py")
DEADLINE = 60.0
# The test run's own path (this tree's src, the tests) reaches no fresh environment: an empty PYTHONPATH adds nothing.
FRESH = {"PYTHONPATH": ""}


def run(*args: object, cwd: Path | None = None) -> str:
    """Run ``args`` with this tree off the path; its output, or a failure showing it."""
    env = {**os.environ, **FRESH}
    result = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{args}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the wheels of tlsreload-plugins and of its Twisted endpoint, built as pip builds them."""
    tree = tmp_path_factory.mktemp("tree")
    ignored = (".git", ".venv", ".tox", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis")
    shutil.copytree(ROOT, tree, dirs_exist_ok=True, ignore=shutil.ignore_patterns(*ignored))
    found = tmp_path_factory.mktemp("wheels")
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", found, tree, tree / ENDPOINT.name)
    return found


def wheel(wheels: Path, distribution: str) -> Path:
    (found,) = wheels.glob(f"{distribution.replace('-', '_')}-*.whl")
    return found


def fresh_venv(path: Path, wheels: Path, requirement: str) -> Path:
    """A new virtual environment at ``path`` with ``requirement`` installed, the local wheels found through
    ``--find-links``; its Python."""
    # Without a pip of its own (ensurepip takes seconds): this environment's pip installs there (--python, pip 22.3+).
    run(sys.executable, "-m", "venv", "--without-pip", path)
    python = path / "bin" / "python"
    run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--find-links", wheels, requirement)
    return python


def test_the_package_alone_leaves_no_twisted_package_importable(wheels: Path, tmp_path: Path) -> None:
    names = zipfile.ZipFile(wheel(wheels, "tlsreload-plugins")).namelist()
    assert not [name for name in names if name.startswith("twisted/")], names
    python = fresh_venv(tmp_path / "venv", wheels, str(wheel(wheels, "tlsreload-plugins")))
    probe = "import importlib.util, tlsreload_plugins; print(importlib.util.find_spec('twisted'))"
    assert run(python, "-c", probe, cwd=tmp_path).strip() == "None"


def test_the_twisted_extra_brings_the_endpoint_twistd_serves_and_reloads(
    wheels: Path, tmp_path: Path, ca: trustme.CA
) -> None:
    # Only the plugin module: an __init__.py here would replace Twisted's own, which collects every plugin directory.
    names = [
        n for n in zipfile.ZipFile(wheel(wheels, "tlsreload-twisted-endpoint")).namelist() if ".dist-info/" not in n
    ]
    assert names == [PLUGIN.as_posix()], names
    python = fresh_venv(tmp_path / "venv", wheels, f"{wheel(wheels, 'tlsreload-plugins')}[twisted]")
    site = run(python, "-c", "import twisted, os; print(os.path.dirname(os.path.dirname(twisted.__file__)))").strip()
    assert (Path(site) / PLUGIN).read_bytes() == (ENDPOINT / "src" / PLUGIN).read_bytes()

    layout = KubeletLayout(tmp_path / "secret")
    first = issue(ca)
    layout.install(first)
    (tmp_path / "www").mkdir()
    port = free_port()
    description = (
        f"tlsreload:{port}:interface={HOST}:privateKey={layout.key_path}:certKey={layout.cert_path}:interval=0.3"
    )
    twistd = [str(python.parent / "twistd"), "-n", "--pidfile=", "web", "--listen", description, "--path", "www"]
    ctx = client_context(ca)
    with run_server(twistd, tmp_path / "twistd.log", port, env=FRESH, cwd=tmp_path) as server:
        wait_for_serial(port, ctx, first.serial, DEADLINE)
        second = issue(ca)
        layout.install(second)
        wait_for_serial(port, ctx, second.serial, DEADLINE)
        out = server.output()
    assert "tlsreload: reloaded TLS certificate" in out, out
