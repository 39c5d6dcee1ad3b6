"""The backlog report (PySpark): pending and dead deliveries by app and age bucket and the oldest
pending (as of the newest `deliveries_live/` snapshot), and, for deliveries accepted in the range,
delivery latency percentiles (accepted to delivered) by app and feature, the attempts distribution
and dead letters by last error.

Final deliveries come from `deliveries/`, pruned to the day partitions of the range (they are
partitioned by the day they were accepted); the rest from the snapshot.

    PYTHONPATH=. spark-submit --properties-file platform/spark-defaults.conf analytics/jobs/backlog.py \\
        --lake var/lake --since 2026-11-21 --until 2026-11-22 --out var/lake/_reports/backlog/manual
"""

from __future__ import annotations

import sys
from datetime import datetime

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from analytics.jobs import datasets as ds
from analytics.jobs.common import (
    day_range,
    grouped,
    main,
    percentile_rows,
    read_days,
    read_live,
    result,
    seconds_between,
    snapshot_row,
    total,
    union_all,
)


def build(spark: SparkSession, lake: str, since: datetime, until: datetime) -> DataFrame:
    first, last = day_range(since, until)
    since_at, until_at = F.lit(since), F.lit(until)
    in_range = (F.col("created_at") >= since_at) & (F.col("created_at") < until_at)
    final = read_days(spark, lake, ds.DELIVERIES, first, last).where(in_range)
    live, as_of, run = read_live(spark, lake, ds.DELIVERIES_LIVE)

    frames = [*_latency(final, since_at), _attempts(final, live.where(in_range), since_at)]
    if as_of is not None:
        frames += [*_backlog(live, F.lit(as_of)), _dead_letters(live, F.lit(as_of))]
    frames.append(snapshot_row(spark, ds.DELIVERIES_LIVE, as_of, run))
    return union_all(frames)


def _backlog(live: DataFrame, as_of) -> list[DataFrame]:
    state = F.when(F.col("state") == "dead", F.lit(ds.DEAD)).otherwise(F.lit(ds.PENDING))
    age = seconds_between("created_at", as_of)
    bucket = F.lit(ds.AGE_BUCKETS[-1][0])
    for label, upper in reversed(ds.AGE_BUCKETS[:-1]):
        bucket = F.when(age < upper, F.lit(label)).otherwise(bucket)
    rows = grouped(live.withColumn("group", state).withColumn("age_bucket", bucket),
                   (F.col("app_name"), F.col("group")), (total(), F.col("group")))
    counts = rows.groupBy("g_app", "g_sub", "age_bucket").count()
    pending = grouped(live.where(F.col("state") != "dead"), (F.col("app_name"), total()), (total(), total()))
    oldest = pending.groupBy("g_app", "g_sub").agg(F.min("created_at").alias("oldest"))
    return [result(counts, ds.BACKLOG, ds.SNAPSHOT, as_of, F.col("count"), bucket=F.col("age_bucket")),
            result(oldest, ds.OLDEST_PENDING, ds.SNAPSHOT, as_of, seconds_between("oldest", as_of))]


def _latency(final: DataFrame, since_at) -> list[DataFrame]:
    delivered = final.where(F.col("state") == "delivered") \
        .withColumn("ms", seconds_between("created_at", "delivered_at") * 1000)
    rows = grouped(delivered, (F.col("app_name"), F.col("feature")), (F.col("app_name"), total()), (total(), total()))
    count = rows.groupBy("g_app", "g_sub").count()
    return [percentile_rows(rows, ds.LATENCY, ds.RANGE, since_at, F.col("ms")),
            result(count, ds.DELIVERED, ds.RANGE, since_at, F.col("count"))]


def _attempts(final: DataFrame, live_in_range: DataFrame, since_at) -> DataFrame:
    columns = ["app_name", "state", "attempts"]
    both = final.select(*columns).unionByName(live_in_range.select(*columns))
    rows = grouped(both, (F.col("app_name"), F.col("state")), (total(), F.col("state")))
    counts = rows.groupBy("g_app", "g_sub", "attempts").count()
    return result(counts, ds.ATTEMPTS, ds.RANGE, since_at, F.col("count"), bucket=F.col("attempts"))


def _dead_letters(live: DataFrame, as_of) -> DataFrame:
    dead = live.where(F.col("state") == "dead").withColumn("error", F.substring("last_error", 1, 200))
    counts = grouped(dead, (F.col("app_name"), total()), (total(), total())).groupBy("g_app", "g_sub", "error").count()
    rank = Window.partitionBy("g_app", "g_sub").orderBy(F.desc("count"), "error")
    top = counts.withColumn("rank", F.row_number().over(rank)).where(F.col("rank") <= ds.DEAD_LETTER_ERRORS_PER_APP)
    return result(top, ds.DEAD_LETTERS, ds.SNAPSHOT, as_of, F.col("count"), bucket=F.col("error"))


if __name__ == "__main__":
    sys.exit(main(build, "backlog"))
