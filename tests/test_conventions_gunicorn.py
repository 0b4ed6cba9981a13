"""The gunicorn adapter follows gunicorn's conventions: the user's own configuration still applies with the
drop-in, start-up problems stop gunicorn before it binds with one line, encrypted keys work through
$TLSRELOAD_KEY_PASSWORD_FILE, and uvicorn-worker is configured through its documented CONFIG_KWARGS.
Real gunicorn processes and real TLS clients throughout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trustme
from uvicorn_worker import UvicornWorker

from test_gunicorn import (
    DROP_IN,
    FAILED,
    INTERVAL,
    RELOADED,
    UVICORN,
    assert_clean_exit,
    fetch,
    gunicorn,
    wait_every_worker,
)
from tlstest import HOST, KubeletLayout, Pair, client_context, free_port, issue, run_server, wait_until, with_password

TESTS = Path(__file__).parent
DEADLINE = 30.0
CANNOT_SERVE = "cannot serve TLS: "


class ForgetfulWorker(UvicornWorker):
    """A uvicorn-worker that no longer passes CONFIG_KWARGS on (as a future version might)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.config.ssl_context_factory = None


def gunicorn_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "gunicorn", "--no-control-socket", "--graceful-timeout", "5", *args]


def run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(TESTS), **(env or {})}
    return subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=cwd, env=full_env)


USER_CONFIG = """
bind = "{bind}"
workers = 2
worker_class = "gthread"


def post_worker_init(worker):
    worker.log.info("user config {version}: post_worker_init in worker %s", worker.pid)
"""


@pytest.mark.parametrize("where", ["./gunicorn.conf.py", "GUNICORN_CMD_ARGS=-c", "drop-in in GUNICORN_CMD_ARGS"])
def test_drop_in_keeps_the_configuration_gunicorn_would_read(tmp_path: Path, ca: trustme.CA, where: str) -> None:
    layout = KubeletLayout(tmp_path / "secret")
    pairs = [issue(ca) for _ in range(3)]
    layout.install(pairs[0])
    port = free_port()
    user_config = tmp_path / ("mine.conf.py" if where == "GUNICORN_CMD_ARGS=-c" else "gunicorn.conf.py")
    user_config.write_text(USER_CONFIG.format(bind=f"{HOST}:{port}", version="v1"))
    env = {"PYTHONPATH": str(TESTS), "TLSRELOAD_INTERVAL": INTERVAL}
    drop_in = ["-c", DROP_IN]
    if where == "drop-in in GUNICORN_CMD_ARGS":
        env["GUNICORN_CMD_ARGS"], drop_in = f"-c {DROP_IN}", []
    elif where == "GUNICORN_CMD_ARGS=-c":
        env["GUNICORN_CMD_ARGS"] = f"-c {user_config}"
        # gunicorn reads the -c of $GUNICORN_CMD_ARGS instead of ./gunicorn.conf.py; so does the drop-in.
        (tmp_path / "gunicorn.conf.py").write_text('raise SystemExit("./gunicorn.conf.py must not be read")\n')
    # No --bind, --workers or --worker-class: they come from the user's configuration.
    args = gunicorn_command(*drop_in, "--certfile", str(layout.cert_path), "--keyfile", str(layout.key_path))
    ctx = client_context(ca)
    with run_server([*args, "gunicorn_apps:wsgi"], tmp_path / "gunicorn.log", port, env=env, cwd=tmp_path) as server:
        first_pids = wait_every_worker(port, ctx, pairs[0].serial)
        layout.install(pairs[1])
        assert wait_every_worker(port, ctx, pairs[1].serial) == first_pids
        assert server.output().count("user config v1: post_worker_init") == 2, server.output()

        # HUP: gunicorn reads a configuration file again, and so does the drop-in.
        # A different length: Python's bytecode cache keys a source on its size and whole-second mtime, and
        # gunicorn loads configuration files through it, so a same-size rewrite within a second is not seen.
        user_config.write_text(USER_CONFIG.format(bind=f"{HOST}:{port}", version="v2 (after HUP)"))
        server.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: server.output().count("user config v2") == 2, DEADLINE, what="the new workers' hook")
        layout.install(pairs[2])
        wait_every_worker(port, ctx, pairs[2].serial)
        output = assert_clean_exit(server)
    assert "Using worker: gthread" in output
    assert f"the drop-in configuration also applies {user_config}" in output, output
    assert output.count(RELOADED) >= 4, output


START_PROBLEMS: dict[str, tuple[list[str], dict[str, str], str]] = {
    "missing certificate": (["--certfile", "{dir}/absent.crt", "--keyfile", "{key}"], {}, "does not exist"),
    "keyfile without certfile": (["--keyfile", "{key}"], {}, "--keyfile {key} is set but --certfile is not"),
    "mismatched pair": (["--certfile", "{cert}", "--keyfile", "{key}"], {}, "does not match the certificate"),
    "interval below the floor": (
        ["--certfile", "{cert}", "--keyfile", "{key}"],
        {"TLSRELOAD_INTERVAL": "1e-9"},
        "TLSRELOAD_INTERVAL must be a number of seconds >= 0.1",
    ),
    "bad expiry setting": (
        ["--certfile", "{cert}", "--keyfile", "{key}"],
        {"TLSRELOAD_EXPIRY_WARNING_DAYS": "soon"},
        "TLSRELOAD_EXPIRY_WARNING_DAYS must be a number",
    ),
    "encrypted key, no password file": (
        ["--certfile", "{cert}", "--keyfile", "{key}"],
        {},
        "is encrypted and no password is configured",
    ),
    "password file missing": (
        ["--certfile", "{cert}", "--keyfile", "{key}"],
        {"TLSRELOAD_KEY_PASSWORD_FILE": "{dir}/absent-password"},
        "does not exist",
    ),
}


@pytest.mark.parametrize("problem", START_PROBLEMS)
@pytest.mark.parametrize("how", ["drop-in", "reloading"])
def test_start_up_problems_stop_gunicorn_before_it_binds(
    tmp_path: Path, ca: trustme.CA, problem: str, how: str
) -> None:
    layout = KubeletLayout(tmp_path / "secret")
    pairs = [issue(ca), issue(ca)]
    if problem == "mismatched pair":
        layout.write_raw(pairs[0].chain, pairs[1].key)
    elif problem.startswith("encrypted key") or problem.startswith("password file"):
        protected = with_password(pairs[0], "s3cret")
        layout.write_raw(protected.chain, protected.key)
    else:
        layout.install(pairs[0])
    options, env, reason = START_PROBLEMS[problem]
    values = {"dir": str(tmp_path), "cert": str(layout.cert_path), "key": str(layout.key_path)}
    config = DROP_IN if how == "drop-in" else str(TESTS.parent / "examples" / "gunicorn.conf.py")
    args = [*gunicorn_command("-c", config), *(option.format(**values) for option in options)]
    args += ["--bind", f"{HOST}:{free_port()}", "gunicorn_apps:wsgi"]
    result = run(args, tmp_path, {name: value.format(**values) for name, value in env.items()})
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in output and "Listening at" not in output and "Booting worker" not in output, output
    (line,) = [line for line in output.splitlines() if CANNOT_SERVE in line]
    assert "[ERROR]" in line and reason.format(**values) in line, output


def test_the_library_named_as_configuration_is_refused(tmp_path: Path, ca: trustme.CA) -> None:
    layout = KubeletLayout(tmp_path / "secret")
    layout.install(issue(ca))
    args = gunicorn_command("-c", "python:tlsreload_plugins.gunicorn", "--certfile", str(layout.cert_path))
    result = run(
        [*args, "--keyfile", str(layout.key_path), "--bind", f"{HOST}:{free_port()}", "gunicorn_apps:wsgi"], tmp_path
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "Listening at" not in result.stderr, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert line.startswith("Error: python:tlsreload_plugins.gunicorn is tlsreload's library"), line
    assert "-c python:tlsreload_plugins.gunicorn_conf" in line


def test_without_certfile_the_drop_in_says_there_is_nothing_to_reload(tmp_path: Path) -> None:
    port = free_port()
    args = gunicorn_command("-c", DROP_IN, "--bind", f"{HOST}:{port}", "gunicorn_apps:wsgi")
    with run_server(args, tmp_path / "gunicorn.log", port, env={"PYTHONPATH": str(TESTS)}, cwd=tmp_path) as server:
        wait_until(lambda: "Booting worker" in server.output(), DEADLINE, what="a worker")
        output = assert_clean_exit(server)
    (line,) = [line for line in output.splitlines() if "[WARNING]" in line]
    assert "no --certfile given: serving without TLS, nothing to reload" in line


@pytest.mark.parametrize("worker_class", ["gthread", UVICORN])
def test_encrypted_keys_with_a_password_file_that_changes_in_a_rotation(
    tmp_path: Path, ca: trustme.CA, worker_class: str
) -> None:
    layout = KubeletLayout(tmp_path / "secret")
    passwords = ["first s3cret", "second s3cret", "third s3cret", "fourth s3cret"]
    pairs = [with_password(issue(ca), password) for password in passwords]

    def install(pair: Pair, password: str) -> None:  # key, certificate and password swapped as one
        layout.write_files({"tls.crt": pair.chain, "tls.key": pair.key, "password": f"{password}\n".encode()})

    install(pairs[0], "first s3cret")
    port = free_port()
    ctx = client_context(ca)
    args = gunicorn(port, layout.cert_path, layout.key_path, "-c", DROP_IN, worker_class=worker_class)
    env = {"PYTHONPATH": str(TESTS), "TLSRELOAD_INTERVAL": INTERVAL}
    env["TLSRELOAD_KEY_PASSWORD_FILE"] = str(layout.root / "password")
    with run_server(args, tmp_path / "gunicorn.log", port, env=env) as server:
        first_pids = wait_every_worker(port, ctx, pairs[0].serial)
        install(pairs[1], "second s3cret")
        assert wait_every_worker(port, ctx, pairs[1].serial) == first_pids
        # A key the password file does not open: reported, the last good one stays.
        install(pairs[2], "not the third password")
        wait_until(lambda: server.output().count(FAILED) >= 2, DEADLINE, what="both workers report the failure")
        assert {fetch(port, ctx)[0] for _ in range(6)} == {pairs[1].serial}
        # (The core remembers that content as bad: the fix comes with the next rotation.)
        install(pairs[3], "fourth s3cret")
        wait_every_worker(port, ctx, pairs[3].serial)
        output = assert_clean_exit(server)
    assert "wrong password" in output and "s3cret" not in output, output


def test_a_uvicorn_worker_that_drops_config_kwargs_stops_gunicorn_loudly(tmp_path: Path, ca: trustme.CA) -> None:
    layout = KubeletLayout(tmp_path / "secret")
    layout.install(issue(ca))
    args = gunicorn_command("-c", DROP_IN, "--certfile", str(layout.cert_path), "--keyfile", str(layout.key_path))
    args += ["--worker-class", "test_conventions_gunicorn.ForgetfulWorker", "--bind", f"{HOST}:{free_port()}"]
    result = run([*args, "gunicorn_apps:asgi"], tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 3, output  # gunicorn's "Worker failed to boot."
    assert "Traceback" not in output, output
    (line,) = [line for line in output.splitlines() if "[ERROR]" in line and "ssl_context_factory" in line]
    assert "ForgetfulWorker did not hand tlsreload's ssl_context_factory to uvicorn" in line
    assert "Worker failed to boot" in output


CACHING_HOOK = """
from tlsreload_plugins.gunicorn import reloading

_cached = []


def ssl_context(conf, default_ssl_context_factory):
    # A user's hook that builds its context once and hands the same object back every time.
    if not _cached:
        _cached.append(default_ssl_context_factory())
    return _cached[0]


reloading(globals())
"""

HOOK_AFTER_ADD_RELOAD = """
from tlsreload_plugins.gunicorn import reloading

reloading(globals())


def ssl_context(conf, default_ssl_context_factory):  # defined after reloading: replaces its hook
    return default_ssl_context_factory()
"""


@pytest.mark.parametrize(
    ("config", "error"),
    [(CACHING_HOOK, "returned a context already in use"), (HOOK_AFTER_ADD_RELOAD, "is not tlsreload's")],
    ids=["hook-caches-its-context", "hook-defined-after-reloading"],
)
def test_a_hook_that_defeats_reloading_is_an_error_never_a_reload_claim(
    tmp_path: Path, ca: trustme.CA, config: str, error: str
) -> None:
    layout = KubeletLayout(tmp_path / "secret")
    first, second = issue(ca), issue(ca)
    layout.install(first)
    (tmp_path / "hooks.conf.py").write_text(config)
    port = free_port()
    ctx = client_context(ca)
    config_file = str(tmp_path / "hooks.conf.py")
    args = gunicorn(port, layout.cert_path, layout.key_path, "-c", config_file, worker_class="gthread")
    env = {"PYTHONPATH": str(TESTS), "TLSRELOAD_INTERVAL": INTERVAL}
    with run_server(args, tmp_path / "gunicorn.log", port, env=env) as server:
        wait_every_worker(port, ctx, first.serial)
        layout.install(second)
        wait_until(lambda: server.output().count(error) >= 2, DEADLINE, what="an error from each worker")
        served = {fetch(port, ctx)[0] for _ in range(8)}
        output = assert_clean_exit(server)
    assert RELOADED not in output, output
    if config is CACHING_HOOK:
        assert served == {first.serial}  # the cached context is what every connection still gets
    assert "Traceback" not in output
