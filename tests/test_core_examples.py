"""examples/aiohttp_app.py and examples/http_server.py: the core API in servers that take an ``ssl.SSLContext``.

Each example runs as a subprocess, under handshake load, while the files rotate the way kubelet and certbot
write them; a mismatched pair in between is refused and the last good certificate keeps serving."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trustme

from tlstest import (
    HOST,
    LAYOUTS,
    Hammer,
    client_context,
    free_port,
    issue,
    run_server,
    served_serial,
    wait_for_serial,
    wait_until,
)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize(
    ("example", "layout_name"),
    [
        ("aiohttp_app.py", "kubelet"),
        ("aiohttp_app.py", "certbot"),
        ("http_server.py", "kubelet"),
        ("http_server.py", "certbot"),
    ],
)
def test_example_serves_rotations_under_load(tmp_path: Path, ca: trustme.CA, example: str, layout_name: str) -> None:
    layout = LAYOUTS[layout_name](tmp_path / "tls")
    first, second, third = issue(ca), issue(ca), issue(ca)
    layout.install(first)
    port = free_port()
    ctx = client_context(ca)
    args = [
        sys.executable,
        str(EXAMPLES / example),
        "--certfile",
        str(layout.cert_path),
        "--keyfile",
        str(layout.key_path),
    ]
    args += ["--host", HOST, "--port", str(port), "--interval", "0.2"]
    with run_server(args, tmp_path / "server.log", port) as server:
        wait_until(lambda: served_serial(port, ctx) == first.serial, 30, 0.25, what="the example to serve")
        with Hammer(port, ctx, threads=3) as hammer:
            layout.install(second)
            wait_for_serial(port, ctx, second.serial, 20)
            layout.write_raw(third.chain, first.key)  # a mismatched pair: refused, second keeps serving
            wait_until(lambda: "certificate reload failed" in server.output(), 20, 0.25, what="the refusal")
            assert served_serial(port, ctx) == second.serial
            layout.install(third)
            wait_for_serial(port, ctx, third.serial, 20)
        assert server.proc.poll() is None, server.output()
    assert hammer.successes > 0
    assert hammer.failures == [], hammer.failures[:5]
    assert hammer.serials <= {first.serial, second.serial, third.serial}
    assert server.output().count("certificate reload failed") == 1, server.output()
