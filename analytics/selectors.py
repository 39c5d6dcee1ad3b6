"""Read-side queries of analytics: report reads and the dashboard's live figures."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.utils import timezone


def report_default_range(now: datetime | None = None) -> tuple[datetime, datetime]:
    """Yesterday, UTC: what the nightly reports cover."""
    today = (now or timezone.now()).astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return today - timedelta(days=1), today
