"""`python manage.py eventsource --app APPNAME`: the app's event exchange over TCP (issue 19; the
follower-maze wire format, docs/protocol.md "Event exchange")."""

from __future__ import annotations

import asyncio

from django.core.management.base import BaseCommand, CommandError, CommandParser
from prometheus_client import start_http_server

from apps_registry.selectors import app_snapshot
from foundation.metrics import REGISTRY
from messaging.exchange.service import exchange_build, exchange_serve


class Command(BaseCommand):
    help = "Serve an app's ordered event exchange: the event source on --event-port, user clients on --client-port"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--app", required=True, help="the app's name, e.g. ANZ")
        parser.add_argument("--event-port", type=int, default=9090)
        parser.add_argument("--client-port", type=int, default=9099)
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus metrics here (0: off)")
        parser.add_argument("--no-intake", action="store_true", help="do not read the REST intake's Redis stream")

    def handle(self, *args: object, **options: object) -> None:
        app = app_snapshot(str(options["app"]))
        if app is None:
            raise CommandError(f"no client app named {options['app']!r}")
        if options["metrics_port"]:
            start_http_server(int(options["metrics_port"]), addr=str(options["host"]), registry=REGISTRY)
        exchange = exchange_build(app_id=app.pk, label=app.app_name)
        asyncio.run(exchange_serve(exchange=exchange, host=str(options["host"]), event_port=int(options["event_port"]),
                                   client_port=int(options["client_port"]), intake=not options["no_intake"]))
