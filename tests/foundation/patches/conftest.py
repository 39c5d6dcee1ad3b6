from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.foundation.patches import untested_distribution


@pytest.fixture
def untested_metadata(tmp_path) -> Callable[[str], Path]:
    """A folder that, first on the path, makes importlib.metadata report a distribution at 0.0.1."""
    return lambda distribution: untested_distribution(tmp_path / "metadata", distribution)
