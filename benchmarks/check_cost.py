"""Cost of one check with nothing changed, and of one reload, in microseconds, per key type.

Uses the core directly: a :class:`tlsreload_plugins.Reloader` over plain files with gunicorn's
recipe (``create_default_context(CLIENT_AUTH)`` + ``load_cert_chain``).

* unchanged check: ``reloader.check()`` in a loop over files that do not change (read both
  files, fingerprint); the figure is the median over repeats of the mean per call.
* reload: the files alternate between two pairs (written with write-then-rename, outside the
  timing); each timed ``check()`` reads, validates, builds a new context with the recipe and
  swaps it in; the figure is the median (and 90th percentile) of single reloads.

Target: an unchanged check of a cert+key pair costs at most 50 us.

    python benchmarks/check_cost.py            # 7 x 2000 unchanged checks, up to 300 reloads / 20 s per key type
    python benchmarks/check_cost.py --quick
"""

from __future__ import annotations

import argparse
import os
import ssl
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import benchkit as kit

from tlsreload_plugins import Outcome, Reloader
from tlsreload_plugins.files import read_files
from tlsreload_plugins.identity import validate

UNCHANGED_TARGET_US = 50.0


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def measure(
    key_type: str,
    repeats: int,
    checks: int,
    reloads: int,
    reload_seconds: float,
    tmp: Path,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """One key type's figures. ``clock`` times every step: wall time by default; ``time.process_time`` counts
    this process's CPU time only, which a busy machine disturbs less (``against_commit.py`` uses it)."""
    ca = kit.CA()
    pair_a = ca.issue(key_type)
    pair_b = ca.issue(key_type)
    cert, key = tmp / f"{key_type}.crt", tmp / f"{key_type}.key"
    _write(cert, pair_a.chain)
    _write(key, pair_a.key)

    def recipe() -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(str(cert), str(key))
        return ctx

    reloader = Reloader(str(cert), str(key), recipe=recipe, interval=1.0)
    for _ in range(100):  # warm-up
        reloader.check()
    per_call: list[float] = []
    for _ in range(repeats):
        start = clock()
        for _ in range(checks):
            reloader.check()
        per_call.append((clock() - start) / checks * 1e6)
    if reloader.check() is not Outcome.UNCHANGED:
        raise RuntimeError("the unchanged files were not reported UNCHANGED")

    reload_us: list[float] = []
    validate_us: list[float] = []
    recipe_us: list[float] = []
    out_of_time = kit.time_bounded(reload_seconds)
    pairs = (pair_b, pair_a)
    while len(reload_us) < reloads and not out_of_time():
        pair = pairs[len(reload_us) % 2]
        _write(cert, pair.chain)
        _write(key, pair.key)
        start = clock()
        outcome = reloader.check()
        elapsed = clock() - start
        if outcome is not Outcome.RELOADED:
            raise RuntimeError(f"a new pair was not reloaded: {outcome}")
        reload_us.append(elapsed * 1e6)
        # Where a reload's time goes: the core's validation, or the server's recipe.
        start = clock()
        validate(read_files(reloader.files))
        validate_us.append((clock() - start) * 1e6)
        start = clock()
        recipe()
        recipe_us.append((clock() - start) * 1e6)
    return {
        "key_type": key_type,
        "unchanged_us_median": kit.median(per_call),
        "unchanged_us_min": min(per_call),
        "unchanged_repeats_us": per_call,
        "checks_per_repeat": checks,
        "reload_us_median": kit.median(reload_us),
        "reload_us_p90": kit.percentile(reload_us, 90),
        "reloads": len(reload_us),
        "validate_us_median": kit.median(validate_us),
        "recipe_us_median": kit.median(recipe_us),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    results = []
    with kit.work_dir("checkcost") as tmp:
        for key_type in args.key_types:
            kit.log(f"check cost: {key_type}")
            results.append(measure(key_type, args.repeats, args.checks, args.reloads, args.reload_seconds, tmp))
    targets = [
        kit.target_row(
            f"unchanged check, {r['key_type']} cert+key <= {UNCHANGED_TARGET_US:.0f} us",
            f"{r['unchanged_us_median']:.1f} us",
            r["unchanged_us_median"] <= UNCHANGED_TARGET_US,
        )
        for r in results
    ]
    return {
        "benchmark": "check_cost",
        "settings": {"repeats": args.repeats, "checks per repeat": args.checks, "max reloads": args.reloads},
        "results": results,
        "targets": targets,
    }


def report(result: dict[str, Any]) -> str:
    s = result["settings"]
    rows = [
        (
            r["key_type"],
            f"{r['unchanged_us_median']:.1f}",
            f"{r['unchanged_us_min']:.1f}",
            f"{r['reload_us_median']:.0f}",
            f"{r['reload_us_p90']:.0f}",
            f"{r['validate_us_median']:.0f}",
            f"{r['recipe_us_median']:.0f}",
            r["reloads"],
        )
        for r in result["results"]
    ]
    headers = (
        "key type",
        "unchanged check us (median)",
        "(best)",
        "reload us (median)",
        "reload us (p90)",
        "of which validate us",
        "of which recipe us",
        "reloads",
    )
    return (
        "### Cost of one check and of one reload\n\n"
        f"`Reloader.check()` in-process; unchanged: median of {s['repeats']} repeats x {s['checks per repeat']} "
        "checks; reload: single reloads alternating two pairs (read, validate, build context, swap); "
        "'validate' (`identity.validate`: parse chain and key, match them) and 'recipe' (the server's context "
        "build) are "
        "timed separately on the same files.\n\n" + kit.table(headers, rows)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--key-types", nargs="+", default=list(kit.KEY_TYPES), choices=kit.KEY_TYPES)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--checks", type=int, default=2000, help="unchanged checks per repeat")
    parser.add_argument("--reloads", type=int, default=300, help="at most this many reloads per key type")
    parser.add_argument("--reload-seconds", type=float, default=20.0, help="at most this long reloading per key type")
    quick = {"repeats": 3, "checks": 300, "reloads": 30, "reload_seconds": 5.0}
    return kit.run_script(parser, argv, quick, run, report)


if __name__ == "__main__":
    sys.exit(main())
