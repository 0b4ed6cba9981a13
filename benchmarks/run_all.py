"""Run every benchmark in sequence and print one Markdown report for docs/benchmarks.md.

Each benchmark runs as its own process (so the memory figures are not those of this runner);
progress goes to stderr, the report to stdout (and to ``--out``). A benchmark that fails is
reported as such and the others still run. The full run takes about 50 minutes on 2 cores;
``--quick`` is a smoke run of under 3 minutes whose figures mean nothing.

    python benchmarks/run_all.py > report.md
    python benchmarks/run_all.py --quick
    python benchmarks/run_all.py --only check_cost reload_memory
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import benchkit as kit

# In the order they run: the in-process ones first (quick), then the server ones.
BENCHMARKS: dict[str, list[str]] = {
    "check_cost": [],
    "reload_memory": [],
    "callback_cost": [],
    "handshake_throughput": [],
    "rotation_latency": [],
    "rotation_handshakes": ["--stock"],
    "hostile_stall": [],
    "hypercorn_throughput": [],
    "sni_handshakes": [],
    "resumption": [],
    "worker_memory": [],
}


def _stop(proc: subprocess.Popen[str], already: int) -> None:
    """Wait for a benchmark that got ``already`` to clean up; SIGTERM, then SIGKILL, if it does not."""
    for sig, wait in ((None if already == signal.SIGINT else signal.SIGTERM, 60), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            return
        if sig is not None:
            proc.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait)


def run_one(name: str, extra: list[str], quick: bool, tmp: Path) -> dict[str, Any]:
    """Run one benchmark script; its JSON result, or ``{"error": ...}``."""
    out = tmp / f"{name}.json"
    cmd = [sys.executable, str(kit.BENCH_DIR / f"{name}.py"), "--json", str(out), *extra]
    if quick:
        cmd.append("--quick")
    kit.log(f"=== {name}: {' '.join(cmd[1:])}")
    start = time.monotonic()
    # Its own process group would hide Ctrl-C from it: keep it in ours, so Ctrl-C reaches it and
    # it stops its servers; SIGTERM to this runner is passed on below.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        stdout, _ = proc.communicate()
    except KeyboardInterrupt:
        # Ctrl-C reached the benchmark too: let it stop its servers.
        _stop(proc, signal.SIGINT)
        raise
    except BaseException:
        _stop(proc, signal.SIGTERM)
        raise
    elapsed = time.monotonic() - start
    kit.log(f"=== {name}: exit {proc.returncode} after {elapsed:.0f}s")
    if proc.returncode != 0 or not out.exists():
        return {"benchmark": name, "error": f"exit status {proc.returncode}", "output": stdout[-2000:]}
    result: dict[str, Any] = json.loads(out.read_text())
    result["seconds"] = elapsed
    return result


def draw_figure(tmp: Path, out: str) -> None:
    """figure.py on the JSON results of this run that it draws (those that ran)."""
    inputs = {
        "--throughput": "handshake_throughput",
        "--hypercorn": "hypercorn_throughput",
        "--resumption": "resumption",
    }
    cmd = [sys.executable, str(kit.BENCH_DIR / "figure.py"), "--out", out]
    for option, name in inputs.items():
        if (tmp / f"{name}.json").exists():
            cmd += [option, str(tmp / f"{name}.json")]
    if len(cmd) > 4:
        subprocess.run(cmd, check=False)


def markdown(machine: dict[str, str], results: list[dict[str, Any]], quick: bool, total: float) -> str:
    parts = ["## Results", ""]
    if quick:
        parts += ["**Smoke run (`--quick`): durations too short for the figures to mean anything.**", ""]
    parts += ["### Machine and versions", "", kit.table(("", ""), list(machine.items())), ""]
    targets: list[dict[str, Any]] = []
    for result in results:
        name = result["benchmark"]
        if "error" in result:
            parts += [f"### {name}", "", f"FAILED to run ({result['error']}):", "", "```", result["output"], "```", ""]
            targets.append(kit.target_row(f"{name} ran", result["error"], False))
            continue
        module = importlib.import_module(name)
        parts += [module.report(result), "", f"({name}: {result['seconds']:.0f} s)", ""]
        targets += result["targets"]
    passed = sum(t["pass"] for t in targets)
    parts += [
        "### Targets",
        "",
        kit.targets_table(targets),
        "",
        f"{passed} of {len(targets)} targets met; total run {total / 60:.1f} min.",
    ]
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke run of every benchmark (under 3 minutes)")
    parser.add_argument("--only", nargs="+", choices=list(BENCHMARKS), help="run only these benchmarks")
    parser.add_argument("--out", help="also write the Markdown report to this file")
    parser.add_argument(
        "--figure", help="also draw the figure (figure.py) from this run's results into this PNG (docs/benchmarks.png)"
    )
    args = parser.parse_args(argv)
    kit.sigterm_raises()
    machine = kit.machine()
    ticks = kit.cpu_ticks()
    start = time.monotonic()
    results = []
    with kit.work_dir("runall") as tmp:
        for name, extra in BENCHMARKS.items():
            if args.only and name not in args.only:
                continue
            results.append(run_one(name, extra, args.quick, tmp))
        if args.figure:
            draw_figure(tmp, args.figure)
    machine["CPU stolen by the host during the run (/proc/stat)"] = kit.steal_share(ticks, kit.cpu_ticks())
    report = markdown(machine, results, args.quick, time.monotonic() - start)
    print(report)
    if args.out:
        Path(args.out).write_text(report)
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
