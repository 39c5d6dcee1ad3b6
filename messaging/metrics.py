"""Prometheus metrics of a web node, served at /metrics.

Counters and gauges live in the web node's process (each node is scraped on its own); the
dead-letter count is read from Postgres at scrape time through its partial index.
"""

from __future__ import annotations

from django.db import connection
from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

REGISTRY = CollectorRegistry(auto_describe=True)

CONNECTIONS = Gauge("switchboard_ws_connections", "Authenticated WebSocket connections on this node",
                    registry=REGISTRY)
FRAMES = Counter("switchboard_ws_frames_received_total", "Client frames received, by type", ["type"],
                 registry=REGISTRY)
REFUSED = Counter("switchboard_ws_frames_refused_total", "Frames answered with INVALID_MESSAGE or GENERAL_ERROR",
                  ["answer"], registry=REGISTRY)
AUTH = Counter("switchboard_ws_auth_total", "AUTH_CLIENT outcomes", ["result"], registry=REGISTRY)
WRITTEN = Counter("switchboard_deliveries_written_total", "Stored messages written to sockets on this node",
                  registry=REGISTRY)
DELIVERY_LATENCY = Histogram(
    "switchboard_delivery_latency_seconds", "From a RELIABLE message being stored to its frame being written",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600),
    registry=REGISTRY,
)
DEAD_LETTERS = Gauge("switchboard_dead_letters", "Deliveries in the dead-letter queue (cluster-wide)",
                     registry=REGISTRY)


def metrics_view(request: HttpRequest) -> HttpResponse:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM messaging_delivery WHERE state = 'dead'")  # partial index
        DEAD_LETTERS.set(cur.fetchone()[0])
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
