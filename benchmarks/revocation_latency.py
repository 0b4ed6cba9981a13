"""How soon a revocation reaches new handshakes in every worker: the time from writing a CRL that revokes a client to
the moment every worker refuses it (``--refusals`` new connections in a row refused), then from un-revoking to
every worker letting it in again. Real servers of the tests' shared matrix (tests/server_kinds.py), each with two
workers where the kind has them, checking every ``--interval`` seconds. Target (issue 34): within interval + 2 s.

    python benchmarks/revocation_latency.py                           # gunicorn sync and tlsreload-uvicorn, 5 each
    python benchmarks/revocation_latency.py --kinds asgi hypercorn --rounds 3 --interval 0.5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import trustme

import server_kinds
from hostile import place_good
from test_revocation import REFUSALS, Trust, ask, in_from_every_worker
from tlstest import RenameEachLayout, crl_pem, free_port, replace_file, run_server, wait_until


def measure(kind: str, rounds: int, interval: float) -> tuple[list[float], list[float]]:
    """(seconds to every worker refusing, seconds to every worker letting in again), per round."""
    ca = trustme.CA()
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        trust = Trust(root / "clients", ca)
        layout = RenameEachLayout(root / "tls")
        place_good(layout.cert_path, layout.key_path, ca)
        port = free_port()
        command = server_kinds.args(kind, port, layout, client_ca=trust.bundle, crl=trust.crl)
        tests = str(Path(__file__).resolve().parent.parent / "tests")
        paths = [tests, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        env = {"PYTHONPATH": os.pathsep.join(paths), "TLSRELOAD_INTERVAL": str(interval)}
        workers = server_kinds.workers(kind)
        holder = trust.client(trust.holder)
        revoked, back = [], []
        with run_server(command, root / "server.log", port, env=env, cwd=root) as server:
            in_from_every_worker(server, port, holder, workers, "at start")
            for _ in range(rounds):
                written = time.monotonic()
                replace_file(trust.crl, crl_pem(trust.ca, trust.holder))
                wait_until(lambda: not any(ask(port, holder).ok for _ in range(REFUSALS)), 60, interval=0.01)
                revoked.append(time.monotonic() - written)
                written = time.monotonic()
                replace_file(trust.crl, crl_pem(trust.ca))
                wait_until(lambda: len(in_from_every_worker(server, port, holder, workers, "back")) >= workers, 60)
                back.append(time.monotonic() - written)
        return revoked, back


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="+", default=["sync", "tlsreload-uvicorn"], choices=list(server_kinds.KINDS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args(argv)
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; interval {args.interval:g} s; {args.rounds} rounds")
    target = f"target <= {args.interval + 2:g} s"
    print(f"{'kind':20} {'revoked: median':>15} {'max':>6} {'back: median':>12} {'max':>6}  {target}")
    for kind in args.kinds:
        revoked, back = measure(kind, args.rounds, args.interval)
        print(f"{kind:20} {statistics.median(revoked):14.2f}s {max(revoked):5.2f}s "
              f"{statistics.median(back):11.2f}s {max(back):5.2f}s", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
