"""What a write to the last good store costs when it keeps 10,000 SNI identities: the writer's time, a sibling
process's next read (it takes in what changed), and the garbage collections the writes caused; then, the table
rewritten whole, what a handshake in the sibling reads (its last look, nothing taken in) against the sibling's
check taking the rewrite in.

A :class:`~tlsreload_plugins.lastgood.store.SharedStore` is filled with ``--count`` identities (random bytes the
size of an EC P-256 chain and key, one shared client-CA bundle), then ``--writes`` single identities are written
one at a time, a second view of the store (another process's: nothing cached) reading after each; then a burst
of 200 writes before one read. Nothing is validated: the store keeps bytes.

    python benchmarks/store_writes.py
    python benchmarks/store_writes.py --quick
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from typing import Any

import benchkit as kit

from tlsreload_plugins.files import Snapshot, TLSFiles
from tlsreload_plugins.lastgood.store import SharedStore

FILES = TLSFiles("tls.crt", "tls.key", "ca.crt")
TARGETS = {"write_ms": 5.0}
"""A single write at most 5 ms (median) with 10,000 identities kept: what the check thread may hold the GIL for."""


def identity(ca: bytes) -> Snapshot:
    return Snapshot(FILES, os.urandom(1400), os.urandom(240), ca)


def run(args: argparse.Namespace) -> dict[str, Any]:
    store = SharedStore()
    ca = os.urandom(1500)
    started = time.perf_counter()
    store.write_many({f"site{i:05d}": (identity(ca), None) for i in range(args.count)})
    filled = time.perf_counter() - started
    sibling = SharedStore.__new__(SharedStore)  # another process's view of the same mapping: nothing cached
    vars(sibling).update(vars(store), _cached=(-1, 0, {}))
    sibling.read("site00001")
    writes, reads = [], []
    before = [stats["collections"] for stats in gc.get_stats()]
    for i in range(args.writes):
        name = f"site{(i * 37) % args.count:05d}"
        started = time.perf_counter()
        store.write(identity(ca), name)
        writes.append(time.perf_counter() - started)
        started = time.perf_counter()
        sibling.read(name)
        reads.append(time.perf_counter() - started)
    after = [stats["collections"] for stats in gc.get_stats()]
    for i in range(200):
        store.write(identity(ca), f"site{(i * 53) % args.count:05d}")
    started = time.perf_counter()
    sibling.read("site00002")
    burst = time.perf_counter() - started
    # Every identity renewed, twice: the table is rewritten whole. What a handshake reads meanwhile (known(): the
    # sibling's last look, nothing taken in), and what the sibling's next check takes in (look()).
    for _ in range(2):
        store.write_many({f"site{i:05d}": (identity(ca), None) for i in range(args.count)})
    started = time.perf_counter()
    handshake_found = sibling.known("site00003") is not None
    handshake = time.perf_counter() - started
    started = time.perf_counter()
    sibling.look()
    look = time.perf_counter() - started
    row = {
        "count": args.count,
        "fill_ms": filled * 1000,
        "write_median_ms": kit.median(writes) * 1000,
        "write_max_ms": max(writes) * 1000,
        "read_median_ms": kit.median(reads) * 1000,
        "read_max_ms": max(reads) * 1000,
        "read_after_200_ms": burst * 1000,
        "known_after_rewrite_ms": handshake * 1000,
        "known_found": handshake_found,
        "look_after_rewrite_ms": look * 1000,
        "collections": [b - a for a, b in zip(before, after, strict=True)],
    }
    target = kit.target_row(
        f"a write with {args.count} identities kept <= {TARGETS['write_ms']:g} ms (median)",
        f"{row['write_median_ms']:.2f} ms",
        row["write_median_ms"] <= TARGETS["write_ms"],
    )
    return {
        "benchmark": "store_writes",
        "args": vars(args),
        "machine": kit.machine(),
        "rows": [row],
        "targets": [target],
    }


def report(result: dict[str, Any]) -> str:
    headers = ["identities", "fill", "write median", "write max", "sibling read", "max", "read after 200", "gc 0/1/2"]
    headers += ["rewritten: handshake's read", "check's look"]
    rows = [
        [
            r["count"],
            f"{r['fill_ms']:.0f} ms",
            f"{r['write_median_ms']:.2f} ms",
            f"{r['write_max_ms']:.2f} ms",
            f"{r['read_median_ms']:.2f} ms",
            f"{r['read_max_ms']:.2f} ms",
            f"{r['read_after_200_ms']:.2f} ms",
            " / ".join(map(str, r["collections"])),
            f"{r['known_after_rewrite_ms']:.3f} ms" + ("" if r["known_found"] else " (nothing)"),
            f"{r['look_after_rewrite_ms']:.1f} ms",
        ]
        for r in result["rows"]
    ]
    return kit.table(headers, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=10000, help="identities kept")
    parser.add_argument("--writes", type=int, default=300, help="single writes measured")
    return kit.run_script(parser, argv, {"count": 1000, "writes": 50}, run, report)


if __name__ == "__main__":
    raise SystemExit(main())
