"""The queue intake's figures on /metrics (messaging.core.metrics registers QUEUE_STATS): read at scrape
time from Redis, where the workers count them (intake.stream.stats), so any web node reports the same."""

from __future__ import annotations

import logging

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from foundation.transport.queue_names import queue_client, stats_key
from messaging.intake.stream.credentials import credential_app_names
from messaging.intake.stream.gate import streams_measure

log = logging.getLogger(__name__)


class QueueStatsCollector:
    """Read at scrape time: the counts above, and each stream's bytes and gate, per app."""

    def describe(self):
        return []  # figures appear once there are apps with a credential

    def collect(self):
        entries = CounterMetricFamily("switchboard_queue_intake_entries", "Queue intake entries by outcome: consumed "
                                      "(stored or pushed), dead (dead-lettered), repeated (already stored: nothing "
                                      "sent again)", labels=["app", "outcome"])
        refused = CounterMetricFamily("switchboard_queue_intake_closed", "Times an app's queue writer lost +xadd "
                                      "(its XADD answers NOPERM): full, or unread while no consumer is alive",
                                      labels=["app", "reason"])
        size = GaugeMetricFamily("switchboard_queue_intake_bytes", "Bytes an app's intake stream holds (Redis's "
                                 "MEMORY USAGE)", labels=["app"])
        gate = GaugeMetricFamily("switchboard_queue_intake_open", "1 while an app's queue writer may XADD",
                                 labels=["app"])
        try:
            names = credential_app_names()
            client = queue_client()
            pipe = client.pipeline(transaction=False)
            for name in names:
                pipe.hgetall(stats_key(name))
            counts = pipe.execute()
            measured = streams_measure(client, names)
        except Exception:  # Redis or Postgres away: the scrape still answers, without these
            log.warning("queue intake figures unavailable", exc_info=True)
            return
        for name, got, m in zip(names, counts, measured, strict=True):
            got = {k.decode(): int(v) for k, v in got.items()}
            for outcome in ("consumed", "dead", "repeated"):
                entries.add_metric([name, outcome], got.get(outcome, 0))
            refused.add_metric([name, "full"], got.get("closed_full", 0))
            refused.add_metric([name, "unread"], got.get("closed_unread", 0))
            size.add_metric([name], m.used)
            gate.add_metric([name], 1.0 if m.acl is not None and m.acl.writable else 0.0)
        yield from (entries, refused, size, gate)


QUEUE_STATS = QueueStatsCollector()
