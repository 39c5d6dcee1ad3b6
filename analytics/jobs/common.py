"""What both jobs share: reading the lake with partition pruning, the live snapshots, the result
rows, and the spark-submit command line. PySpark only (no Django); the lake's file system through
Spark's JVM (analytics.jobs.patches)."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from . import datasets as ds
from .patches import hadoop_path, jvm

_SPARK_TYPES = {"int64": T.LongType(), "string": T.StringType(), "bool": T.BooleanType(),
                "timestamp": T.TimestampType(), "double": T.DoubleType()}


def spark_schema(columns: tuple[tuple[str, str], ...], partitioned: bool = False) -> T.StructType:
    fields = [T.StructField(name, _SPARK_TYPES[kind]) for name, kind in columns]
    if partitioned:
        fields.append(T.StructField(ds.DAY, T.DateType()))
    return T.StructType(fields)


def _empty(spark: SparkSession, schema: T.StructType) -> DataFrame:
    return spark.createDataFrame([], schema)


def read_days(spark: SparkSession, lake: str, dataset: ds.Dataset, first: date, last: date | None = None) -> DataFrame:
    """A day-partitioned dataset, only the partitions from `first` to `last` (inclusive) listed and read."""
    schema = spark_schema(dataset.columns, partitioned=True)
    path = f"{lake}/{dataset.name}"
    jpath, fs = hadoop_path(spark, path)
    if not fs.exists(jpath):
        return _empty(spark, schema)
    df = spark.read.schema(schema).parquet(path).where(F.col(ds.DAY) >= F.lit(first))
    return df if last is None else df.where(F.col(ds.DAY) <= F.lit(last))


def read_live(spark: SparkSession, lake: str, dataset: ds.Dataset) -> tuple[DataFrame, datetime | None, int | None]:
    """The newest complete live snapshot of `dataset`, its time and its run (None, None if none yet)."""
    schema = spark_schema(dataset.columns)
    base, fs = hadoop_path(spark, f"{lake}/{dataset.name}")
    runs = sorted((s.getPath().getName() for s in fs.listStatus(base) if s.isDirectory()), reverse=True) \
        if fs.exists(base) else []
    java = jvm(spark)
    for name in runs:
        marker = java.org.apache.hadoop.fs.Path(f"{lake}/{dataset.name}/{name}/{ds.SUCCESS}")
        if fs.exists(marker):
            stream = fs.open(marker)
            try:
                as_of = datetime.fromisoformat(java.org.apache.commons.io.IOUtils.toString(stream, "UTF-8").strip())
            finally:
                stream.close()
            run = int(name.removeprefix(ds.LIVE_RUN_PREFIX))
            return spark.read.schema(schema).parquet(f"{lake}/{dataset.name}/{name}"), as_of.astimezone(UTC), run
    return _empty(spark, schema), None, None


def seconds_between(start: str | Column, end: str | Column) -> Column:
    start, end = (F.col(c) if isinstance(c, str) else c for c in (start, end))
    return (F.unix_micros(end) - F.unix_micros(start)) / F.lit(1_000_000.0)


def grouped(df: DataFrame, *levels: tuple[Column, Column]) -> DataFrame:
    """Each row once per grouping level, as columns g_app and g_sub: e.g. (app, domain) and
    ("", "") counts every row under its app and domain and again under "all apps"."""
    groups = F.array(*[F.struct(app.alias("g_app"), sub.alias("g_sub")) for app, sub in levels])
    return df.withColumn("g", F.explode(groups)).select("*", "g.g_app", "g.g_sub").drop("g")


def total() -> Column:
    """The label of "all" in a grouping level (app "" = all apps, subgroup "" = all)."""
    return F.lit("")


def result(df: DataFrame, metric: str | Column, grain: str, period: Column, value: Column, *, app: Column | None = None,
           subgroup: Column | None = None, bucket: Column | None = None) -> DataFrame:
    """Rows in the result shape (analytics.jobs.datasets.RESULT_COLUMNS)."""
    return df.select(
        (F.lit(metric) if isinstance(metric, str) else metric).alias("metric"),
        F.lit(grain).alias("grain"),
        period.cast("timestamp").alias("period"),
        (app if app is not None else F.col("g_app")).alias("app"),
        (subgroup if subgroup is not None else F.col("g_sub")).alias("subgroup"),
        (bucket if bucket is not None else F.lit("")).cast("string").alias("bucket"),
        value.cast("double").alias("value"),
    )


def percentile_rows(df: DataFrame, metric: str, grain: str, period: Column, column: Column) -> DataFrame:
    """p50 / p90 / p99 of `column` per (g_app, g_sub): percentile_approx, which returns a value of
    the data (exact up to its accuracy of 10,000 values per group) and merges partial sketches
    across executors instead of gathering a group's values in one place."""
    pct = df.groupBy("g_app", "g_sub").agg(
        F.percentile_approx(column, [p for _, p in ds.PERCENTILES], 10_000).alias("q"))
    rows = [result(pct, metric, grain, period, F.col("q")[i], bucket=F.lit(label))
            for i, (label, _) in enumerate(ds.PERCENTILES)]
    out = rows[0]
    for more in rows[1:]:
        out = out.unionByName(more)
    return out


def union_all(frames: list[DataFrame]) -> DataFrame:
    out = frames[0]
    for df in frames[1:]:
        out = out.unionByName(df)
    return out


def snapshot_row(spark: SparkSession, dataset: ds.Dataset, as_of: datetime | None, run: int | None) -> DataFrame:
    """Which live snapshot the report read (the report's `as_of`)."""
    schema = spark_schema(ds.RESULT_COLUMNS)
    if as_of is None:
        return _empty(spark, schema)
    return spark.createDataFrame([(ds.LIVE_SNAPSHOT, ds.SNAPSHOT, as_of, "", dataset.name, "", float(run))], schema)


def configure(spark: SparkSession) -> None:
    # Minutes, hours and days are UTC whatever the cluster's clock says.
    spark.conf.set("spark.sql.session.timeZone", "UTC")


def main(build: Callable[[SparkSession, str, datetime, datetime], DataFrame], name: str,
         argv: list[str] | None = None) -> int:
    """spark-submit entry point: compute, then write the result rows as Parquet under --out."""
    parser = argparse.ArgumentParser(prog=name, description=f"Switchboard {name} report (PySpark)")
    parser.add_argument("--lake", required=True, help="the ANALYTICS_LAKE URI the export writes to")
    parser.add_argument("--since", required=True, type=parse_time, help="UTC date or datetime, inclusive")
    parser.add_argument("--until", required=True, type=parse_time, help="UTC date or datetime, exclusive")
    parser.add_argument("--out", required=True, help="where the result rows go (Parquet); load them with "
                                                     "`manage.py analytics_report <kind> --load <out>`")
    args = parser.parse_args(argv)
    started = time.monotonic()
    spark = SparkSession.builder.appName(f"switchboard-{name}").getOrCreate()
    configure(spark)
    write_result(build(spark, args.lake.rstrip("/"), args.since, args.until), args.out)
    print(json.dumps({"job": name, "seconds": round(time.monotonic() - started, 2), "out": args.out}))
    return 0


def write_result(df: DataFrame, out: str) -> None:
    # The result is small (aggregates): one file is easiest to load.
    df.coalesce(1).write.mode("overwrite").parquet(out)


def parse_time(value: str) -> datetime:
    parsed = datetime.fromisoformat(value)
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def day_range(since: datetime, until: datetime) -> tuple[date, date]:
    """The day partitions that can hold times in [since, until)."""
    return since.date(), (until - timedelta(microseconds=1)).date()

