"""What validating in a child process costs (issue 25, part 2): the time and CPU of one validation in a child
(start it, import ``cryptography``, judge one pair, reap it) and of a batch, beside validation in the process
itself; and the time ``tlsreload-uvicorn`` (one process) takes from its start to its first completed handshake,
stock ``uvicorn`` beside it, and the same command run from another tree of the package (``--src``: the package
before the change, say, from ``git archive``). "plugin" is the package this Python imports (``PYTHONPATH`` first).

* child: ``validate_apart.validate_many`` forced into a child (``TLSRELOAD_VALIDATE=process``) in this process;
  wall time, and CPU as the child's (``RUSAGE_CHILDREN``) plus this process's own (spawning, feeding, reading);
* in process: a fresh Python that has imported the package validates the pair itself (importing
  ``cryptography`` on the way): its first validation, then the median of the next ones;
* first handshake: from ``Popen`` to the first handshake that completes (polled every 5 ms), each command
  started in turn, ``--runs`` times.

    python benchmarks/validation_cost.py
    git archive OLD src | tar -x -C /tmp/old && python benchmarks/validation_cost.py --src old=/tmp/old/src
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import benchkit as kit

IN_PROCESS = """
import sys, time
from tlsreload_plugins.files import Snapshot, TLSFiles
from tlsreload_plugins.identity import validate
cert, key = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read()
snapshot = Snapshot(TLSFiles(sys.argv[1], sys.argv[2]), cert, key, None)
times = []
for _ in range(11):
    wall, cpu = time.monotonic(), time.process_time()
    validate(snapshot)
    times.append((time.monotonic() - wall, time.process_time() - cpu))
first, rest = times[0], sorted(times[1:])
print(first[0], first[1], rest[5][0], rest[5][1])
"""


def cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def child_cost(cert: Path, key: Path, count: int, runs: int) -> dict[str, float]:
    """Median wall time and CPU (child's, this process's) of validating ``count`` copies of the pair in one child."""
    os.environ["TLSRELOAD_VALIDATE"] = "process"
    from tlsreload_plugins.files import Snapshot, TLSFiles
    from tlsreload_plugins.validation import apart as validate_apart

    chain, secret = cert.read_bytes(), key.read_bytes()
    items = [(Snapshot(TLSFiles(f"/{i}/tls.crt", f"/{i}/tls.key"), chain, secret, None), None) for i in range(count)]
    walls, child_cpu, own_cpu = [], [], []
    for _ in range(runs):
        before_children, before_self = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(0)
        wall = time.monotonic()
        verdicts = validate_apart.validate_many(items)  # type: ignore[arg-type]
        walls.append(time.monotonic() - wall)
        after_children, after_self = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(0)
        child_cpu.append(
            after_children.ru_utime + after_children.ru_stime - before_children.ru_utime - before_children.ru_stime
        )
        own_cpu.append(after_self.ru_utime + after_self.ru_stime - before_self.ru_utime - before_self.ru_stime)
        assert all(not isinstance(v, Exception) for v in verdicts), verdicts[:1]
    return {"wall": kit.median(walls), "child_cpu": kit.median(child_cpu), "own_cpu": kit.median(own_cpu)}


def in_process_cost(cert: Path, key: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", IN_PROCESS, str(cert), str(key)], capture_output=True, text=True, check=True
    ).stdout
    first_wall, first_cpu, wall, cpu = map(float, out.split())
    return {"first_wall": first_wall, "first_cpu": first_cpu, "wall": wall, "cpu": cpu}


def first_handshake(label: str, src: str | None, cert: Path, key: Path, tmp: Path) -> float:
    """Seconds from the start of the command to its first completed handshake."""
    port = kit.free_port()
    command = kit.server_command("uvicorn", label != "stock", cert, key, port, 1)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("TLSRELOAD_VALIDATE", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, str(kit.BENCH_DIR), env.get("PYTHONPATH", "")) if p)
    ctx = kit.client_context()
    with open(tmp / f"{label}-{port}.log", "wb") as log:
        start = time.monotonic()
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{label} exited with {proc.returncode}: see {log.name}")
            try:
                kit.handshake_only(port, ctx, timeout=2)
                return time.monotonic() - start
            except OSError:
                time.sleep(0.005)
            if time.monotonic() - start > 60:
                raise RuntimeError(f"{label} not answering after 60 s")
    finally:
        kit.stop_process_group(proc)


def run(args: argparse.Namespace) -> dict[str, Any]:
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    sources = {"stock": None, "plugin": None, **dict(s.split("=", 1) for s in args.src)}
    with kit.work_dir("validation-cost") as tmp:
        volume = kit.KubeletDir(tmp / "secret")
        volume.install(kit.CA().issue(args.key_type))
        cert, key = volume.cert_path, volume.key_path
        one = child_cost(cert, key, 1, args.runs)
        batch = child_cost(cert, key, args.batch, max(1, args.runs // 3))
        inline = in_process_cost(cert, key)
        handshakes: dict[str, list[float]] = {label: [] for label in sources}
        for _ in range(args.runs):
            for label, src in sources.items():
                handshakes[label].append(first_handshake(label, src, cert, key, tmp))
        kit.log(f"first handshake: {handshakes}")
    return {
        "benchmark": "validation_cost",
        "settings": {"runs": args.runs, "batch": args.batch, "key type": args.key_type, "load average before": load},
        "one_in_child": one,
        "batch_in_child": batch,
        "in_process": inline,
        "first_handshake": {label: sorted(times) for label, times in handshakes.items()},
        "targets": [],
    }


def report(result: dict[str, Any]) -> str:
    s, one, batch, inline = result["settings"], result["one_in_child"], result["batch_in_child"], result["in_process"]
    ms = 1000.0
    cost = kit.table(
        ("validation", "wall ms", "CPU ms"),
        [
            (
                "one pair in a child (start, import cryptography, judge, reap)",
                f"{one['wall'] * ms:.0f}",
                f"{one['child_cpu'] * ms:.0f} child + {one['own_cpu'] * ms:.1f} server",
            ),
            (
                f"{s['batch']} pairs in one child",
                f"{batch['wall'] * ms:.0f}",
                f"{batch['child_cpu'] * ms:.0f} child + {batch['own_cpu'] * ms:.1f} server",
            ),
            (
                "in the process, first (imports cryptography)",
                f"{inline['first_wall'] * ms:.0f}",
                f"{inline['first_cpu'] * ms:.0f}",
            ),
            ("in the process, next ones", f"{inline['wall'] * ms:.1f}", f"{inline['cpu'] * ms:.1f}"),
        ],
    )
    rows = []
    for label, times in result["first_handshake"].items():
        rows.append((label, f"{kit.median(times) * ms:.0f}", f"{times[0] * ms:.0f} to {times[-1] * ms:.0f}"))
    ready = kit.table(("command (one process)", "start to first handshake, median ms", "range ms"), rows)
    return (
        f"### Validation in a child process\n\n{s['key type']} pair; median of {s['runs']} runs; load average "
        f"before the run {s['load average before']}.\n\n{cost}\n\n{ready}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--batch", type=int, default=1000, help="pairs validated by one child")
    parser.add_argument("--key-type", default="ecdsa-p256", choices=kit.KEY_TYPES)
    parser.add_argument(
        "--src", action="append", default=[], metavar="LABEL=DIR", help="also run tlsreload-uvicorn from this tree"
    )
    return kit.run_script(parser, argv, {"runs": 3, "batch": 100}, run, report)


if __name__ == "__main__":
    sys.exit(main())
