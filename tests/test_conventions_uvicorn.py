"""The uvicorn adapter follows uvicorn's conventions: usage errors exit 2 with one line, ``UVICORN_*``
variables and ``--version`` work for the added option too, every option reaches uvicorn through the public
``uvicorn.run``, encrypted keys work through $TLSRELOAD_KEY_PASSWORD_FILE, and a missing extra or a moved
uvicorn API is one clear line. Real uvicorn processes and real TLS clients."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import httpx
import pytest
import trustme

from test_uvicorn import (
    DROP_IN,
    FAILED,
    INTERVAL,
    RELOADED,
    STARTUP_FAILURE,
    TESTS,
    drop_in,
    get,
    lines_with,
    run,
    script,
    start,
    stop_cleanly,
)
from tlstest import HOST, KubeletLayout, Pair, client_context, free_port, issue, run_server, wait_for_serial, wait_until
from tlstest import with_password as with_key_password

DEADLINE = 30.0


def drop_in_run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = run([sys.executable, *DROP_IN, *args], env={**os.environ, **(env or {})})
    return result.returncode, result.stdout + result.stderr


def test_keyfile_without_certfile_is_a_usage_error(tmp_path: Path, ca: trustme.CA) -> None:
    (tmp_path / "tls.key").write_bytes(issue(ca).key)
    code, out = drop_in_run("uvicorn_apps:plain", "--app-dir", str(TESTS), "--ssl-keyfile", str(tmp_path / "tls.key"))
    assert code == 2, out
    assert out.splitlines()[-1] == (
        "Error: --ssl-keyfile needs --ssl-certfile (the key may be in the certificate file, not the other way round)"
    )
    assert "Traceback" not in out and "WARNING" not in out, out


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--tls-reload-interval", "0.05"], {}, "--tls-reload-interval"),
        ([], {"UVICORN_TLS_RELOAD_INTERVAL": "1e-9"}, "--tls-reload-interval"),
        ([], {"TLSRELOAD_INTERVAL": "1e-9"}, "TLSRELOAD_INTERVAL must be a number of seconds >= 0.1"),
    ],
    ids=["option", "UVICORN_ variable", "TLSRELOAD_ variable"],
)
def test_intervals_below_the_floor_are_usage_errors(args: list[str], env: dict[str, str], named: str) -> None:
    code, out = drop_in_run("app:app", *args, env=env)
    assert code == 2 and named in out.splitlines()[-1], out
    assert "Traceback" not in out, out


def test_uvicorn_variable_sets_the_interval(ca: trustme.CA, tmp_path: Path) -> None:
    layout = KubeletLayout(tmp_path / "tls")
    first, second = issue(ca), issue(ca)
    layout.install(first)
    port = free_port()
    ctx = client_context(ca)
    args = drop_in(port, layout)
    args.remove("--tls-reload-interval")
    args.remove(INTERVAL)
    env = {"UVICORN_TLS_RELOAD_INTERVAL": "0.25", "TLSRELOAD_INTERVAL": "5"}  # uvicorn's variable wins, as the option
    with run_server(args, tmp_path / "server.log", port, env=env, cwd=tmp_path) as server:
        wait_for_serial(port, ctx, first.serial, DEADLINE)
        layout.install(second)
        wait_for_serial(port, ctx, second.serial, DEADLINE)
        out = stop_cleanly(server, signal.SIGTERM)
    assert "every 0.25s" in lines_with(out, "tlsreload: watching")[0]


def test_version_names_uvicorn_and_this_package() -> None:
    stock = run([sys.executable, "-m", "uvicorn", "--version"])
    ours = run([sys.executable, *DROP_IN, "--version"])
    assert ours.returncode == 0 == stock.returncode
    import tlsreload_plugins

    assert ours.stdout.splitlines() == [stock.stdout.strip(), f"with tlsreload-plugins {tlsreload_plugins.__version__}"]


def test_every_option_reaches_uvicorn(ca: trustme.CA, tmp_path: Path) -> None:
    """Options are handed to uvicorn.run as uvicorn's command hands them: a few that need converting."""
    layout = KubeletLayout(tmp_path / "tls")
    first = issue(ca)
    layout.install(first)
    port = free_port()
    ctx = client_context(ca)
    extra = ["--header", "X-Served-By:tlsreload", "--no-server-header", "--reload-exclude", "*.log"]
    with start(drop_in(port, layout, *extra), tmp_path, port) as server:
        wait_for_serial(port, ctx, first.serial, DEADLINE)
        with httpx.Client(verify=ctx, timeout=10) as client:
            response = client.get(f"https://{HOST}:{port}/")
        assert response.headers["x-served-by"] == "tlsreload"
        assert "server" not in response.headers
        reload_warning = "Current configuration will not reload"  # uvicorn's own, for --reload-exclude
        out = stop_cleanly(server, signal.SIGTERM, reload_warning)
    assert len(lines_with(out, reload_warning)) == 1, out  # uvicorn's configuration was made once


def install(layout: KubeletLayout, pair: Pair, password: str) -> None:
    """Certificate, key and password file swapped as one (a Secret holding all three)."""
    layout.write_files({"tls.crt": pair.chain, "tls.key": pair.key, "password": f"{password}\n".encode()})


@pytest.mark.parametrize("way", ["drop-in --workers 2", "uvicorn.run"])
def test_encrypted_keys_with_a_password_file_that_changes_in_a_rotation(
    ca: trustme.CA, tmp_path: Path, way: str
) -> None:
    layout = KubeletLayout(tmp_path / "tls")
    passwords = ["first s3cret", "second s3cret", "third s3cret", "fourth s3cret"]
    pairs = [with_key_password(issue(ca), password) for password in passwords]
    install(layout, pairs[0], passwords[0])
    port = free_port()
    ctx = client_context(ca)
    if way == "uvicorn.run":
        cert, key = str(layout.cert_path), str(layout.key_path)
        args = script(TESTS / "uvicorn_apps.py", "starlette_app", str(port), cert, key)  # with the extension
    else:
        args = drop_in(port, layout, "--workers", "2")
    env = {"TLSRELOAD_INTERVAL": INTERVAL, "TLSRELOAD_KEY_PASSWORD_FILE": str(layout.root / "password")}
    workers = 2 if "--workers" in way else 1
    with run_server(args, tmp_path / "server.log", port, env=env, cwd=tmp_path) as server:
        wait_for_serial(port, ctx, pairs[0].serial, DEADLINE)
        install(layout, pairs[1], passwords[1])
        wait_until(lambda: len(lines_with(server.output(), RELOADED)) == workers, DEADLINE, what="every reload")
        wait_for_serial(port, ctx, pairs[1].serial, DEADLINE, attempts=6)
        install(layout, pairs[2], "not the third password")
        wait_until(lambda: len(lines_with(server.output(), FAILED)) == workers, DEADLINE, what="the failures")
        assert {get(port, ctx)[0] for _ in range(6)} == {pairs[1].serial}
        install(layout, pairs[3], passwords[3])
        wait_until(lambda: len(lines_with(server.output(), RELOADED)) == 2 * workers, DEADLINE, what="every reload")
        wait_for_serial(port, ctx, pairs[3].serial, DEADLINE, attempts=6)
        out = stop_cleanly(server, signal.SIGTERM, FAILED)
    assert all("wrong password" in line for line in lines_with(out, FAILED)), out
    assert "s3cret" not in out


def test_without_the_uvicorn_extra_one_line_names_it() -> None:
    block = "import sys; sys.modules['click'] = None; from tlsreload_plugins.uvicorn import main; main(['app:app'])"
    result = run([sys.executable, "-c", block])
    assert result.returncode == 1, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("tlsreload-uvicorn needs uvicorn, which is not installed") and "click" in line
    assert line.endswith("pip install 'tlsreload-plugins[uvicorn]'")


MOVED = {
    # An older uvicorn: its run() has no ssl_context_factory.
    "run without ssl_context_factory": (
        "def old_run(app, host='127.0.0.1', port=8000, **kwargs): pass\nuvicorn.run = old_run",
        "tlsreload-uvicorn needs uvicorn 0.47 or newer",
    ),
    # A newer uvicorn: an option its run() does not take under that name.
    "an option run() does not take": (
        "uvicorn.main.params.append(click.Option(['--brand-new'], is_flag=True))",
        "does not know how uvicorn",
    ),
}


@pytest.mark.parametrize("change", MOVED)
def test_a_moved_uvicorn_api_stops_the_command_with_one_line(change: str, tmp_path: Path, ca: trustme.CA) -> None:
    layout = KubeletLayout(tmp_path / "tls")
    layout.install(issue(ca))
    patch, message = MOVED[change]
    code = f"import click, uvicorn\n{patch}\nfrom tlsreload_plugins.uvicorn import main\nmain()\n"
    args = ["app:app", "--ssl-certfile", str(layout.cert_path), "--ssl-keyfile", str(layout.key_path)]
    result = run([sys.executable, "-c", code, *args])
    assert result.returncode == STARTUP_FAILURE, result.stderr
    (line,) = result.stderr.splitlines()
    assert message in line and "Traceback" not in result.stderr
