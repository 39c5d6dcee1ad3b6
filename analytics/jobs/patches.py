"""PySpark's internals, reached into on the version they were tested with.

1. **The lake's Hadoop file system** (`hadoop_path`, `jvm`): PySpark has no Python API to list a
   folder or read a small file on the lake's file system (local, HDFS, S3), so the jobs ask Spark's
   own JVM through the SparkContext's private `_jvm` and `_jsc` (py4j): to skip a dataset not yet
   exported, list the live snapshots and read their markers.

Like foundation.patches (foundation.patches.versions), this refuses to run on a PySpark other than
TESTED_VERSIONS, naming the version found and the one expected, unless ALLOW_UNTESTED_VERSIONS is
on. It lives here, not in foundation.patches, because spark-submit runs the jobs with only PySpark
and this package on the driver's path: no Django, no foundation. So the check is this module's own,
and it reads ALLOW_UNTESTED_VERSIONS from the environment, the variable the setting of the same name
reads.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
from typing import Any

from pyspark.sql import SparkSession

# After an upgrade, check the patch above against the new version, then change this
# (tests/analytics/test_jobs_patches.py holds it to requirements.lock).
TESTED_VERSIONS = {"pyspark": "4.3.0"}
ALLOW_UNTESTED = "ALLOW_UNTESTED_VERSIONS"

log = logging.getLogger(__name__)


def untested_versions() -> list[tuple[str, str, str]]:
    """(distribution, version found, version expected) for each one not at its tested version."""
    found = []
    for name, expected in TESTED_VERSIONS.items():
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            version = "not installed"
        if version != expected:
            found.append((name, version, expected))
    return found


def require_tested() -> None:
    """Refuse (RuntimeError) to run on versions other than TESTED_VERSIONS, unless ALLOW_UNTESTED_VERSIONS is on."""
    mismatches = untested_versions()
    if not mismatches:
        return
    found = "; ".join(f"{name} {version} (expected {expected})" for name, version, expected in mismatches)
    if os.environ.get(ALLOW_UNTESTED, "").lower() in {"1", "true", "yes", "on"}:
        log.warning("running on untested versions, as %s allows: %s; %s's patches may not work on them",
                    ALLOW_UNTESTED, found, __name__)
        return
    raise RuntimeError(
        f"untested versions: {found}. {__name__} reaches into their internals; on other versions the reports "
        "can fail or read the lake wrong. Install the locked versions (make install, or pip install "
        f"--require-hashes -r requirements.lock), or, once {__name__} is checked against these versions, set "
        f"{ALLOW_UNTESTED}=true to start anyway.")


require_tested()


# 1.
def jvm(spark: SparkSession) -> Any:
    """The driver's JVM (py4j), to reach Hadoop's classes."""
    return spark.sparkContext._jvm


def hadoop_path(spark: SparkSession, path: str) -> tuple[Any, Any]:
    """`path` as a Hadoop Path, and the file system it lives on (configured as Spark's)."""
    jpath = jvm(spark).org.apache.hadoop.fs.Path(path)
    return jpath, jpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
