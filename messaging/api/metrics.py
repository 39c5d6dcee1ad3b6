"""The server API's counters (served at /metrics with the rest of the node's figures; request
latency by endpoint is counted for every HTTP request by foundation.http_metrics)."""

from __future__ import annotations

from prometheus_client import Counter

from foundation.metrics import REGISTRY

API_SENDS = Counter("switchboard_api_sends_total", "Sends through the server API, by feature (RELIABLE, FAST, "
                    "CHANNEL)", ["feature"], registry=REGISTRY)
API_ERRORS = Counter("switchboard_api_errors_total", "Server API answers that were errors, by error code",
                     ["code"], registry=REGISTRY)
