"""The requests' figures on /metrics (messaging.gateway.scrape serves the registry).

Requests are answered wherever the answer comes in (a web node for the REST API, a worker for the
stream and the webhook's own answer, beat for timeouts), and workers are not scraped: so the
cluster-wide figures are read from the requests table at scrape time (RequestsCollector.refresh), over the
last REQUEST_METRICS_WINDOW_SECONDS for the outcomes and their latency, and all that waits now. The
counter below is the web node's own: requests it accepted or refused.
"""

from __future__ import annotations

from django.conf import settings
from django.db import connection
from prometheus_client import Counter
from prometheus_client.core import GaugeHistogramMetricFamily, GaugeMetricFamily

from foundation.metrics import REGISTRY

REQUESTS = Counter(
    "switchboard_requests_total",
    "Requests by endpoint and outcome, counted in the process where it happened: accepted or refused "
    "(a web node); resolve, reject, timed_out, endpoint_failed (where the outcome was stored). "
    "switchboard_requests_recent has the cluster-wide picture",
    ["endpoint", "outcome"], registry=REGISTRY)

SESSION_OUTCOMES_DISCARDED = Counter(
    "switchboard_session_outcomes_discarded_total",
    "Outcomes discarded because the session that asked ended (CLOSE_SESSION, or its timeout), counted where "
    "it ended", registry=REGISTRY)
SESSION_OUTCOMES_DROPPED = Counter(
    "switchboard_session_outcomes_dropped_total",
    "Answers to requests of a session that had ended: closed, no outcome stored (counted where answered)",
    registry=REGISTRY)

# Request-to-outcome latency buckets, in seconds.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class RequestsCollector:
    """Requests waiting now, by endpoint (the partial index request_waiting_deadline), and, of those
    made in the window (request_recent), the count by endpoint and state and the request-to-outcome
    latency of the answered ones: read from Postgres by `refresh` (the /metrics view, before it
    renders), so collecting the registry never touches the database itself."""

    def __init__(self) -> None:
        self.waiting: list[tuple[str, int]] = []
        self.recent: list[tuple[str, str, int]] = []
        self.latency: list[tuple[str, int, float, list[int]]] = []

    def refresh(self) -> None:
        window = settings.REQUEST_METRICS_WINDOW_SECONDS
        bounds = ", ".join(f"count(*) FILTER (WHERE answered_at - created_at <= make_interval(secs => {b}))"
                           for b in LATENCY_BUCKETS)
        with connection.cursor() as cur:
            cur.execute("SELECT endpoint, count(*) FROM messaging_request WHERE state = 'waiting' GROUP BY endpoint")
            self.waiting = cur.fetchall()
            cur.execute("SELECT endpoint, state, count(*) FROM messaging_request "
                        "WHERE created_at > now() - make_interval(secs => %s) GROUP BY endpoint, state", [window])
            self.recent = cur.fetchall()
            cur.execute(f"SELECT endpoint, count(*), coalesce(sum(extract(epoch FROM answered_at - created_at)), 0), "
                        f"{bounds} FROM messaging_request WHERE created_at > now() - make_interval(secs => %s) "
                        "AND answered_at IS NOT NULL GROUP BY endpoint", [window])
            self.latency = [(endpoint, count, float(total), cumulative)
                            for endpoint, count, total, *cumulative in cur.fetchall()]

    def describe(self):
        return []

    def collect(self):
        waiting = GaugeMetricFamily("switchboard_requests_waiting", "Requests waiting for their outcome now, by "
                                    "endpoint (cluster-wide)", labels=["endpoint"])
        recent = GaugeMetricFamily("switchboard_requests_recent", "Requests made in the last "
                                   "REQUEST_METRICS_WINDOW_SECONDS, by endpoint and state (cluster-wide)",
                                   labels=["endpoint", "state"])
        latency = GaugeHistogramMetricFamily("switchboard_request_outcome_seconds", "Request-to-outcome time of the "
                                             "requests answered in the last REQUEST_METRICS_WINDOW_SECONDS, by "
                                             "endpoint (cluster-wide)", labels=["endpoint"])
        for endpoint, count in self.waiting:
            waiting.add_metric([endpoint], count)
        for endpoint, state, count in self.recent:
            recent.add_metric([endpoint, state], count)
        for endpoint, count, total, cumulative in self.latency:
            buckets = [(str(b), c) for b, c in zip(LATENCY_BUCKETS, cumulative, strict=True)]
            latency.add_metric([endpoint], [*buckets, ("+Inf", count)], total)
        yield waiting
        yield recent
        yield latency


REQUESTS_COLLECTOR = RequestsCollector()
