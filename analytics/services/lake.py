"""The lake as the exporter sees it: Parquet files under ANALYTICS_LAKE, through pyarrow's file
systems (a local folder by default; s3://, gs:// or hdfs:// URIs work the same way).

Files are written whole into `_staging/run-<run>/` (where no reader looks) and published by a
rename into their final place: a reader sees a complete file or none (see analytics.jobs.datasets
for the layout).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from analytics.jobs.datasets import STAGING, Dataset

_ARROW_TYPES = {"int64": pa.int64(), "string": pa.string(), "bool": pa.bool_(),
                "timestamp": pa.timestamp("us", tz="UTC"), "double": pa.float64()}


def arrow_schema(columns: tuple[tuple[str, str], ...]) -> pa.Schema:
    return pa.schema([(name, _ARROW_TYPES[kind]) for name, kind in columns])


def arrow_table(dataset: Dataset, rows: list[tuple]) -> pa.Table:
    """Rows (tuples in the dataset's column order) as an Arrow table, column by column."""
    schema = arrow_schema(dataset.columns)
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(schema)
    return pa.Table.from_arrays([pa.array(col, type=field.type) for col, field in zip(columns, schema, strict=True)],
                                schema=schema)


def staging_dir(run_id: int) -> str:
    return f"{STAGING}/run-{run_id:08d}"


class Lake:
    def __init__(self, uri: str) -> None:
        if "://" not in uri:
            uri = str(Path(uri).resolve())
        self.uri = uri.rstrip("/")
        self.fs, root = pafs.FileSystem.from_uri(self.uri)
        self.root = root.rstrip("/")

    def path(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def url(self, rel: str = "") -> str:
        """The location of `rel` for Spark."""
        return f"{self.uri}/{rel}" if rel else self.uri

    def exists(self, rel: str) -> bool:
        return self.fs.get_file_info(self.path(rel)).type != pafs.FileType.NotFound

    def write_table(self, table: pa.Table, rel: str) -> None:
        self.fs.create_dir(self.path(rel).rsplit("/", 1)[0], recursive=True)
        pq.write_table(table, self.path(rel), filesystem=self.fs, compression="snappy")

    def move(self, src: str, dst: str) -> None:
        """Rename `src` to `dst` (atomic on a local or HDFS lake); done already is fine."""
        if not self.exists(src) and self.exists(dst):
            return
        self.fs.create_dir(self.path(dst).rsplit("/", 1)[0], recursive=True)
        self.fs.move(self.path(src), self.path(dst))

    def write_text(self, rel: str, text: str) -> None:
        self.fs.create_dir(self.path(rel).rsplit("/", 1)[0], recursive=True)
        with self.fs.open_output_stream(self.path(rel)) as out:
            out.write(text.encode())

    def delete_dir(self, rel: str) -> None:
        if self.exists(rel):
            self.fs.delete_dir(self.path(rel))

    def subdirs(self, rel: str) -> list[str]:
        if not self.exists(rel):
            return []
        infos = self.fs.get_file_info(pafs.FileSelector(self.path(rel)))
        return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)

    def files(self, rel: str) -> list[str]:
        """Every file under `rel`, relative to it, hidden ones included."""
        if not self.exists(rel):
            return []
        base = self.path(rel)
        infos = self.fs.get_file_info(pafs.FileSelector(base, recursive=True))
        return sorted(i.path[len(base) + 1:] for i in infos if i.type == pafs.FileType.File)

    def read(self, rel: str, columns: tuple[tuple[str, str], ...], only: list[str] | None = None) -> pa.Table:
        """The Parquet files under `rel` (hidden `_`/`.` names skipped) as one table."""
        schema = arrow_schema(columns)
        if not self.exists(rel):
            return schema.empty_table() if only is None else schema.empty_table().select(only)
        return pads.dataset(self.path(rel), filesystem=self.fs, format="parquet", schema=schema,
                            partitioning="hive").to_table(columns=only)
