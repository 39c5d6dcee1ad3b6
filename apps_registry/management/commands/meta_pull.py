from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from apps_registry.meta import MetaPullError, meta_pull


class Command(BaseCommand):
    help = ("Pull this domain's configuration from the meta domain (META_URL, signed with META_SECRET) now, "
            "and mirror it here. Exit code 1 when nothing could be applied.")

    def handle(self, *args, **options):
        try:
            outcome = meta_pull()
        except MetaPullError as exc:
            raise CommandError(f"meta pull failed: {exc}") from None
        self.stdout.write(self.style.SUCCESS(str(outcome)))
