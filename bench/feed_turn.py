"""What the standby feed's turn costs a store (migration messaging 0030): every row joining the
feed to a standby takes a shared advisory turn (a BEFORE INSERT row trigger), so that a hand-back
can hold off the feed to its home alone. One feed row is written per RELIABLE delivery of a user
with a standby.

    python -m bench.feed_turn [--rounds 5] [--transactions 2000] [--rows 50]

On a database of the run's own (analytics.bench_sandbox, on the platform's Postgres server; dropped
after): the feed's table as migration 0021 makes it, and the trigger of migration 0030, switched
on and off in turn. Each round writes `transactions` transactions of `rows` feed rows (a group
commit's batch) with the turn, then without, from one session: microseconds per row (wall, one
session, so the server's time), and the ratio round by round.
"""

from __future__ import annotations

import argparse
import json
import os
import platform as host_platform
import statistics
import time
from importlib import import_module

import psycopg

from analytics.bench_sandbox import bench_database
from bench.platform_proc import platform_env

TABLE = """
CREATE TABLE messaging_standbyfeed (
    id bigserial PRIMARY KEY, standby varchar(64) NOT NULL, delivery_id bigint, new boolean NOT NULL,
    app_id bigint, subscriber varchar(96) NOT NULL DEFAULT '', channel varchar(200) NOT NULL DEFAULT '',
    subscribed boolean NOT NULL DEFAULT false, created_at timestamptz NOT NULL, attempts integer NOT NULL DEFAULT 0,
    last_error varchar(500) NOT NULL DEFAULT '', outgoing boolean NOT NULL DEFAULT false)
"""
INSERT = ("INSERT INTO messaging_standbyfeed (standby, delivery_id, new, created_at)"
          " SELECT 'domain-0' || (g %% 4 + 1), g, true, now() FROM generate_series(1, %s) g")


def _round(conn: psycopg.Connection, transactions: int, rows: int) -> float:
    began = time.perf_counter()
    for _ in range(transactions):
        with conn.transaction():
            conn.execute(INSERT, [rows])
    return (time.perf_counter() - began) / (transactions * rows) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--transactions", type=int, default=2000)
    parser.add_argument("--rows", type=int, default=50)
    args = parser.parse_args()
    turn_sql = import_module("messaging.migrations.0030_standby_feed_turn").TURN_SQL
    with bench_database(platform_env()["DATABASE_URL"]) as url, psycopg.connect(url, autocommit=True) as conn:
        conn.execute(TABLE)
        conn.execute(turn_sql)
        runs: dict[str, list[float]] = {"turn": [], "none": []}
        for _ in range(args.rounds):
            for which in ("turn", "none"):
                state = "ENABLE" if which == "turn" else "DISABLE"
                conn.execute(f"ALTER TABLE messaging_standbyfeed {state} TRIGGER messaging_standby_feed_turn")
                runs[which].append(_round(conn, args.transactions, args.rows))
                conn.execute("TRUNCATE messaging_standbyfeed")
    result = {
        "microseconds_per_row": {k: round(statistics.median(v), 2) for k, v in runs.items()},
        "rounds": {k: [round(x, 2) for x in v] for k, v in runs.items()},
        "ratio_turn_to_none": [round(t / n, 3) for t, n in zip(runs["turn"], runs["none"], strict=True)],
        "transactions": args.transactions, "rows_per_transaction": args.rows,
        "machine": {"cpus": os.cpu_count(), "python": host_platform.python_version(),
                    "platform": host_platform.platform()},
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")  # (the migration's imports need it)
    django.setup()
    main()
