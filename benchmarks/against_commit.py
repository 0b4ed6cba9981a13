"""The current tree against another commit (default 3b8285d), side by side in one run: what a change to the code costs.

The other commit's ``src/`` is extracted (``git archive``) into a temporary directory; nothing is installed.
Every process that runs the old code gets ``PYTHONPATH=<that dir>/src``, every process that runs the current
code ``PYTHONPATH=<this checkout>/src``, in front of the editable install. Before measuring, each server
kind is started once per tree with ``PYTHONVERBOSE=1``: every ``tlsreload_plugins`` file that any of its
processes (arbiter, forked or spawned workers) imported must come from that tree, or the script stops.
The measurements reuse the other scripts' functions:

* unchanged check: ``check_cost.measure`` in a child process per tree (which reports the file it imported),
  timed in the child's CPU time (``time.process_time``: a busy machine inflates wall time far more), the two
  trees alternating, the order swapped every round; per round the ratio new/old. The same child also times
  single reloads (reported).
* server CPU per handshake: an old and a new plugin server (1 worker each) in the same windows, the paired
  client of ``handshake_throughput.compare_paired``: each client process alternates its handshakes between
  the two; per window the ratio new/old of server CPU per handshake.
* PSS per worker: an old and a new plugin server side by side (the start order swapped every round),
  ``/proc/PID/smaps_rollup`` of every worker (``worker_memory.memory``) once every worker has answered and
  the checker has run (``start``), and again after ``--handshakes`` more connections (handshake + request);
  per round the difference new - old of the workers' mean.

Noise: for the ratios, a sign test over the rounds (how many rounds had new above old; two-sided p < 0.05
is "beyond noise"); for memory, whose few rounds a sign test cannot judge, a difference is beyond noise
when every round has the same sign and its median exceeds the larger round-to-round range of either side.
Targets: none to meet; each row says "new within noise of old" and fails only when new is higher beyond
noise.

``--new-commit REV`` measures that commit's ``src/`` (extracted the same way) instead of the working tree:
figures of a known state while others edit the checkout.

    python benchmarks/against_commit.py                     # 12-15 minutes on 2 busy cores
    python benchmarks/against_commit.py --new-commit HEAD   # the last commit, not the working tree
    python benchmarks/against_commit.py --commit 39a67e1 --only check
    python benchmarks/against_commit.py --quick             # smoke run, under a minute; figures meaningless
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import multiprocessing
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import benchkit as kit
import handshake_throughput
import worker_memory
from tlsbench_apps import WATCHED_MODULES

REPO = kit.BENCH_DIR.parent
TREES = ("old", "new")
PHASES = ("check", "cpu", "memory")
CPU_SERVERS = ("gunicorn-sync", "uvicorn", "gunicorn-gthread", "hypercorn-asyncio")
MEMORY_SERVERS = ("uvicorn:1", "uvicorn:2", "gunicorn-sync:2", "hypercorn-asyncio:2")
"""``server:workers``: tlsreload-uvicorn in one process, then three servers with 2 workers."""
SIGNIFICANT = 0.05
CHECK_FIGURES = {
    "unchanged_us_median": "unchanged check",
    "unchanged_us_min": "unchanged check, best repeat",
    "reload_us_median": "one reload",
}
"""What ``check_cost.measure`` returns that is compared, and its label."""
_IMPORTED = re.compile(r"(/[^\s'\"]*?)/tlsreload_plugins/[^\s'\"]*\.py")
_CHECK_CHILD = """
import json, pathlib, sys, time
import check_cost, tlsreload_plugins
a = json.loads(sys.argv[1])
a["tmp"] = pathlib.Path(a["tmp"])
r = check_cost.measure(**a, clock=time.process_time)
r["imported_from"] = tlsreload_plugins.__file__
print(json.dumps(r))
"""


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


def extract(commit: str, into: Path) -> Path:
    """``commit``'s ``src/`` under ``into`` (``git archive``, no work tree, no install); its path."""
    archive = subprocess.run(["git", "archive", commit, "src"], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return " ".join(f"{x:.2f}" for x in os.getloadavg())


def order_of(r: int) -> tuple[str, str]:
    """Old first in even rounds, new first in odd ones."""
    return TREES if r % 2 == 0 else (TREES[1], TREES[0])


def sign_p(higher: int, lower: int) -> float:
    """Two-sided sign test: the chance of a split at least this uneven between two equal sides (ties dropped)."""
    n = higher + lower
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(higher, lower) + 1)) / float(2**n)
    return min(1.0, 2 * tail)


def compare_ratios(old: Sequence[float], new: Sequence[float]) -> dict[str, Any]:
    """Paired rounds: the median of each side, the median of the per-round ratios new/old, their range and
    quartiles, and the sign test's verdict."""
    ratios = [n / o for o, n in zip(old, new, strict=True) if o]
    higher, lower = sum(r > 1 for r in ratios), sum(r < 1 for r in ratios)
    p = sign_p(higher, lower)
    verdict = "within noise" if p >= SIGNIFICANT else ("new higher" if higher > lower else "new lower")
    return {
        "old": kit.median(old),
        "new": kit.median(new),
        "ratio": kit.median(ratios),
        "ratio_min": min(ratios, default=math.nan),
        "ratio_max": max(ratios, default=math.nan),
        "ratio_q1": kit.percentile(ratios, 25),
        "ratio_q3": kit.percentile(ratios, 75),
        "new_higher_rounds": higher,
        "rounds": len(ratios),
        "p": p,
        "verdict": verdict,
    }


def compare_differences(old: Sequence[float], new: Sequence[float]) -> dict[str, Any]:
    """Paired rounds of a nearly deterministic figure (memory): the per-round difference new - old against the
    larger round-to-round range of either side."""
    diffs = [n - o for o, n in zip(old, new, strict=True)]
    noise = max(max(old) - min(old), max(new) - min(new))
    median_diff = kit.median(diffs)
    same_sign = all(d > 0 for d in diffs) or all(d < 0 for d in diffs)
    beyond = same_sign and abs(median_diff) > noise
    return {
        "old": kit.median(old),
        "new": kit.median(new),
        "ratio": kit.median(new) / kit.median(old),
        "diff": median_diff,
        "diff_min": min(diffs),
        "diff_max": max(diffs),
        "noise": noise,
        "rounds": len(diffs),
        "verdict": ("new higher" if median_diff > 0 else "new lower") if beyond else "within noise",
    }


# --- which copy each server imports -------------------------------------------------------------------


def imported_roots(server: str, workers: int, src: Path, cert: Path, key: Path, tmp: Path) -> set[str]:
    """Start ``server`` on the tree ``src`` with ``PYTHONVERBOSE=1``, make every worker answer, and return the
    directories every process of it imported ``tlsreload_plugins`` from (read from its log)."""
    env = {"PYTHONPATH": str(src), "PYTHONVERBOSE": "1"}
    with kit.running_server(server, True, cert, key, tmp, workers=workers, extra_env=env) as running:
        worker_memory.warm(running, 1, workers=workers)
        text = running.log_path.read_text(errors="replace")
    return set(_IMPORTED.findall(text))


def verify_trees(kinds: Sequence[tuple[str, int]], trees: dict[str, Path], cert: Path, key: Path, tmp: Path) -> None:
    for server, workers in kinds:
        for tree, src in trees.items():
            roots = imported_roots(server, workers, src, cert, key, tmp)
            if roots != {str(src)}:
                raise RuntimeError(f"{server} x{workers} ({tree}) imported tlsreload_plugins from {sorted(roots)}")
        kit.log(f"{server} x{workers}: every process imported tlsreload_plugins from its own tree")


# --- the three measurements ---------------------------------------------------------------------------


def check_phase(args: argparse.Namespace, trees: dict[str, Path], tmp: Path) -> list[dict[str, Any]]:
    results = []
    for key_type in args.key_types:
        raw: dict[str, list[dict[str, Any]]] = {tree: [] for tree in TREES}
        for r in range(args.check_rounds):
            for tree in order_of(r):
                request = {
                    "key_type": key_type,
                    "repeats": args.repeats,
                    "checks": args.checks,
                    "reloads": args.reloads,
                    "reload_seconds": 5.0,
                    "tmp": str(tmp),
                }
                env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(kit.BENCH_DIR), str(trees[tree])))}
                done = subprocess.run(
                    [sys.executable, "-c", _CHECK_CHILD, json.dumps(request)],
                    env=env,
                    cwd=tmp,
                    capture_output=True,
                    text=True,
                    timeout=300,
                )
                if done.returncode != 0:
                    raise RuntimeError(f"check_cost ({tree}) failed:\n{done.stderr[-3000:]}")
                measured = json.loads(done.stdout.splitlines()[-1])
                if not measured["imported_from"].startswith(str(trees[tree]) + os.sep):
                    raise RuntimeError(f"check_cost ({tree}) imported {measured['imported_from']}")
                raw[tree].append(measured)
            kit.log(
                f"check {key_type} round {r + 1}/{args.check_rounds}: unchanged us "
                + ", ".join(f"{t} {raw[t][-1]['unchanged_us_median']:.1f}" for t in TREES)
            )
        for figure in CHECK_FIGURES:
            row = compare_ratios(*([m[figure] for m in raw[tree]] for tree in TREES))
            row.update(key_type=key_type, figure=figure, per_round={t: [m[figure] for m in raw[t]] for t in TREES})
            results.append(row)
    return results


def cpu_phase(
    args: argparse.Namespace, trees: dict[str, Path], cert: Path, key: Path, tmp: Path
) -> list[dict[str, Any]]:
    results = []
    mp = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.clients, mp_context=mp) as pool:
        # Spawn the clients (and let them import) before the first window: under load that took longer than the
        # 1 s warm-up window, and a window the clients miss reads as a side that served nothing.
        ready = time.monotonic() + 1.0
        for spawned in [pool.submit(handshake_throughput._client, (), 0, ready, 0.0) for _ in range(args.clients)]:
            spawned.result(timeout=120)
        for i, server in enumerate(args.cpu_servers):
            kit.log(f"{server}: old and new plugin servers, 1 worker each, paired windows")
            with ExitStack() as stack:
                sides = {
                    tree: stack.enter_context(
                        kit.running_server(server, True, cert, key, tmp, extra_env={"PYTHONPATH": str(trees[tree])})
                    )
                    for tree in order_of(i)
                }
                paired = handshake_throughput.compare_paired(
                    server,
                    {"stock": sides["old"], "plugin": sides["new"]},
                    args.paired_rounds,
                    args.seconds,
                    args.clients,
                    pool,
                    labels=("old", "new"),
                )
            row = compare_ratios(paired["cpu_us"]["stock"], paired["cpu_us"]["plugin"])
            row.update(server=server, per_window=paired["cpu_us"], rates=paired["rates"], failures=paired["failures"])
            results.append(row)
    return results


def parse_kind(spec: str) -> tuple[str, int]:
    server, _, workers = spec.partition(":")
    return server, int(workers or 1)


def memory_round(
    server: str, workers: int, r: int, trees: dict[str, Path], cert: Path, key: Path, tmp: Path, handshakes: int
) -> dict[str, dict[str, Any]]:
    """One round: old and new side by side; per state and tree, each worker's memory and the parent's."""
    env = {"TLSRELOAD_METRICS": "0"}
    measured: dict[str, dict[str, Any]] = {}
    with ExitStack() as stack:
        running = {
            tree: stack.enter_context(
                kit.running_server(
                    server,
                    True,
                    cert,
                    key,
                    tmp,
                    workers=workers,
                    interval=worker_memory.INTERVAL,
                    extra_env={**env, "PYTHONPATH": str(trees[tree])},
                )
            )
            for tree in order_of(r)
        }
        for state, count in (("start", 1), ("after", handshakes)):
            pids = {tree: worker_memory.warm(running[tree], count, workers=workers) for tree in order_of(r)}
            time.sleep(2 * worker_memory.INTERVAL)  # the checker has run in every worker
            measured[state] = {
                tree: {
                    "workers": {pid: worker_memory.memory(pid) for pid in pids[tree]},
                    "parent": worker_memory.memory(running[tree].proc.pid) if workers > 1 else None,
                    "loaded": sorted(set().union(*pids[tree].values())),
                }
                for tree in order_of(r)
            }
    return measured


def worker_pss(measured: dict[str, dict[str, Any]], state: str, tree: str) -> float:
    """The mean PSS of a tree's workers in one round's ``state``, in MiB."""
    return worker_memory.mean([w["pss"] for w in measured[state][tree]["workers"].values()])


def memory_phase(
    args: argparse.Namespace, trees: dict[str, Path], cert: Path, key: Path, tmp: Path
) -> list[dict[str, Any]]:
    results = []
    for spec in args.memory_servers:
        server, workers = parse_kind(spec)
        rounds = []
        for r in range(args.memory_rounds):
            rounds.append(memory_round(server, workers, r, trees, cert, key, tmp, args.handshakes))
            kit.log(
                f"{server} x{workers} round {r + 1}/{args.memory_rounds}: PSS per worker MiB "
                + ", ".join(
                    f"{state} {t} {worker_pss(rounds[-1], state, t):.2f}" for state in ("start", "after") for t in TREES
                )
            )
        for state in ("start", "after"):
            for figure in ("pss", "uss", "rss"):
                per_round = {
                    t: [worker_memory.mean([w[figure] for w in x[state][t]["workers"].values()]) for x in rounds]
                    for t in TREES
                }
                row = compare_differences(per_round["old"], per_round["new"])
                row.update(server=server, workers=workers, state=state, figure=figure, per_round=per_round)
                row["loaded"] = {t: sorted(set().union(*(x[state][t]["loaded"] for x in rounds))) for t in TREES}
                if workers > 1 and figure == "pss":
                    parent = {t: [x[state][t]["parent"]["pss"] for x in rounds] for t in TREES}
                    row["parent"] = compare_differences(parent["old"], parent["new"])
                results.append(row)
    return results


# --- the run and its report ---------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    load_before = uptime()
    kit.log(f"load before: {load_before}")
    base = git("rev-parse", "--short", f"{args.commit}^{{commit}}")
    head = git("rev-parse", "--short", "HEAD")
    dirty = git("status", "--porcelain", "--", str(args.current_src))
    new_commit = git("rev-parse", "--short", f"{args.new_commit}^{{commit}}") if args.new_commit else None
    new = (
        f"{new_commit} (git archive of src/)"
        if new_commit
        else f"{args.current_src} (HEAD {head}{', with uncommitted changes' if dirty else ''})"
    )
    result: dict[str, Any] = {
        "benchmark": "against_commit",
        "settings": {
            "old": f"{base} (git archive of src/)",
            "new": new,
            "check rounds": args.check_rounds,
            "checks per repeat": args.checks,
            "repeats": args.repeats,
            "paired windows": args.paired_rounds,
            "seconds per window": args.seconds,
            "client processes": args.clients,
            "memory rounds": args.memory_rounds,
            "handshakes before the second memory reading": args.handshakes,
            "quick": args.quick,
        },
        "machine": kit.machine(),
        "load_before": load_before,
    }
    with kit.work_dir("against") as tmp:
        (tmp / base).mkdir()
        trees = {"old": extract(base, tmp / base), "new": Path(args.current_src).resolve()}
        if new_commit:
            (tmp / new_commit).mkdir(exist_ok=True)
            trees["new"] = extract(new_commit, tmp / new_commit)
        pair = kit.CA().issue("ecdsa-p256")
        cert, key = tmp / "cert.pem", tmp / "key.pem"
        cert.write_bytes(pair.chain)
        key.write_bytes(pair.key)
        kinds = []
        if "cpu" in args.only:
            kinds += [(server, 1) for server in args.cpu_servers]
        if "memory" in args.only:
            kinds += [parse_kind(spec) for spec in args.memory_servers]
        verify_trees(list(dict.fromkeys(kinds)), trees, cert, key, tmp)
        if "check" in args.only:
            result["check"] = check_phase(args, trees, tmp)
        if "cpu" in args.only:
            result["cpu"] = cpu_phase(args, trees, cert, key, tmp)
        if "memory" in args.only:
            result["memory"] = memory_phase(args, trees, cert, key, tmp)
    result["load_after"] = uptime()
    result["minutes"] = (time.monotonic() - started) / 60
    kit.log(f"load after: {result['load_after']}")
    rows = [*result.get("check", []), *result.get("cpu", []), *result.get("memory", [])]
    result["targets"] = [
        kit.target_row(f"{_what(r)}: new within noise of old, or lower", _measured(r), r["verdict"] != "new higher")
        for r in rows
        if r.get("figure") in (None, "unchanged_us_median", "pss")
    ]
    return result


def _what(r: dict[str, Any]) -> str:
    if "key_type" in r:
        return f"unchanged check, {r['key_type']}"
    if "state" in r:
        return f"PSS per worker, {r['server']} x{r['workers']}, {r['state']}"
    return f"server CPU per handshake, {r['server']}"


def _measured(r: dict[str, Any]) -> str:
    if "diff" in r:
        return f"{r['diff']:+.2f} MiB (rounds {r['diff_min']:+.2f} to {r['diff_max']:+.2f}; noise {r['noise']:.2f})"
    return f"{r['ratio']:.3f}x (new higher in {r['new_higher_rounds']}/{r['rounds']} rounds, p={r['p']:.2g})"


def _loaded_line(rows: list[dict[str, Any]]) -> str:
    """Which of the app's watched modules the workers had loaded, where old and new differ."""
    differ = [
        f"{r['server']} x{r['workers']} {r['state']}: old {', '.join(r['loaded']['old']) or '-'}, "
        f"new {', '.join(r['loaded']['new']) or '-'}"
        for r in rows
        if r["figure"] == "pss" and r["loaded"]["old"] != r["loaded"]["new"]
    ]
    watched = ", ".join(f"`{name}`" for name in WATCHED_MODULES)
    if not differ:
        return f"Watched modules loaded in the workers ({watched}): the same in old and new, for every server.\n"
    return f"Watched modules loaded in the workers ({watched}) differ: " + "; ".join(differ) + ".\n"


def report(result: dict[str, Any]) -> str:
    s = result["settings"]
    out = [
        "### The current tree against another commit\n",
        f"old = {s['old']}; new = {s['new']}. Date {result['machine']['date (UTC)']} UTC; "
        f"{result['minutes']:.1f} minutes.\n",
        f"Load before: `{result['load_before']}`; after: `{result['load_after']}`.\n",
    ]
    if "check" in result:
        rows = [
            (
                r["key_type"],
                CHECK_FIGURES[r["figure"]],
                f"{r['old']:.1f}",
                f"{r['new']:.1f}",
                f"**{r['ratio']:.3f}x**",
                f"{r['ratio_min']:.2f}-{r['ratio_max']:.2f}",
                f"{r['new_higher_rounds']}/{r['rounds']} (p={r['p']:.2g})",
                r["verdict"],
            )
            for r in result["check"]
        ]
        headers = ("key type", "what", "old us", "new us", "new/old", "per-round ratios", "new higher in", "verdict")
        out += [
            f"#### `Reloader.check()` (`check_cost.measure`, {s['check rounds']} alternated rounds)\n",
            f"Each round runs one child process per tree: the median of {s['repeats']} x {s['checks per repeat']} "
            "unchanged checks, and the median of single reloads (up to 5 s), in the child's CPU time "
            "(`time.process_time`). Figures: medians over rounds; new/old: the median of the per-round ratios.\n",
            kit.table(headers, rows) + "\n",
        ]
    if "cpu" in result:
        cpu_rows = [
            (
                r["server"],
                f"{r['old']:.0f}",
                f"{r['new']:.0f}",
                f"**{r['ratio']:.3f}x**",
                f"{r['ratio_q1']:.3f}-{r['ratio_q3']:.3f}",
                f"{r['ratio_min']:.3f}-{r['ratio_max']:.3f}",
                f"{r['new_higher_rounds']}/{r['rounds']} (p={r['p']:.2g})",
                r["verdict"],
            )
            for r in result["cpu"]
        ]
        cpu_headers = ("server", "old us/hs", "new us/hs", "new/old", "quartiles", "range", "new higher in", "verdict")
        out += [
            "#### Server CPU per full handshake, old and new in the same windows\n",
            f"1 worker each; {s['client processes']} client processes alternating their handshakes between the two "
            f"servers; {s['paired windows']} windows of {s['seconds per window']} s after a 1 s warm-up. new/old: "
            "the median over windows of the ratio in the same window.\n",
            kit.table(cpu_headers, cpu_rows) + "\n",
        ]
    if "memory" in result:
        memory_rows = []
        for r in result["memory"]:
            parent = r.get("parent")
            memory_rows.append(
                (
                    f"{r['server']} x{r['workers']}",
                    r["state"],
                    r["figure"].upper(),
                    f"{r['old']:.2f}",
                    f"{r['new']:.2f}",
                    f"{r['ratio']:.3f}x",
                    f"**{r['diff']:+.2f}**" if r["figure"] == "pss" else f"{r['diff']:+.2f}",
                    f"{r['diff_min']:+.2f} to {r['diff_max']:+.2f}",
                    f"{r['noise']:.2f}",
                    r["verdict"],
                    f"{parent['old']:.2f} / {parent['new']:.2f}" if parent else "-",
                )
            )
        memory_headers = (
            "server",
            "when",
            "figure",
            "old MiB",
            "new MiB",
            "new/old",
            "new - old MiB",
            "per round",
            "noise",
            "verdict",
            "parent PSS old / new",
        )
        out += [
            f"#### Memory per worker ({s['memory rounds']} rounds, old and new side by side)\n",
            "`/proc/PID/smaps_rollup`, the mean of a server's workers, the median over rounds (fresh servers each "
            "round, the start order swapped every round). `start`: every worker answered and its checker ran; "
            f"`after`: {s['handshakes before the second memory reading']} more connections (handshake + request). "
            "Noise: the larger round-to-round range of either side.\n",
            kit.table(memory_headers, memory_rows) + "\n",
            _loaded_line(result["memory"]),
        ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commit", default="3b8285d", help="the other commit (its src/ is extracted)")
    parser.add_argument("--current-src", default=str(REPO / "src"), help="the current tree's src directory")
    parser.add_argument(
        "--new-commit", help="measure this commit's src/ (extracted) instead of the current tree, which may be mid-edit"
    )
    parser.add_argument("--only", nargs="+", default=list(PHASES), choices=PHASES)
    parser.add_argument("--key-types", nargs="+", default=["ecdsa-p256"], choices=kit.KEY_TYPES)
    parser.add_argument("--check-rounds", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=5, help="unchanged-check repeats per child")
    parser.add_argument("--checks", type=int, default=2000, help="unchanged checks per repeat")
    parser.add_argument("--reloads", type=int, default=50, help="at most this many reloads per child")
    parser.add_argument(
        "--cpu-servers", nargs="+", default=list(CPU_SERVERS), choices=kit.ALL_SERVERS + kit.HYPERCORN_SERVERS
    )
    parser.add_argument("--paired-rounds", type=int, default=20, help="paired windows per server")
    parser.add_argument("--seconds", type=float, default=3.0, help="per paired window")
    parser.add_argument("--clients", type=int, default=2, help="client processes")
    parser.add_argument("--memory-servers", nargs="+", default=list(MEMORY_SERVERS), help="server:workers")
    parser.add_argument("--memory-rounds", type=int, default=5)
    parser.add_argument("--handshakes", type=int, default=200, help="connections before the second memory reading")
    quick = {
        "check_rounds": 2,
        "repeats": 2,
        "checks": 300,
        "reloads": 10,
        "cpu_servers": ["gunicorn-sync", "uvicorn"],
        "paired_rounds": 2,
        "seconds": 1.0,
        "memory_servers": ["uvicorn:1", "gunicorn-sync:2"],
        "memory_rounds": 1,
        "handshakes": 20,
    }
    return kit.run_script(parser, argv, quick, run, report)


if __name__ == "__main__":
    sys.exit(main())
