"""The presence report (PySpark): concurrency per minute with its peak, unique users per day,
session length percentiles, connects and disconnects per hour, and the users with the most
connected time, per app and domain and for all apps.

Sessions come from the lake: closed ones from `sessions/` (only the day partitions from the
range's first day on: a session that overlaps the range ended on or after it) and the rest from the
newest `sessions_live/` snapshot. Connects and disconnects per hour come from `presence_events/`,
pruned to the range's days.

    PYTHONPATH=. spark-submit --properties-file platform/spark-defaults.conf analytics/jobs/presence.py \
        --lake var/lake --since 2026-11-21 --until 2026-11-22 --out var/lake/_reports/presence/manual
    python manage.py analytics_report presence --since 2026-11-21 --until 2026-11-22 \
        --load var/lake/_reports/presence/manual

(PYTHONPATH makes the `analytics` package importable on the driver; the executors run only
Spark's own functions, no Python, so they need nothing. In cluster deploy mode, ship the package
with --py-files.)
"""

from __future__ import annotations

import math
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

_SESSION_COLUMNS = ["app_name", "user_id", "domain", "connected_at", "disconnected_at"]


def build(spark: SparkSession, lake: str, since: datetime, until: datetime) -> DataFrame:
    first, last = day_range(since, until)
    since_at, until_at = F.lit(since), F.lit(until)

    closed = read_days(spark, lake, ds.SESSIONS, first).select(
        *_SESSION_COLUMNS, F.col("disconnected_at").alias("ended_at"))
    live, as_of, run = read_live(spark, lake, ds.SESSIONS_LIVE)
    # An open session counts as connected up to the snapshot's time (no later than the range's end).
    live_end = F.coalesce(F.col("disconnected_at"), F.lit(as_of) if as_of else until_at)
    sessions = closed.unionByName(live.select(*_SESSION_COLUMNS, live_end.alias("ended_at"))) \
        .where((F.col("connected_at") < until_at) & (F.col("ended_at") > since_at))
    # Each session cut to the range: [start, end), never empty.
    clipped = sessions.select(
        "app_name", "user_id", "domain",
        F.greatest("connected_at", since_at).alias("start"), F.least("ended_at", until_at).alias("end"),
    ).where(F.col("end") > F.col("start")).cache()
    by_place = grouped(clipped, (F.col("app_name"), F.col("domain")), (total(), total()))

    return union_all([
        *_concurrency(spark, by_place, since, until),
        *_unique_users(by_place, since_at),
        *_session_lengths(sessions, since_at, until_at),
        _connects_per_hour(spark, lake, since_at, until_at, first, last),
        _top_users(clipped, since_at),
        snapshot_row(spark, ds.SESSIONS_LIVE, as_of, run),
    ])


def _concurrency(spark: SparkSession, by_place: DataFrame, since: datetime, until: datetime) -> list[DataFrame]:
    """The most connections open at once in each minute, exactly, without ordering a whole group's
    events in one task. Changes are summed per instant first (so only real states are seen); within
    a minute, their running sum gives the highest rise over the minute's starting level; that level
    is the sum of the earlier minutes' net changes, a window over per-minute aggregates only (one
    row per minute and group). The starting level itself counts only when no change falls on the
    minute's first instant (sessions are [start, end): one that ends at 10:20:00 is not open at 10:20)."""
    until_at = F.lit(until)
    changes = by_place.select(
        "g_app", "g_sub",
        F.explode(F.array(F.struct(F.col("start").alias("ts"), F.lit(1).alias("delta")),
                          F.struct(F.col("end").alias("ts"), F.lit(-1).alias("delta")))).alias("e"),
    ).select("g_app", "g_sub", "e.ts", "e.delta").where(F.col("ts") < until_at) \
        .groupBy("g_app", "g_sub", "ts").agg(F.sum("delta").alias("delta")) \
        .withColumn("minute", F.date_trunc("minute", "ts"))
    in_minute = Window.partitionBy("g_app", "g_sub", "minute").orderBy("ts") \
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    per_minute = changes.withColumn("running", F.sum("delta").over(in_minute)) \
        .groupBy("g_app", "g_sub", "minute").agg(F.sum("delta").alias("net"), F.max("running").alias("rise"),
                                                  F.min("ts").alias("first_change"))

    start = int(since.timestamp()) // 60 * 60
    minutes = math.ceil((until.timestamp() - start) / 60)
    grid = spark.range(minutes).select(F.timestamp_seconds(F.lit(start) + F.col("id") * 60).alias("minute"))
    before = Window.partitionBy("g_app", "g_sub").orderBy("minute").rowsBetween(Window.unboundedPreceding, -1)
    level = by_place.select("g_app", "g_sub").distinct().crossJoin(grid) \
        .join(per_minute, ["g_app", "g_sub", "minute"], "left") \
        .withColumn("level", F.coalesce(F.sum("net").over(before), F.lit(0)))
    rise = F.when(F.col("rise").isNull(), F.lit(0)) \
        .when(F.col("first_change") == F.col("minute"), F.col("rise")) \
        .otherwise(F.greatest("rise", F.lit(0)))
    most = level.withColumn("most", F.col("level") + rise)
    peak = most.groupBy("g_app", "g_sub").agg(F.max("most").alias("peak"))
    return [result(most, ds.CONCURRENT, ds.MINUTE, F.col("minute"), F.col("most")),
            result(peak, ds.PEAK_CONCURRENT, ds.RANGE, F.lit(since), F.col("peak"))]


def _unique_users(by_place: DataFrame, since_at) -> list[DataFrame]:
    user = F.concat_ws("\u0000", "app_name", "user_id")
    days = by_place.withColumn("day", F.explode(F.sequence(
        F.to_date("start"), F.to_date(F.col("end") - F.expr("INTERVAL 1 MICROSECOND")))))
    per_day = days.groupBy("g_app", "g_sub", "day").agg(F.countDistinct(user).alias("users"))
    per_range = by_place.groupBy("g_app", "g_sub").agg(F.countDistinct(user).alias("users"))
    return [result(per_day, ds.UNIQUE_USERS, ds.DAY_GRAIN, F.col("day"), F.col("users")),
            result(per_range, ds.UNIQUE_USERS, ds.RANGE, since_at, F.col("users"))]


def _session_lengths(sessions: DataFrame, since_at, until_at) -> list[DataFrame]:
    ended = sessions.where(F.col("disconnected_at").isNotNull() & (F.col("disconnected_at") >= since_at)
                           & (F.col("disconnected_at") < until_at))
    ended = grouped(ended.withColumn("seconds", seconds_between("connected_at", "disconnected_at")),
                    (F.col("app_name"), F.col("domain")), (total(), total()))
    count = ended.groupBy("g_app", "g_sub").count()
    return [percentile_rows(ended, ds.SESSION_LENGTH, ds.RANGE, since_at, F.col("seconds")),
            result(count, ds.SESSIONS_ENDED, ds.RANGE, since_at, F.col("count"))]


def _connects_per_hour(spark: SparkSession, lake: str, since_at, until_at, first, last) -> DataFrame:
    events = read_days(spark, lake, ds.PRESENCE_EVENTS, first, last) \
        .where((F.col("at") >= since_at) & (F.col("at") < until_at))
    per_hour = grouped(events, (F.col("app_name"), F.col("domain")), (total(), total())) \
        .groupBy("g_app", "g_sub", F.date_trunc("hour", "at").alias("hour"), "kind").count()
    metric = F.when(F.col("kind") == "connect", F.lit(ds.CONNECTS)).otherwise(F.lit(ds.DISCONNECTS))
    return result(per_hour, metric, ds.HOUR, F.col("hour"), F.col("count"))


def _top_users(clipped: DataFrame, since_at) -> DataFrame:
    totals = clipped.groupBy("app_name", "user_id").agg(F.sum(seconds_between("start", "end")).alias("seconds"))
    rank = Window.partitionBy("app_name").orderBy(F.desc("seconds"), "user_id")
    top = totals.withColumn("rank", F.row_number().over(rank)).where(F.col("rank") <= ds.TOP_USERS_PER_APP)
    return result(top, ds.TOP_USERS, ds.RANGE, since_at, F.col("seconds"), app=F.col("app_name"),
                  subgroup=total(), bucket=F.col("user_id"))


if __name__ == "__main__":
    sys.exit(main(build, "presence"))
