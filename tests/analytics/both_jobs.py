"""Both reports in one Spark application (tests/analytics/test_local_cluster.py): the presence job,
then the backlog job, each through its own entry point (analytics.jobs.common.main) with its own
arguments, on the one SparkSession spark-submit started: one driver and one set of executors to
start instead of two.

    spark-submit ... tests/analytics/both_jobs.py <presence args> -- <backlog args>
"""

from __future__ import annotations

import sys

from analytics.jobs import backlog, presence
from analytics.jobs.common import main

if __name__ == "__main__":
    args = sys.argv[1:]
    cut = args.index("--")
    sys.exit(main(presence.build, "presence", args[:cut]) or main(backlog.build, "backlog", args[cut + 1:]))
