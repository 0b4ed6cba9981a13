"""Directories of key material a process killed with SIGKILL leaves behind (``PushedIdentity``'s in ``/dev/shm``,
``tlsreload watch``'s copies, memory files where there is no memfd) are removed by the next process that makes one in
the same place, and only those: a live owner's, another user's or another pid namespace's are kept
(:mod:`tlsreload_plugins.private_directories`)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trustme

from tlsreload_plugins.private_directories import owner, private_directory, sweep
from tlsreload_plugins.sources import PushedIdentity
from tlstest import wait_until

PUSHER = """
import sys, time
from tlsreload_plugins.sources import PushedIdentity
pushed = PushedIdentity(sys.argv[1])
pushed.push(open(sys.argv[2], "rb").read(), open(sys.argv[3], "rb").read())
print(pushed.directory, flush=True)
time.sleep(120)
"""


def start_pusher(parent: Path, ca: trustme.CA, tmp_path: Path) -> tuple[subprocess.Popen[str], Path]:
    """A process that pushed an identity into ``parent`` and waits; its directory."""
    leaf = ca.issue_cert("localhost")
    cert, key = tmp_path / "leaf.crt", tmp_path / "leaf.key"
    cert.write_bytes(leaf.cert_chain_pems[0].bytes())
    key.write_bytes(leaf.private_key_pem.bytes())
    args = [sys.executable, "-c", PUSHER, str(parent), str(cert), str(key)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    directory = Path(proc.stdout.readline().strip())
    assert (directory / "tls.key").read_bytes() == leaf.private_key_pem.bytes()
    return proc, directory


def test_a_pusher_killed_with_sigkill_leaves_its_keys_to_the_next_which_removes_them(
    tmp_path: Path, ca: trustme.CA, caplog: pytest.LogCaptureFixture
) -> None:
    parent = tmp_path / "shm"
    parent.mkdir()
    alive, kept = start_pusher(parent, ca, tmp_path)
    killed, left = start_pusher(parent, ca, tmp_path)
    try:
        killed.kill()  # SIGKILL: no close(), no atexit
        killed.wait(10)
        assert (left / "tls.key").exists()  # possible at all: its key outlived it
        with caplog.at_level(logging.WARNING, logger="tlsreload_plugins"), PushedIdentity(str(parent)) as pushed:
            assert not left.exists()
            assert (kept / "tls.key").exists()  # its owner runs: kept
            assert sorted(path.name for path in parent.iterdir()) == sorted([kept.name, Path(pushed.directory).name])
        lines = [r.getMessage() for r in caplog.records if "left by processes that died" in r.getMessage()]
        assert len(lines) == 1 and left.name in lines[0] and str(parent) in lines[0], lines
    finally:
        alive.send_signal(signal.SIGTERM)
        alive.wait(10)


def test_only_a_dead_owner_of_this_user_and_pid_namespace_is_swept(tmp_path: Path) -> None:
    namespace, pid, started = (int(part) for part in owner().split("."))
    dead_pid = _a_dead_pid()
    named = {
        "mine": f"tlsreload-pushed-{owner()}-a",
        "dead": f"tlsreload-pushed-{namespace}.{dead_pid}.12345-b",
        "reused": f"tlsreload-watch-{namespace}.{pid}.{started + 1}-c",  # this pid, another process's start time
        "other namespace": f"tlsreload-pushed-{namespace + 1}.{dead_pid}.12345-d",
        "unrelated": f"tlsreload-pushed-{dead_pid}-e",
    }
    for name in named.values():
        (tmp_path / name).mkdir()
    (tmp_path / f"tlsreload-memory-{namespace}.{dead_pid}.1-f").write_text("a file, not a directory")
    if os.geteuid() == 0:  # root can make another user's directory (CI runs as root); elsewhere none can
        named["another user's"] = f"tlsreload-pushed-{namespace}.{dead_pid}.12345-g"
        (tmp_path / named["another user's"]).mkdir()
        os.chown(tmp_path / named["another user's"], 4242, 4242)
    removed = sweep(str(tmp_path))
    assert sorted(Path(path).name for path in removed) == sorted([named["dead"], named["reused"]])
    left = {path.name for path in tmp_path.iterdir()}
    assert {name for case, name in named.items() if case not in ("dead", "reused")} <= left
    made = private_directory("watch", str(tmp_path))
    assert Path(made).name.startswith(f"tlsreload-watch-{owner()}-") and os.stat(made).st_mode & 0o777 == 0o700
    with pytest.raises(ValueError, match="lowercase"):
        private_directory("../x", str(tmp_path))


def _a_dead_pid() -> int:
    """A pid no process has: a child's, once it was reaped."""
    proc = subprocess.Popen([sys.executable, "-c", ""])
    proc.wait(10)
    wait_until(lambda: not Path(f"/proc/{proc.pid}").exists(), 10, what="the child to be gone")
    return proc.pid
