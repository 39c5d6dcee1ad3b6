"""The webhooks' figures on /metrics (messaging.gateway.scrape serves the registry)."""

from __future__ import annotations

from prometheus_client import Counter

from foundation.metrics import REGISTRY

WEBHOOKS = Counter(
    "switchboard_webhooks_total",
    "Webhook deliveries by event and outcome: recorded (for an endpoint), delivered, failed (an attempt that "
    "will be retried), dead. Counted in the process where it happened: a web node records presence and "
    "channel events; dead-letter events are recorded, and every call is made, by Celery workers, which are "
    "not scraped (see switchboard_webhook_deliveries for the cluster-wide picture)",
    ["event", "outcome"], registry=REGISTRY)
