"""The composition root as a Django app: it registers the platform's own system checks and chooses
how named work is handed to the workers (settings.HANDOFF_DISPATCHER, foundation.handoff)."""

from __future__ import annotations

from django.apps import AppConfig
from django.conf import settings
from django.utils.module_loading import import_string


class PlatformConfig(AppConfig):
    name = "config"
    label = "platform_config"
    verbose_name = "Platform"

    def ready(self) -> None:
        from config import checks  # noqa: F401  (registering is importing: the switchboard.* system checks)
        from foundation.handoff import dispatcher_use  # the apps' models are loaded only now

        dispatcher_use(import_string(settings.HANDOFF_DISPATCHER)())
