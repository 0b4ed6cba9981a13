from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trustme

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run only the pairs of a sparse matrix: a test module that defines ``PAIRS`` (a set of
    ``(server, case)``) runs its tests parametrized by ``server`` and ``case`` for those pairs only
    (test_hostile.py: every case on one server per driver, a few cases on every server)."""
    left_out = [item for item in items if not _in_matrix(item)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if _in_matrix(item)]


def _in_matrix(item: pytest.Item) -> bool:
    pairs = getattr(getattr(item, "module", None), "PAIRS", None)
    params = getattr(getattr(item, "callspec", None), "params", {})
    if pairs is None or "server" not in params or "case" not in params:
        return True
    return (params["server"], params["case"]) in pairs
