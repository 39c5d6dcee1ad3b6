"""The web node's garbage collector: start-up objects frozen, young collections rarer (foundation.gc_tuning)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PLATFORM = Path(__file__).resolve().parents[2] / "platform"

PROBE = """
import gc, json
from foundation import gc_tuning
before = gc.get_freeze_count()
gc_tuning.tune()
cycle = []; cycle.append(cycle); del cycle  # garbage a collection still finds
print(json.dumps({"frozen_before": before, "frozen": gc.get_freeze_count(),
                  "threshold": gc.get_threshold(), "enabled": gc.isenabled(), "found": gc.collect()}))
"""


def _tuned_process() -> dict:
    # In a process of its own: the test runner's collector is left as it is.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PLATFORM), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, env=env).stdout
    return json.loads(out)


def test_web_node_collector_leaves_startup_objects_alone_and_runs_young_collections_less_often():
    tuned = _tuned_process()
    assert tuned["frozen_before"] == 0
    assert tuned["frozen"] > 1000  # the interpreter's and the modules' objects, never traversed again
    assert tuned["threshold"] == [20_000, 20, 10]


def test_web_node_collector_still_frees_garbage_cycles():
    tuned = _tuned_process()
    assert tuned["enabled"]
    assert tuned["found"] >= 1
