"""Which SNI identities a tick looks at (tlsreload_plugins.sni.tracker): the plain decisions, then a
ChangeTracker over real directories written the way kubelet, certbot and a script in place write them.
No threads, no servers: each test ticks the tracker itself."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import trustme

from tlsreload_plugins.sni.inotify import open_events
from tlsreload_plugins.sni.tracker import EVERYTHING, ChangeTracker, dirty_under, per_tick, sweep_slice
from tlstest import CertbotLayout, KubeletLayout, issue

needs_inotify = pytest.mark.skipif(open_events() is None, reason="no inotify on this system")
NEVER = 1e12
"""A sweep period so long that a tick sweeps one identity: what a tick checks is then what changed (and one)."""


def test_a_tick_sweeps_enough_that_every_identity_is_read_within_the_period() -> None:
    assert per_tick(10_000, 1.0) == 167
    assert per_tick(10_000, 1.0, period=60.0) * 60 >= 10_000
    assert per_tick(10, 120.0) == 10  # an interval longer than the period: everything, every tick
    assert per_tick(0, 1.0) == 0
    assert per_tick(3, 1.0, period=NEVER) == 1


def test_the_sweep_goes_round_and_says_when_a_round_is_complete() -> None:
    paths = ["a", "b", "c", "d", "e"]
    taken, cursor, whole = sweep_slice(paths, 0, 2)
    assert (taken, cursor, whole) == (["a", "b"], 2, False)
    taken, cursor, whole = sweep_slice(paths, 4, 2)
    assert (taken, cursor, whole) == (["e", "a"], 1, True)
    assert sweep_slice(paths, 3, 9) == (["d", "e", "a", "b", "c"], 3, True)
    assert sweep_slice([], 0, 3) == ([], 0, True)
    seen: set[str] = set()
    cursor = 0
    for _ in range(3):
        taken, cursor, _ = sweep_slice(paths, cursor, per_tick(len(paths), 1.0, period=3.0))
        seen.update(taken)
    assert seen == set(paths)


def test_an_event_marks_only_the_identities_under_its_directory() -> None:
    owners = {"/s/a": {"/s/a"}, "/s/a/..2026": {"/s/a"}, "/s/b": {"/s/b"}, "/ca": {EVERYTHING}}
    assert dirty_under(["/s/a/..2026"], owners) == {"/s/a"}
    assert dirty_under(["/s/b", "/elsewhere"], owners) == {"/s/b"}
    assert dirty_under(["/ca"], owners) == {EVERYTHING}
    assert dirty_under([], owners) == set()


def _tracker(directory: Path) -> ChangeTracker:
    tracker = ChangeTracker([str(directory)], 1.0, period=NEVER)
    first = tracker.tick()
    assert first.everything
    return tracker


def _changed(tracker: ChangeTracker, name: str) -> bool:
    """Whether the next tick checks ``name`` (one tick may also sweep one more identity)."""
    return name in tracker.tick().check


@needs_inotify
def test_a_kubelet_swap_marks_that_identity_only(tmp_path: Path, ca: trustme.CA) -> None:
    layouts = {name: KubeletLayout(tmp_path / "sni" / name) for name in ("a", "b", "c", "d")}
    for name, layout in layouts.items():
        layout.install(issue(ca, f"{name}.test"))
    tracker = _tracker(tmp_path / "sni")
    assert len(tracker.tick().check) == 1  # nothing changed: only the sweep's one
    layouts["c"].install(issue(ca, "c.test"))
    check = tracker.tick().check
    assert "c" in check and len(check) <= 2
    assert len(tracker.tick().check) == 1


@needs_inotify
def test_a_certbot_relink_marks_its_lineage(tmp_path: Path, ca: trustme.CA) -> None:
    lineages = {name: CertbotLayout(tmp_path / "le", name) for name in ("a.test", "b.test", "c.test")}
    for name, lineage in lineages.items():
        lineage.install(issue(ca, name))
    (tmp_path / "le" / "live" / "README").write_text("not an identity\n")
    tracker = _tracker(tmp_path / "le" / "live")
    assert set(tracker.tick().found) == set(lineages)
    lineages["b.test"].install(issue(ca, "b.test"))
    assert _changed(tracker, "b.test")


@needs_inotify
def test_a_rewrite_in_place_keeping_size_and_mtime_is_seen(tmp_path: Path, ca: trustme.CA) -> None:
    layouts = {name: KubeletLayout(tmp_path / "sni" / name) for name in ("a", "b", "c")}
    for name, layout in layouts.items():
        layout.install(issue(ca, f"{name}.test"))
    tracker = _tracker(tmp_path / "sni")
    target = os.path.realpath(layouts["b"].key_path)  # in ..TIMESTAMP/, where the link resolves
    before = os.stat(target)
    data = bytearray(Path(target).read_bytes())
    data[40] ^= 1  # same size
    with open(target, "r+b") as f:
        f.write(data)
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))  # same mtime
    assert os.stat(target).st_size == before.st_size and os.stat(target).st_mtime == before.st_mtime
    assert _changed(tracker, "b")


@needs_inotify
def test_directories_added_and_removed_are_found(tmp_path: Path, ca: trustme.CA) -> None:
    sni = tmp_path / "sni"
    KubeletLayout(sni / "a").install(issue(ca, "a.test"))
    tracker = _tracker(sni)
    (sni / "new").mkdir()  # empty at first: not an identity yet, but watched
    assert "new" not in tracker.tick().found
    KubeletLayout(sni / "new").install(issue(ca, "new.test"))
    tick = tracker.tick()
    assert "new" in tick.found and "new" in tick.check
    shutil.rmtree(sni / "a")
    assert set(tracker.tick().found) == {"new"}


def test_without_watches_every_identity_is_checked_every_tick(tmp_path: Path, ca: trustme.CA) -> None:
    for name in ("a", "b", "c"):
        KubeletLayout(tmp_path / "sni" / name).install(issue(ca, f"{name}.test"))
    tracker = ChangeTracker([str(tmp_path / "sni")], 1.0, period=NEVER, _watching=False)
    for _ in range(2):
        tick = tracker.tick()
        assert tick.everything and tick.check == {"a", "b", "c"}


@needs_inotify
def test_every_identity_is_swept_within_the_period(tmp_path: Path, ca: trustme.CA) -> None:
    names = [f"s{n}" for n in range(7)]
    for name in names:
        KubeletLayout(tmp_path / "sni" / name).install(issue(ca, f"{name}.test"))
    tracker = ChangeTracker([str(tmp_path / "sni")], 1.0, period=3.0)
    tracker.tick()
    swept: set[str] = set()
    for _ in range(3):  # period / interval ticks
        swept |= tracker.tick().check
    assert swept == set(names)
