from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from apps_registry.routing import route_for_user


class Command(BaseCommand):
    help = "Print the domain path a message to USER_ID takes, e.g. domain-01 -> domain-04 -> domain-03."

    def add_arguments(self, parser):
        parser.add_argument("user_id")
        parser.add_argument("--from", dest="from_domain", default=None, help="start domain (default: this node's)")

    def handle(self, *args, user_id: str, from_domain: str | None, **options):
        route = route_for_user(user_id, from_domain=from_domain)
        if route.path is None:
            raise CommandError(route.describe())
        self.stdout.write(route.describe())
