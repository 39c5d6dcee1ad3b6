"""Prometheus figures of the exchange engine (process `manage.py eventsource`, which serves them on
its own --metrics-port; the admin reads the same facts from ExchangeState)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from foundation.metrics import REGISTRY

APPLIED = Counter("switchboard_exchange_events_applied_total", "Events applied in sequence, by app",
                  ["app"], registry=REGISTRY)
MALFORMED = Counter("switchboard_exchange_malformed_total",
                    "Event lines refused (malformed, or a sequence number too far ahead), by app",
                    ["app"], registry=REGISTRY)
COMMIT_FAILURES = Counter("switchboard_exchange_commit_failures_total",
                          "Batch commits that failed and were retried with their events, by app", ["app"],
                          registry=REGISTRY)
SOURCES_REFUSED = Counter("switchboard_exchange_sources_refused_total",
                          "Event source connections closed for a missing or wrong shared secret, by app", ["app"],
                          registry=REGISTRY)
SKIPPED = Counter("switchboard_exchange_skipped_total",
                  "Sequence numbers given up after the gap timeout, by app", ["app"], registry=REGISTRY)
GAP_HELD = Gauge("switchboard_exchange_held", "Events held behind a gap, by app", ["app"], registry=REGISTRY)
GAP_AGE = Gauge("switchboard_exchange_gap_seconds", "How long the current gap has lasted (0: none), by app",
                ["app"], registry=REGISTRY)
SLOW_CLIENTS = Counter("switchboard_exchange_slow_clients_total",
                       "TCP clients disconnected for falling too far behind, by app", ["app"], registry=REGISTRY)
CLIENTS = Gauge("switchboard_exchange_clients", "Connected TCP clients, by app", ["app"], registry=REGISTRY)
