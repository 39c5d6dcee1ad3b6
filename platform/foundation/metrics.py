"""The process's Prometheus registry, and the transport-level metrics every layer may count.

Each web node is scraped on its own at /metrics (messaging.core.metrics adds the messaging figures).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

REGISTRY = CollectorRegistry(auto_describe=True)

CONNECTIONS_CLOSED = Counter(
    "switchboard_connections_closed_by_server_total",
    "Connections the server closed for the client's behaviour, by reason",
    ["reason"], registry=REGISTRY,
)
