"""The Celery application: `celery -A config worker` / `celery -A config beat`."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")

app = Celery("switchboard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    # A task is acknowledged only after it ran, so a worker killed mid-task (SIGKILL, OOM, node
    # loss) leaves it on the broker to be redelivered; every task is idempotent for that reason.
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=4,
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    broker_transport_options={"visibility_timeout": 300},
    timezone="UTC",
)
app.autodiscover_tasks()  # each app's `tasks` module (apps_registry, analytics)
app.autodiscover_tasks(["messaging.routing"])  # messaging's tasks live with its routing (messaging.routing.tasks)
