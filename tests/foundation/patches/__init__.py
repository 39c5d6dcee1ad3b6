from __future__ import annotations

from pathlib import Path

UNTESTED = "0.0.1"


def untested_distribution(folder: Path, distribution: str) -> Path:
    """`folder`, holding metadata that, first on the path, makes importlib.metadata report
    `distribution` at UNTESTED, while the package imported is still the real one."""
    dist_info = folder / f"{distribution.replace('-', '_')}-{UNTESTED}.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {UNTESTED}\n")
    return folder
