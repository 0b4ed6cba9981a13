"""10,000 reloads in one process: RSS growth and open descriptors.

A :class:`tlsreload_plugins.Reloader` (gunicorn's recipe) over a kubelet-style secret volume
whose ``..data`` alternates between two pairs; ``check()`` after every swap must report
RELOADED. After a warm-up of 200 reloads, RSS (``VmRSS`` in /proc/self/status) and the number
of open descriptors (/proc/self/fd) are taken, then again after the run (both after
``gc.collect()``). The run is bounded in time (``--max-seconds``); the table says how many
reloads were done.

Targets: RSS growth under 5 MiB over 10,000 reloads; no growth in open descriptors.

    python benchmarks/reload_memory.py           # 10,000 reloads (at most 240 s)
    python benchmarks/reload_memory.py --quick   # 1,000 reloads
"""

from __future__ import annotations

import argparse
import gc
import os
import ssl
import sys
import time
from typing import Any

import benchkit as kit

from tlsreload_plugins import Outcome, Reloader

RSS_LIMIT_KIB = 5 * 1024


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def measure(reloads: int, warmup: int, max_seconds: float, key_type: str) -> dict[str, Any]:
    ca = kit.CA()
    pairs = (ca.issue(key_type), ca.issue(key_type))
    with kit.work_dir("memory") as tmp:
        volume = kit.KubeletDir(tmp / "secret")
        volume.install(pairs[0])

        def recipe() -> ssl.SSLContext:
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(str(volume.cert_path), str(volume.key_path))
            return ctx

        reloader = Reloader(str(volume.cert_path), str(volume.key_path), recipe=recipe, interval=1.0)
        done = 0

        def reload_once() -> None:
            nonlocal done
            volume.install(pairs[(done + 1) % 2])
            outcome = reloader.check()
            if outcome is not Outcome.RELOADED:
                raise RuntimeError(f"reload {done + 1} was {outcome}, not RELOADED")
            done += 1

        for _ in range(warmup):
            reload_once()
        gc.collect()
        rss_before, fds_before = rss_kib(), open_fds()
        start = time.monotonic()
        out_of_time = kit.time_bounded(max_seconds)
        measured = 0
        while measured < reloads and not out_of_time():
            reload_once()
            measured += 1
            if measured % 2000 == 0:
                kit.log(f"  {measured}/{reloads} reloads, RSS {rss_kib() - rss_before:+d} KiB")
        elapsed = time.monotonic() - start
        gc.collect()
        rss_after, fds_after = rss_kib(), open_fds()
        if reloader.status().reloads != done:
            raise RuntimeError(f"the reloader counted {reloader.status().reloads} reloads, expected {done}")
    return {
        "key_type": key_type,
        "warmup": warmup,
        "reloads": measured,
        "target_reloads": reloads,
        "seconds": elapsed,
        "rss_before_kib": rss_before,
        "rss_after_kib": rss_after,
        "rss_growth_kib": rss_after - rss_before,
        "fds_before": fds_before,
        "fds_after": fds_after,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    kit.log(
        f"memory: {args.reloads} reloads after {args.warmup} warm-up ({args.key_type}, at most {args.max_seconds}s)"
    )
    r = measure(args.reloads, args.warmup, args.max_seconds, args.key_type)
    complete = r["reloads"] >= r["target_reloads"]
    suffix = "" if complete else f" (only {r['reloads']} reloads in {args.max_seconds:g} s)"
    targets = [
        kit.target_row(
            f"RSS growth over {r['target_reloads']} reloads < 5 MiB",
            f"{r['rss_growth_kib'] / 1024:+.2f} MiB{suffix}",
            complete and r["rss_growth_kib"] < RSS_LIMIT_KIB,
        ),
        kit.target_row(
            f"open descriptors after {r['target_reloads']} reloads: no growth",
            f"{r['fds_before']} -> {r['fds_after']}{suffix}",
            complete and r["fds_after"] <= r["fds_before"],
        ),
    ]
    return {"benchmark": "reload_memory", "settings": vars(args) | {"json": None}, "results": [r], "targets": targets}


def report(result: dict[str, Any]) -> str:
    r = result["results"][0]
    rows = [
        (
            r["key_type"],
            r["reloads"],
            f"{r['seconds']:.0f}",
            f"{r['reloads'] / r['seconds']:.0f}" if r["seconds"] else "-",
            f"{r['rss_before_kib'] / 1024:.1f}",
            f"{r['rss_after_kib'] / 1024:.1f}",
            f"**{r['rss_growth_kib'] / 1024:+.2f}**",
            f"{r['fds_before']} -> {r['fds_after']}",
        )
        for r in result["results"]
    ]
    headers = ("key type", "reloads", "s", "reloads/s", "RSS before MiB", "RSS after MiB", "growth MiB", "open fds")
    return (
        "### Memory and descriptors over many reloads\n\n"
        f"One process, `Reloader.check()` after each kubelet `..data` swap between two pairs, measured after "
        f"{r['warmup']} warm-up reloads.\n\n" + kit.table(headers, rows)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reloads", type=int, default=10_000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--max-seconds", type=float, default=240.0, help="stop reloading after this long")
    parser.add_argument("--key-type", default="ecdsa-p256", choices=kit.KEY_TYPES)
    return kit.run_script(parser, argv, {"reloads": 1000, "warmup": 100}, run, report)


if __name__ == "__main__":
    sys.exit(main())
