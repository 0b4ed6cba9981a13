from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trustme

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()
