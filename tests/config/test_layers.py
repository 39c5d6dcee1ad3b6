"""Layers point down: apps_registry <- presence <- messaging <- analytics, with the transport
helpers in config below them all (CONVENTIONS.md, item 13)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ABOVE = {
    "apps_registry": {"presence", "messaging", "analytics"},
    "presence": {"messaging", "analytics"},
    "messaging": {"analytics"},
    "config/transport": {"apps_registry", "presence", "messaging", "analytics"},
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):  # function-local imports count too: they are the smell
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("layer", sorted(ABOVE))
def test_a_layer_never_imports_one_above_it(layer):
    folder = ROOT / layer if "/" not in layer else ROOT / "platform" / layer.split("/", 1)[0] / layer.split("/", 1)[1]
    offenders = []
    for path in folder.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        wrong = _imports(path) & ABOVE[layer]
        if wrong:
            offenders.append(f"{path.relative_to(ROOT)} imports {sorted(wrong)}")
    assert offenders == []
