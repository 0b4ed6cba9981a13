"""The README, the documentation site and the version matrix agree with the repository they describe."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def fenced_blocks(text: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def test_readme_is_short_and_opens_with_the_two_set_up_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) < 300
    demo, tests = (block.strip() for block in fenced_blocks(text)[:2])
    assert demo.startswith("python3 -m venv .venv && ") and demo.endswith("tlsreload demo")
    assert tests.startswith("python3 -m venv .venv && ") and tests.endswith("-m pytest")
    # CI runs the README's test command verbatim, before anything else it runs.
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [line for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    first_pytest = next(line for line in commands if "-m pytest" in line or "tox" in line)
    assert first_pytest.startswith(tests), first_pytest


@pytest.mark.parametrize("page", [README, *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_relative_links_point_at_files_that_exist(page: Path) -> None:
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        assert path.exists(), f"{page.name} links to {target}, which does not exist"


def test_every_declared_floor_is_pinned_in_the_lowest_constraints() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    tooling = ("test", "docs", "bench")  # the project's own tools, not what a user installs to serve
    runtime = [*project["dependencies"], *(r for name in extras if name not in tooling for r in extras[name])]
    floors: dict[str, Version] = {}
    for line in runtime:
        requirement = Requirement(line)
        if requirement.name in ("tlsreload-plugins", "tlsreload-twisted-endpoint"):  # this repository's own
            continue
        (spec,) = requirement.specifier
        assert spec.operator == ">=", line
        name = requirement.name.replace("_", "-").lower()
        floors[name] = max(floors.get(name, Version(spec.version)), Version(spec.version))
    pins = {}
    for line in (ROOT / "constraints" / "lowest.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.replace("_", "-").lower()] = Version(version)
    for name, floor in floors.items():
        assert name in pins, f"{name}>={floor} is declared but constraints/lowest.txt does not pin it"
        assert pins[name] == floor, f"{name}: declared floor {floor}, but the lowest environment tests {pins[name]}"


def test_the_documentation_site_builds_strictly(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).with_name("mkdocs")
    result = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
