"""The in-process Spark session (SPARK_MASTER, defaults from platform/spark-defaults.conf) and a
progress feed from Spark's status tracker."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings
from pyspark.sql import SparkSession

from analytics.jobs.common import configure


def spark_defaults(path: Path | None = None) -> dict[str, str]:
    """`key value` lines of a spark-defaults.conf file (comments and blank lines skipped)."""
    conf = {}
    for line in (path or settings.SPARK_DEFAULTS_FILE).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition(" ")
            conf[key] = value.strip()
    return conf


def spark_session(*, master: str | None = None, conf: dict[str, str] | None = None) -> SparkSession:
    """The process's Spark session, started on first use (a JVM per process, reused after)."""
    builder = SparkSession.builder.master(master or settings.SPARK_MASTER)
    for key, value in {**spark_defaults(), **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    configure(spark)
    return spark


@contextmanager
def spark_progress(spark: SparkSession, report: Callable[[int, int], None] | None, every: float = 0.5
                   ) -> Iterator[None]:
    """Call report(tasks done, tasks known) while the block runs Spark jobs."""
    if report is None:
        yield
        return
    tracker = spark.sparkContext.statusTracker()
    stop = threading.Event()
    seen: dict[int, tuple[int, int]] = {}

    def poll() -> None:
        while not stop.wait(every):
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    seen[stage_id] = (info.numCompletedTasks, info.numTasks)
            report(sum(d for d, _ in seen.values()), sum(t for _, t in seen.values()))

    thread = threading.Thread(target=poll, name="spark-progress", daemon=True)
    thread.start()
    finished = False
    try:
        yield
        finished = True
    finally:
        stop.set()
        thread.join()
        if finished:  # stages that ended between two polls
            seen.update({stage_id: (total, total) for stage_id, (_, total) in seen.items()})
        report(sum(d for d, _ in seen.values()), sum(t for _, t in seen.values()))
