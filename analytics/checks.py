"""System checks of the analytics settings (ids switchboard.E02x)."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.core.checks import Error, register


@register(deploy=False)
def check_analytics(app_configs, **kwargs):
    errors = []
    if not settings.ANALYTICS_LAKE.strip():
        errors.append(Error("ANALYTICS_LAKE is empty.", hint="A folder, or a URI such as s3://bucket/lake.",
                            id="switchboard.E020"))
    if not settings.SPARK_MASTER.strip():
        errors.append(Error("SPARK_MASTER is empty.", hint="local[*], spark://host:7077, yarn, k8s://…",
                            id="switchboard.E021"))
    if not Path(settings.SPARK_DEFAULTS_FILE).is_file():
        errors.append(Error(f"The Spark defaults file {settings.SPARK_DEFAULTS_FILE} is missing.",
                            id="switchboard.E022"))
    if settings.ANALYTICS_EXPORT_BATCH_ROWS < 1:
        errors.append(Error("ANALYTICS_EXPORT_BATCH_ROWS must be at least 1.", id="switchboard.E023"))
    if settings.RETENTION_DAY_SECONDS < 1:
        errors.append(Error("RETENTION_DAY_SECONDS must be at least 1.", hint="86400 (a day) unless shortened for a test.",
                            id="switchboard.E024"))
    return errors
