"""A database and a lake of the benchmark's own: created before a run, dropped after it (also when
it fails or is interrupted), and never one that holds anything the benchmark did not create.

A benchmark writes a million generated rows and runs the export, which resets and moves the
export's watermarks and rewrites the lake. Done on an operator's database that loses their export
state and leaves the rows behind, so every benchmark that writes (`manage.py analytics_bench`,
`python -m bench.compare --start-platform`) works on a database it creates on the same Postgres
server, named `switchboard_bench_<random>`, marked at creation with a table (MARKER_TABLE), and on
a lake folder marked with a file (LAKE_MARKER). A database or folder it is pointed at is used only
if it does not exist yet, is empty, or carries the mark; anything else is refused before a single
write. The code that generates data checks the mark again (`bench_database_is_marked`).

Plain psycopg, no Django: bench/ starts platforms on such a database without loading settings.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

import psycopg
from psycopg import sql

DATABASE_PREFIX = "switchboard_bench_"
MARKER_TABLE = "switchboard_bench_marker"
LAKE_MARKER = ".switchboard-bench-lake"
# Tables, views, sequences and the like in any schema but Postgres's own: what makes a database "not empty".
_USER_RELATIONS = """
    SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') AND n.nspname NOT LIKE 'pg_temp_%%'
       AND n.nspname NOT LIKE 'pg_toast_temp_%%' AND c.relname <> %s
"""


class SandboxRefused(Exception):
    """The database or lake named for a benchmark holds something the benchmark did not create."""


def url_with_database(url: str, name: str) -> str:
    """`url` (postgresql://…) with its database replaced by `name`; credentials and options kept."""
    parts = urlsplit(url)
    return parts._replace(path="/" + quote(name, safe="")).geturl()


def database_of(url: str) -> str:
    return unquote(urlsplit(url).path.lstrip("/"))


def bench_database_is_marked(cursor) -> bool:
    """Whether the database `cursor` is connected to was created by a benchmark (any DB-API cursor)."""
    cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [f"public.{MARKER_TABLE}"])
    return bool(cursor.fetchone()[0])


def bench_database_mark(cursor) -> None:
    cursor.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (created_at timestamptz NOT NULL DEFAULT now(), "
                           "note text NOT NULL)").format(sql.Identifier(MARKER_TABLE)))
    cursor.execute(sql.SQL("INSERT INTO {} (note) VALUES (%s)").format(sql.Identifier(MARKER_TABLE)),
                   ["created by a Switchboard benchmark; dropped when it ends"])


def _claim_database(server_url: str, name: str) -> None:
    """Make database `name` the benchmark's: create it if missing, mark it if empty. Raises
    SandboxRefused, having written nothing, for the platform's own database or one holding anything
    else. Statements about databases go through the platform's connection (`server_url`), which
    reads and writes nothing there: a managed server may not let its user into `postgres`."""
    if name == database_of(server_url):
        raise SandboxRefused(f"database {name!r} is the platform's own database; a benchmark never runs on it")
    with psycopg.connect(server_url, autocommit=True) as admin:
        exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    with psycopg.connect(url_with_database(server_url, name), autocommit=True) as conn, conn.cursor() as cur:
        if exists and not bench_database_is_marked(cur):
            others = cur.execute(_USER_RELATIONS, [MARKER_TABLE]).fetchone()[0]
            if others:
                raise SandboxRefused(
                    f"database {name!r} holds {others} tables or other relations that no benchmark created; a "
                    "benchmark only runs on a database it creates (leave --database out), an empty one, or one "
                    "an earlier benchmark left behind")
        bench_database_mark(cur)


def bench_database_drop(server_url: str, name: str) -> None:
    """Drop a benchmark's database (connections still open to it are ended). Refuses an unmarked one."""
    with psycopg.connect(server_url, autocommit=True) as admin:
        if not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            return
        with psycopg.connect(url_with_database(server_url, name), autocommit=True) as conn, conn.cursor() as cur:
            if not bench_database_is_marked(cur):
                raise SandboxRefused(f"database {name!r} carries no benchmark mark; it is not dropped")
        admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


@contextmanager
def bench_database(server_url: str, name: str | None = None) -> Iterator[str]:
    """The URL of a database of the benchmark's own on the server of `server_url` (the platform's
    database URL, whose database is never used): `name`, or a new `switchboard_bench_<random>`.
    Dropped when the block ends, however it ends."""
    name = name or DATABASE_PREFIX + secrets.token_hex(6)
    _claim_database(server_url, name)
    try:
        yield url_with_database(server_url, name)
    finally:
        bench_database_drop(server_url, name)


def bench_lake_is_marked(path: Path) -> bool:
    return (path / LAKE_MARKER).is_file()


@contextmanager
def bench_lake(path: Path | None, live_lake: str) -> Iterator[Path]:
    """A lake folder of the benchmark's own: `path` if it is missing, empty or marked, else a new
    temporary folder. Neither the live lake nor a folder inside or around it is ever used. The
    folder (or, if it existed before and was empty, its contents) is removed when the block ends."""
    if path is None:
        path = Path(tempfile.mkdtemp(prefix="switchboard-bench-lake-"))
        created = True
    else:
        path = path.resolve()
        live = Path(live_lake).resolve() if "://" not in live_lake else None
        if live is not None and (path == live or live in path.parents or path in live.parents):
            raise SandboxRefused(f"{path} is (or holds, or lies in) the platform's lake {live}; a benchmark "
                                 "never writes there")
        if path.exists() and any(path.iterdir()) and not bench_lake_is_marked(path):
            raise SandboxRefused(f"{path} is not empty and was not made by a benchmark; name a new or empty "
                                 "folder, or leave --lake out for a temporary one")
        created = not path.exists()
        path.mkdir(parents=True, exist_ok=True)
    (path / LAKE_MARKER).write_text("a Switchboard benchmark's lake; removed when the benchmark ends\n")
    try:
        yield path
    finally:
        if created:
            shutil.rmtree(path, ignore_errors=True)
        else:
            for child in path.iterdir():
                if child.is_dir():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
