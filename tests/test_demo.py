"""`tlsreload demo` end to end: a real server, kubelet-style rotations, and nothing left behind."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

TLSRELOAD = Path(sys.executable).with_name("tlsreload")
ROTATION = re.compile(r"^rotation (\d+)/(\d+): served serial (\S+) -> (\S+) after [\d.]+ s, HTTP 200 ")


def demo(tmp: Path, *args: str) -> subprocess.Popen[str]:
    assert TLSRELOAD.exists(), f"the tlsreload console script is not installed next to {sys.executable}"
    tmp.mkdir(exist_ok=True)
    # The demo's temporary directory goes under TMPDIR: a leftover is then visible in ``tmp``.
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [str(TLSRELOAD), "demo", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def kill_processes_mentioning(text: str) -> None:
    for line in processes_mentioning(text):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(line.split(":", 1)[0]), signal.SIGKILL)


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that mention ``text`` (the demo's servers carry its temp dir in theirs)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(f"{entry.name}: {cmdline}")
    return found


def assert_cleaned_up(tmp: Path) -> None:
    assert list(tmp.iterdir()) == [], "the demo left files behind"
    assert processes_mentioning(str(tmp)) == [], "the demo left a server process behind"


@pytest.mark.parametrize("server", ["uvicorn", "gunicorn"])
def test_demo_rotates_and_cleans_up(server: str, tmp_path: Path) -> None:
    proc = demo(tmp_path / "tmp", "--server", server, "--rotations", "3", "--interval", "0.3")
    out, err = proc.communicate(timeout=240)

    assert proc.returncode == 0, f"{out}\n{err}"
    assert err == ""
    rotations = [m for m in map(ROTATION.match, out.splitlines()) if m]
    assert [(m[1], m[2]) for m in rotations] == [("1", "3"), ("2", "3"), ("3", "3")], out
    # Each rotation starts from the certificate the previous one ended on, and changes it.
    serials = [rotations[0][3]] + [m[4] for m in rotations]
    assert all(m[3] == serials[i] for i, m in enumerate(rotations)), out
    assert len(set(serials)) == 4, out
    assert "(no restart)" in out
    assert f"started {server} (pid " in out
    assert "cleaned up:" in out.splitlines()[-1]
    assert_cleaned_up(tmp_path / "tmp")


def test_ctrl_c_stops_the_server_and_removes_everything(tmp_path: Path) -> None:
    proc = demo(tmp_path / "tmp", "--server", "gunicorn", "--rotations", "1000", "--interval", "0.3")
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:  # ends at EOF if the demo fails (it gives up after its --timeout)
            seen.append(line)
            if line.startswith("rotation 1/1000:"):
                break
        assert any(line.startswith("rotation 1/1000:") for line in seen), "".join(seen)
        assert len(processes_mentioning(str(tmp_path / "tmp"))) == 2  # gunicorn's arbiter and its worker
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
            kill_processes_mentioning(str(tmp_path / "tmp"))  # the demo failed to stop its server: do not leak it
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert_cleaned_up(tmp_path / "tmp")


def test_a_failure_exits_1_with_the_reason_and_cleans_up(tmp_path: Path) -> None:
    # No server starts within a millisecond: the demo must give up, say why, and still clean up.
    proc = demo(tmp_path / "tmp", "--server", "gunicorn", "--timeout", "0.001")
    out, err = proc.communicate(timeout=120)

    assert proc.returncode == 1, f"{out}\n{err}"
    assert "tlsreload demo: FAILED: gave up after 0.001 s" in err
    assert "Traceback" not in err
    assert_cleaned_up(tmp_path / "tmp")
