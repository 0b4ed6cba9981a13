"""What the plugin adds to one handshake, counted in CPU instructions (valgrind), without a network or a server.

The plugin's only per-handshake work is the ``sni_callback`` it sets on the server's context: one Python
call per ClientHello that moves the connection onto the newest context when there is a newer one. Its
cost is a few microseconds at most, far below what a shared 2-core host lets a timer resolve: the CPU
time of the very same handshake loop drifts by a fifth between batches seconds apart (measured here:
888 to 1,388 us per handshake for one context). Instructions do not drift: this script counts them.

A child process makes full TLS 1.3 handshakes between two :class:`ssl.SSLObject`\\ s over memory BIOs
(client and server in one thread, ECDSA P-256, no session reuse, the client reading the session
tickets) with one of three server contexts built by the same recipe:

* ``stock``: the recipe's context, no callback;
* ``plugin``: a :class:`~tlsreload_plugins.Reloader`'s context, never rotated (the callback runs and
  leaves the connection where it is: gevent, tornado, asgi, uvicorn and hypercorn between rotations);
* ``plugin, rotated``: the same after one reload (the callback moves every connection onto the
  rebuilt context: ``SSLObject.context = newest``, OpenSSL's ``SSL_set_SSL_CTX``).

Each child runs under ``valgrind --tool=callgrind`` twice, with ``--few`` and ``--many`` handshakes;
instructions per handshake = the difference of the two totals / the difference of the counts, which
cancels start-up, imports and building the contexts. Each figure is the median of ``--repeats``
such pairs. Reported: instructions per handshake (client and server together) and the plugin's
extra instructions, as a share of the whole handshake; the server's own share of a handshake is
about half, so the plugin's share of the server's work is about twice that.

    python benchmarks/callback_cost.py          # 3 repeats of 10 and 60 handshakes per context: about 4 minutes
    python benchmarks/callback_cost.py --quick
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import benchkit as kit

SIDES = ("stock", "plugin", "plugin, rotated")
_COLLECTED = re.compile(r"Collected : (\d+)")


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext) -> None:
    """One full handshake over memory BIOs, pumping bytes between the two ends until both are done."""
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname="localhost")
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(20):
        for name, end, out, peer_in in (("client", client, c_out, s_in), ("server", server, s_out, c_in)):
            if not done[name]:
                try:
                    end.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
            if out.pending:
                peer_in.write(out.read())
        if all(done.values()) and not c_out.pending and not s_out.pending:
            # TLS 1.3: the server's session tickets follow the handshake; the client reads them as a real one does.
            with contextlib.suppress(ssl.SSLWantReadError):
                client.read(1)
            return
    raise RuntimeError("the handshake did not complete")


def child(side: str, handshakes: int, directory: Path) -> None:
    """What runs under valgrind: build ``side``'s server context from the pairs in ``directory``, then handshake."""
    from tlsreload_plugins import Outcome, Reloader

    cert, key = directory / f"{side.replace(', ', '-')}.crt", directory / f"{side.replace(', ', '-')}.key"
    _write(cert, (directory / "first.crt").read_bytes())
    _write(key, (directory / "first.key").read_bytes())

    def recipe() -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(str(cert), str(key))
        return ctx

    if side == "stock":
        server_ctx = recipe()
    else:
        reloader = Reloader(str(cert), str(key), recipe=recipe)
        if side == "plugin, rotated":
            _write(cert, (directory / "second.crt").read_bytes())
            _write(key, (directory / "second.key").read_bytes())
            if reloader.check(settle=False) is not Outcome.RELOADED:
                raise RuntimeError("the reloader did not reload")
        server_ctx = reloader.context
    client_ctx = kit.client_context()
    client_ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    for _ in range(handshakes):
        handshake(server_ctx, client_ctx)


def instructions(side: str, handshakes: int, directory: Path) -> int:
    """Instructions a child making ``handshakes`` handshakes with ``side``'s context executed, all of it."""
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__]
    env = {**os.environ, "PYTHONHASHSEED": "0"}  # the same hashing in every run: fewer instructions that vary
    done = subprocess.run(
        [*cmd, "--child", side, str(handshakes), str(directory)], capture_output=True, text=True, timeout=1800, env=env
    )
    match = _COLLECTED.search(done.stderr)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"valgrind run failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return int(match.group(1))


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = {"repeats": args.repeats, "few": args.few, "many": args.many}
    if shutil.which("valgrind") is None:
        kit.log("valgrind not found: callback_cost skipped (apt-get install valgrind)")
        return {"benchmark": "callback_cost", "settings": settings, "skipped": "valgrind not found", "targets": []}
    per_handshake: dict[str, list[float]] = {side: [] for side in SIDES}
    with kit.work_dir("callback") as tmp:
        ca = kit.CA()
        for name, pair in (("first", ca.issue()), ("second", ca.issue())):
            (tmp / f"{name}.crt").write_bytes(pair.chain)
            (tmp / f"{name}.key").write_bytes(pair.key)
        for r in range(args.repeats):
            for side in SIDES:
                few, many = instructions(side, args.few, tmp), instructions(side, args.many, tmp)
                per_handshake[side].append((many - few) / (args.many - args.few))
            kit.log(
                f"callback cost {r + 1}/{args.repeats}: "
                + ", ".join(f"{side} {per_handshake[side][-1]:,.0f}" for side in SIDES)
                + " instructions per handshake"
            )
    medians = {side: kit.median(values) for side, values in per_handshake.items()}
    return {
        "benchmark": "callback_cost",
        "settings": settings,
        "instructions_per_handshake": medians,
        "extra_instructions": {side: medians[side] - medians["stock"] for side in SIDES[1:]},
        "repeats_instructions": per_handshake,
        "targets": [],
    }


def report(result: dict[str, Any]) -> str:
    s = result["settings"]
    title = "### What the plugin adds to one handshake (instructions)\n\n"
    if "skipped" in result:
        return title + f"Skipped: {result['skipped']}."
    stock = result["instructions_per_handshake"]["stock"]
    rows = [
        (
            side,
            f"{result['instructions_per_handshake'][side]:,.0f}",
            " / ".join(f"{v:,.0f}" for v in result["repeats_instructions"][side]),
            "-" if side == "stock" else f"**{result['extra_instructions'][side]:+,.0f}**",
            "-" if side == "stock" else f"{result['extra_instructions'][side] / stock:+.2%}",
        )
        for side in SIDES
    ]
    headers = (
        "server context",
        "instructions per handshake, client + server (median)",
        "each repeat",
        "plugin's extra instructions",
        "share of the handshake",
    )
    return (
        title + f"`valgrind --tool=callgrind`, one process per context and count: full TLS 1.3 handshakes over memory "
        f"BIOs (ECDSA P-256), client and server in one thread; per handshake = (instructions with {s['many']} "
        f"handshakes - with {s['few']}) / {s['many'] - s['few']}, median of {s['repeats']} repeats. `plugin`: a "
        "reloader's context (its `sni_callback` runs and leaves the connection on it); `plugin, rotated`: after "
        "one reload (every connection is moved onto the rebuilt context). The server does about half of a "
        "handshake's work, so the plugin's share of the server's CPU is about twice the share shown.\n\n"
        + kit.table(headers, rows)
    )


def main(argv: list[str] | None = None) -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child" and argv is None:
        child(sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--few", type=int, default=10, help="handshakes of the shorter run")
    parser.add_argument("--many", type=int, default=60, help="handshakes of the longer run")
    return kit.run_script(parser, argv, {"repeats": 1, "few": 5, "many": 25}, run, report)


if __name__ == "__main__":
    sys.exit(main())
