"""The names of analytics' cluster-wide "one at a time" runs, for foundation.locks.one_at_a_time
(transaction-scoped, on a connection of its own: a process that dies releases it, and a pooler in
transaction mode cannot strand it)."""

from __future__ import annotations

EXPORT_LOCK = "analytics:export"
REPORT_LOCK = {"presence": "analytics:report:presence", "backlog": "analytics:report:backlog"}
