"""The Celery application (config.celery): every task of the platform has a time limit."""

from __future__ import annotations

from analytics import tasks as analytics_tasks
from config.celery import app
from messaging.routing import tasks as messaging_tasks


def _limits(task) -> tuple[float | None, float | None]:
    return (task.soft_time_limit or app.conf.task_soft_time_limit, task.time_limit or app.conf.task_time_limit)


def test_every_task_has_a_soft_and_a_hard_time_limit():
    ours = [t for name, t in app.tasks.items() if name.startswith(("messaging.", "analytics."))]
    assert {messaging_tasks.webhook_deliver.name, analytics_tasks.export_run.name} <= {t.name for t in ours}
    for task in ours:
        soft, hard = _limits(task)
        assert soft and hard and soft < hard, task.name


def test_the_spark_jobs_have_hours_where_routing_has_minutes(settings):
    assert _limits(analytics_tasks.report_run) == (settings.ANALYTICS_TASK_SOFT_TIME_LIMIT,
                                                   settings.ANALYTICS_TASK_TIME_LIMIT)
    assert _limits(analytics_tasks.report_run)[0] >= 3600 > _limits(messaging_tasks.route_deliveries)[1]
