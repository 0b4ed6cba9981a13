"""What the plugin loads into a worker: nothing a worker model does not use. Real servers, 2 workers each,
whose app answers which of asyncio, cryptography and prometheus_client its worker has loaded.

- A gunicorn sync worker loads no asyncio, and no prometheus_client (nor the package's metrics module) unless
  metrics are asked for.
- A worker loads the package's SNI machinery (``tlsreload_plugins.sni``) only with SNI identities configured, and its
  metrics module only with metrics on: shown both ways, in the workers of every server model here.
- The workers of the spawn-based servers (tlsreload-uvicorn --workers, tlsreload-hypercorn) take their
  parent's verdict on the files, at start, on every rotation and on a bad pair (its refusal, which each worker
  reports), and load no cryptography, nor the package's validation machinery (``tlsreload_plugins.validation``).
  A trio worker loads no asyncio.
- A serving process that validates (tlsreload-uvicorn in one process, a gunicorn sync or gevent worker) does so
  in a short-lived child process and never loads cryptography, at start, after a reload nor after a refusal.
"""

from __future__ import annotations

import os
import re
import signal
import ssl
import sys
from pathlib import Path

import pytest
import trustme

from gunicorn_apps import WATCHED
from test_hypercorn import unless_hypercorn_left_on_hup
from tlstest import HOST, KubeletLayout, client_context, free_port, get, issue, run_server, wait_until

TESTS = Path(__file__).parent
INTERVAL = "0.3"
DEADLINE = 30.0
LAST_GOOD = "serving the last good certificate this server served"
PYTHONPATH = os.pathsep.join([str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])])
"""The servers' path: the tests' apps, then the tree under test when one is on ``PYTHONPATH`` (not the install)."""


def ask(port: int, ctx: ssl.SSLContext) -> tuple[str, int, set[str]]:
    """One request on a new connection: (serial served, worker pid, modules the worker has loaded)."""
    serial, response = get(port, ctx)
    match = re.search(rb"pid=(\d+) loaded=([\w.,]*)", response)
    assert match, response
    return serial, int(match.group(1)), set(filter(None, match.group(2).decode().split(",")))


def every_worker(port: int, ctx: ssl.SSLContext, serial: str, besides: set[int] = frozenset()) -> dict[int, set[str]]:
    """Poll until two workers have served ``serial``, one of them not among ``besides``; the modules each has
    loaded."""
    workers: dict[int, set[str]] = {}

    def both() -> bool:
        for _ in range(6):
            served, pid, loaded = ask(port, ctx)
            if served == serial:
                workers[pid] = loaded
        return len(workers) >= 2 and bool(workers.keys() - besides)

    wait_until(both, DEADLINE, what=f"two workers serving {serial}")
    return workers


def command(server: str, port: int, layout: KubeletLayout) -> list[str]:
    cert, key = str(layout.cert_path), str(layout.key_path)
    if server == "gunicorn-sync":
        args = ["-m", "gunicorn", "-c", "python:tlsreload_plugins.gunicorn_conf", "--certfile", cert, "--keyfile", key]
        args += ["--bind", f"{HOST}:{port}", "--no-control-socket", "--workers", "2", "gunicorn_apps:wsgi_modules"]
        return args
    if server == "tlsreload-uvicorn":
        args = ["-m", "tlsreload_plugins.uvicorn", "gunicorn_apps:asgi_modules", "--app-dir", str(TESTS)]
        return [
            *args,
            "--host",
            HOST,
            "--port",
            str(port),
            "--workers",
            "2",
            "--ssl-certfile",
            cert,
            "--ssl-keyfile",
            key,
        ]
    if server == "tornado":
        files = ["--certfile", cert, "--keyfile", key]
        return ["-m", "asyncio_server_apps", "tornado", *files, "--port", str(port), "--processes", "2"]
    worker_class = server.removeprefix("tlsreload-hypercorn-")
    args = ["-m", "tlsreload_plugins.hypercorn", f"{TESTS / 'gunicorn_apps.py'}:asgi_modules", "--workers", "2"]
    return [*args, "--bind", f"{HOST}:{port}", "--worker-class", worker_class, "--certfile", cert, "--keyfile", key]


@pytest.mark.parametrize("metrics", ["0", "1"])
def test_a_sync_worker_loads_no_asyncio_and_prometheus_client_only_when_asked(
    tmp_path: Path, ca: trustme.CA, metrics: str
) -> None:
    layout = KubeletLayout(tmp_path / "secret")
    pair = issue(ca)
    layout.install(pair)
    port = free_port()
    env = {"PYTHONPATH": PYTHONPATH, "TLSRELOAD_INTERVAL": INTERVAL, "TLSRELOAD_METRICS": metrics}
    with run_server(command("gunicorn-sync", port, layout), tmp_path / "server.log", port, env=env) as running:
        workers = every_worker(port, client_context(ca), pair.serial)
        assert running.proc.poll() is None, running.output()
    for loaded in workers.values():
        assert "asyncio" not in loaded
        assert ("prometheus_client" in loaded) == (metrics == "1"), loaded
        assert ("tlsreload_plugins.metrics" in loaded) == (metrics == "1"), loaded
        assert "tlsreload_plugins.sni" not in loaded, loaded


@pytest.mark.parametrize("server", ["tlsreload-uvicorn", "tlsreload-hypercorn-asyncio", "tlsreload-hypercorn-trio"])
def test_spawned_workers_take_their_parent_s_verdicts_and_refusals(tmp_path: Path, ca: trustme.CA, server: str) -> None:
    layout = KubeletLayout(tmp_path / "secret")
    first, second = issue(ca), issue(ca)
    layout.install(first)
    port = free_port()
    ctx = client_context(ca)
    env = {"PYTHONPATH": PYTHONPATH}
    env["TLSRELOAD_INTERVAL"] = INTERVAL
    with run_server(command(server, port, layout), tmp_path / "server.log", port, env=env, cwd=tmp_path) as running:
        at_start = every_worker(port, ctx, first.serial)
        for loaded in at_start.values():
            assert "cryptography" not in loaded, loaded
            assert "tlsreload_plugins.validation" not in loaded, loaded
            assert "prometheus_client" not in loaded, loaded
            not_configured = {"tlsreload_plugins.sni", "tlsreload_plugins.metrics", "tlsreload_plugins.sources"}
            assert not loaded & not_configured, loaded
            assert ("asyncio" in loaded) == (not server.endswith("trio")), loaded
        # A rotation: every worker serves it on the parent's verdict, still without cryptography.
        layout.install(second)
        rotated = every_worker(port, ctx, second.serial)
        assert all(not loaded & {"cryptography", "tlsreload_plugins.validation"} for loaded in rotated.values()), (
            rotated
        )
        # A bad pair the parent refuses: each worker takes its refusal, reports it and keeps the second; a worker
        # started now serves the second at once, on that refusal: no worker loads cryptography.
        layout.write_raw(first.chain, second.key)
        wait_until(
            lambda: running.output().count("certificate reload failed") >= 2, DEADLINE, what="each worker refusing"
        )
        after = every_worker(port, ctx, second.serial)
        running.proc.send_signal(signal.SIGHUP)  # both servers replace their workers
        wait_until(
            lambda: unless_hypercorn_left_on_hup(running) or LAST_GOOD in running.output(),
            DEADLINE,
            what="a new worker on the last good pair",
        )
        replaced = every_worker(port, ctx, second.serial, besides=set(after))
        assert running.proc.poll() is None, running.output()
    for loaded in [*after.values(), *replaced.values()]:
        assert not loaded & {"cryptography", "tlsreload_plugins.validation"}, loaded
        assert not loaded & {"tlsreload_plugins.sni", "tlsreload_plugins.metrics", "tlsreload_plugins.sources"}
    out = running.output()
    assert "Traceback" not in out
    refusals = [line for line in out.splitlines() if "certificate reload failed" in line or LAST_GOOD in line]
    assert all("does not match" in line for line in refusals), refusals


def test_the_core_imports_no_cryptography_until_it_parses(tmp_path: Path) -> None:
    import subprocess

    watched = WATCHED
    code = (
        "import sys, tlsreload_plugins, tlsreload_plugins.uvicorn, tlsreload_plugins.hypercorn,"
        " tlsreload_plugins.gunicorn;"
        f"print(sorted(m for m in {watched!r} if m in sys.modules));"
        # The package's public names load on first use, SNIIdentities with the SNI machinery.
        "from tlsreload_plugins import Reloader, SNIIdentities, fresh_context;"
        f"print(sorted(m for m in {watched!r} if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    glue, public = result.stdout.splitlines()
    # The glue imports its server where it runs it (asyncio comes with uvicorn and hypercorn); our modules add no
    # cryptography, no prometheus_client, and neither the SNI machinery, the metrics module nor SPIFFE's source
    # until they are used.
    assert glue in ("[]", "['asyncio']"), result.stdout
    assert "tlsreload_plugins.sni" in public and "cryptography" not in public, result.stdout


def test_a_worker_s_imports_make_no_data_class_nor_named_tuple() -> None:
    """A new worker of a spawn server (tlsreload-uvicorn, tlsreload-hypercorn) is a new interpreter that imports the
    glue before it serves: a data class or a NamedTuple generates its class as it is defined, many times what a
    slotted class costs (docs/restarts.md), and the start is measured against stock's (``benchmarks/worker_start.py``,
    ``benchmarks/recycle_throughput.py``). The package's records are :class:`~tlsreload_plugins.frozen.FrozenRecord`."""
    import subprocess

    code = (
        "import dataclasses, sys, tlsreload_plugins.uvicorn, tlsreload_plugins.hypercorn, tlsreload_plugins.gunicorn;"
        "print(sorted(f'{name}.{key}' for name, module in list(sys.modules.items())"
        " if name.startswith('tlsreload_plugins') for key, value in vars(module).items()"
        " if isinstance(value, type) and value.__module__ == name"
        " and (dataclasses.is_dataclass(value) or (issubclass(value, tuple) and hasattr(value, '_fields')))))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]", result.stdout


@pytest.mark.parametrize("server", ["gunicorn-sync", "tlsreload-uvicorn", "tlsreload-hypercorn-asyncio"])
def test_each_server_s_own_metrics_setting_turns_them_on(tmp_path: Path, ca: trustme.CA, server: str) -> None:
    """gunicorn: ``tls_metrics = True`` in the ./gunicorn.conf.py the drop-in reads; the drop-in commands:
    ``--tls-metrics``. Every worker then exports metrics (prometheus_client loaded)."""
    layout = KubeletLayout(tmp_path / "secret")
    pair = issue(ca)
    layout.install(pair)
    port = free_port()
    args = command(server, port, layout)
    if server == "gunicorn-sync":
        (tmp_path / "gunicorn.conf.py").write_text("tls_metrics = True\n")
    else:
        args.append("--tls-metrics")
    env = {"PYTHONPATH": PYTHONPATH, "TLSRELOAD_INTERVAL": INTERVAL}
    with run_server(args, tmp_path / "server.log", port, env=env, cwd=tmp_path) as running:
        workers = every_worker(port, client_context(ca), pair.serial)
        assert running.proc.poll() is None, running.output()
    assert all("prometheus_client" in loaded for loaded in workers.values()), workers
    assert all("tlsreload_plugins.metrics" in loaded for loaded in workers.values()), workers


@pytest.mark.parametrize("server", ["gunicorn-sync", "tlsreload-uvicorn", "tlsreload-hypercorn-asyncio"])
def test_a_bad_metrics_setting_stops_the_start_with_one_line(tmp_path: Path, ca: trustme.CA, server: str) -> None:
    layout = KubeletLayout(tmp_path / "secret")
    layout.install(issue(ca))
    port = free_port()
    env = {"PYTHONPATH": PYTHONPATH, "TLSRELOAD_METRICS": "sometimes"}
    with run_server(command(server, port, layout), tmp_path / "server.log", port, env=env, cwd=tmp_path) as running:
        wait_until(lambda: running.proc.poll() is not None, DEADLINE, what=f"{server} to stop")
        output = running.output()
    assert running.proc.returncode != 0, output
    assert "TLSRELOAD_METRICS must be 1 or 0" in output, output
    assert "Traceback" not in output, output


def one_serving_process(server: str, port: int, layout: KubeletLayout) -> list[str]:
    """``server`` serving from one process: tlsreload-uvicorn without ``--workers``, gunicorn with one worker."""
    if server == "tlsreload-uvicorn":
        args = command(server, port, layout)
        at = args.index("--workers")
        return args[:at] + args[at + 2 :]
    worker_class = server.removeprefix("gunicorn-")
    args = command("gunicorn-sync", port, layout)
    args[args.index("--workers") + 1] = "1"
    return [*args[:-1], "--worker-class", worker_class, args[-1]]


def children_of(pid: int) -> list[str]:
    """The processes whose parent is ``pid``, zombies included (``pid state``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(f"{entry.name} {fields[0]}")
    return found


@pytest.mark.parametrize("server", ["tlsreload-uvicorn", "gunicorn-sync", "gunicorn-gevent"])
def test_a_serving_process_validates_in_a_child_and_never_loads_cryptography(
    tmp_path: Path, ca: trustme.CA, server: str
) -> None:
    """Issue 25: the one process of tlsreload-uvicorn (no ``--workers``) and a gunicorn worker (sync; gevent, whose
    checks run on its hub's native threads) validate each new pair in a short-lived child process, so none loads
    cryptography: at start, after a reload, nor after refusing a bad pair (with the usual reason). The child is
    reaped by then, and no warning says validation fell back into the process."""
    layout = KubeletLayout(tmp_path / "secret")
    first, second = issue(ca), issue(ca)
    layout.install(first)
    port = free_port()
    ctx = client_context(ca)
    env = {"PYTHONPATH": PYTHONPATH, "TLSRELOAD_INTERVAL": INTERVAL}
    args = one_serving_process(server, port, layout)
    with run_server(args, tmp_path / "server.log", port, env=env, cwd=tmp_path) as running:
        at_start = every_worker_once(port, ctx, first.serial)
        layout.install(second)
        reloaded = every_worker_once(port, ctx, second.serial)
        layout.write_raw(second.chain, first.key)
        wait_until(lambda: "certificate reload failed" in running.output(), DEADLINE, what="the bad pair refused")
        refused = every_worker_once(port, ctx, second.serial)
        assert running.proc.poll() is None, running.output()
        output = running.output()
        pid = next(iter(refused))
        assert children_of(pid) == [], output
    assert at_start.keys() == reloaded.keys() == refused.keys(), (at_start, reloaded, refused)  # one process
    for loaded in (*at_start.values(), *reloaded.values(), *refused.values()):
        assert "cryptography" not in loaded, output
    assert "does not match the certificate" in output, output
    assert "validated in this process" not in output and "Traceback" not in output, output


def opened(port: int, ctx: ssl.SSLContext) -> tuple[str, int, int]:
    """One request on a new connection: (serial served, worker pid, how many watched files it has opened)."""
    serial, response = get(port, ctx)
    match = re.search(rb"pid=(\d+) .* opened=(\d+)", response)
    assert match, response
    return serial, int(match.group(1)), int(match.group(2))


@pytest.mark.parametrize("server", ["gunicorn-sync", "tlsreload-uvicorn", "tlsreload-hypercorn-asyncio", "tornado"])
def test_workers_never_open_a_watched_file(tmp_path: Path, ca: trustme.CA, server: str) -> None:
    """Issue 46: the workers load only what the server's one reader published, never the watched files: at start,
    after a rotation, while the files are broken and in a worker started meanwhile (gunicorn's). Counted by an audit
    hook in each worker, which does count the files' opens in tlsreload-uvicorn's one process, which reads them.
    Tornado's children under ``fork_processes`` too, and one it restarts while the files are broken."""
    layout = KubeletLayout(tmp_path / "secret")
    first, second = issue(ca), issue(ca)
    layout.install(first)
    ctx = client_context(ca)
    env = {"PYTHONPATH": PYTHONPATH, "TLSRELOAD_INTERVAL": INTERVAL, "TLSTEST_OPENS_UNDER": str(layout.root)}
    port = free_port()
    one = one_serving_process("tlsreload-uvicorn", port, layout)
    with run_server(one, tmp_path / "uvicorn.log", port, env=env, cwd=tmp_path):
        wait_until(lambda: opened(port, ctx)[2] > 0, DEADLINE, what="the probe counting a process's own reads")
    port = free_port()
    seen: dict[int, int] = {}

    def served(serial: str, workers: int) -> bool:
        for _ in range(6):
            answer, pid, count = opened(port, ctx)
            if answer == serial:
                seen[pid] = count
        return len(seen) >= workers

    with run_server(command(server, port, layout), tmp_path / "server.log", port, env=env, cwd=tmp_path) as running:
        wait_until(lambda: served(first.serial, 2), DEADLINE, what="both workers")
        layout.install(second)
        seen.clear()
        wait_until(lambda: served(second.serial, 2), DEADLINE, what="the rotation in both workers")
        layout.write_raw(first.chain, second.key)
        wait_until(lambda: "certificate reload failed" in running.output(), DEADLINE, what="the bad pair refused")
        if server in ("gunicorn-sync", "tornado"):  # a worker the server starts now, while the files are broken
            os.kill(next(iter(seen)), signal.SIGKILL)
            before = set(seen)
            wait_until(lambda: served(second.serial, 2) and seen.keys() - before, DEADLINE, what="a new worker")
        output = running.output()
    assert all(count == 0 for count in seen.values()), (seen, output)
    assert server not in ("gunicorn-sync", "tornado") or LAST_GOOD in output, output


def every_worker_once(port: int, ctx: ssl.SSLContext, serial: str) -> dict[int, set[str]]:
    """Poll until a worker serves ``serial``; the modules it has loaded, by pid."""
    seen: dict[int, set[str]] = {}

    def served() -> bool:
        answer, pid, loaded = ask(port, ctx)
        if answer == serial:
            seen[pid] = loaded
        return bool(seen)

    wait_until(served, DEADLINE, what=f"{serial} served")
    return seen


@pytest.mark.parametrize("server", ["gunicorn-sync", "tlsreload-uvicorn", "tlsreload-hypercorn-asyncio"])
def test_a_worker_with_sni_identities_loads_the_sni_machinery_and_serves_them(
    tmp_path: Path, ca: trustme.CA, server: str
) -> None:
    """The other side of "no SNI configured, no ``tlsreload_plugins.sni``": with ``$TLSRELOAD_SNI`` naming a
    directory of identities, every worker loads it and serves the identity a client names."""
    layout, site = KubeletLayout(tmp_path / "secret"), KubeletLayout(tmp_path / "sni" / "site")
    pair, named = issue(ca), issue(ca, "site.example")
    layout.install(pair)
    site.install(named)
    port = free_port()
    env = {"PYTHONPATH": PYTHONPATH, "TLSRELOAD_INTERVAL": INTERVAL, "TLSRELOAD_SNI": str(tmp_path / "sni")}
    ctx = client_context(ca)
    with run_server(command(server, port, layout), tmp_path / "server.log", port, env=env, cwd=tmp_path) as running:
        workers = every_worker(port, ctx, pair.serial)
        wait_until(lambda: get(port, ctx, server_name="site.example")[0] == named.serial, DEADLINE, what="the SNI site")
        assert running.proc.poll() is None, running.output()
    assert all("tlsreload_plugins.sni" in loaded for loaded in workers.values()), workers
