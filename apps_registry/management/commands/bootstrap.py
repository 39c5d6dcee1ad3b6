from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand

from apps_registry.services import admin_user_ensure, demo_config_ensure, domain_ensure


class Command(BaseCommand):
    help = ("Ensure this node's domain, an admin login, and the open demo client app (ANZ / app-id-343) on this domain where "
            "DEMO_ENABLED (on in local runs, off in production).")

    def handle(self, *args, **options):
        ws_url = f"ws://localhost:{settings.PORT}/ws"
        domain_ensure(domain_name=settings.DOMAIN_NAME, ws_url=ws_url)
        app = demo_config_ensure(domain_name=settings.DOMAIN_NAME, ws_url=ws_url)
        if app is None:
            self.stdout.write("demo app not created: DEMO_ENABLED is off (an open app anyone could log in to)")
        else:
            self.stdout.write(
                f"demo app {app.app_name} (appId {app.app_id}, master {app.master_user_id}) on {settings.DOMAIN_NAME}"
            )
        generated = admin_user_ensure(username=settings.ADMIN_USERNAME, password=settings.ADMIN_PASSWORD)
        if generated:
            self.stdout.write(self.style.WARNING(
                f"admin login created: user {settings.ADMIN_USERNAME!r} password {generated!r} "
                "(shown once; set ADMIN_PASSWORD to choose it)"
            ))
        elif settings.ADMIN_PASSWORD:
            self.stdout.write(f"admin login: user {settings.ADMIN_USERNAME!r} with ADMIN_PASSWORD")
