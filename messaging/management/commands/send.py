"""`python manage.py send`: a server-side send from the command line, through the same services as
the REST API (no HTTP, no key: whoever runs manage.py is trusted with every app)."""

from __future__ import annotations

import json
import sys

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps_registry.selectors import app_snapshot
from messaging.core.accept import SendRefused
from messaging.core.protocol import FEATURE_FAST, FEATURE_RELIABLE
from messaging.intake.server_sends import server_channel_publish, server_message_send


class Command(BaseCommand):
    help = ("Send CONTENT (or stdin) to users or a channel of an app: "
            "send --app ANZ --to ANZ-1002 'hello' | send --app ANZ --channel news < text")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("content", nargs="?", help="the text to send; '-' or left out: read stdin")
        parser.add_argument("--app", required=True, help="the app's name (its user-id prefix), e.g. ANZ")
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--to", action="append", metavar="USER",
                            help="a recipient (repeat it, or separate with commas, for several: a group send)")
        target.add_argument("--channel", help="publish on this channel instead")
        parser.add_argument("--feature", choices=[FEATURE_RELIABLE, FEATURE_FAST], default=FEATURE_RELIABLE)
        parser.add_argument("--reference", default="")
        parser.add_argument("--from", dest="sender", metavar="USER", help="the sender (default: the master user)")
        parser.add_argument("--confirmation", action="store_true",
                            help="one recipient with a reference: confirm delivery to the sender")

    def handle(self, *args: object, **options: object) -> None:
        app = app_snapshot(str(options["app"]))
        if app is None:
            raise CommandError(f"no client app named {options['app']!r}")
        content = options["content"]
        if content in (None, "-"):
            content = sys.stdin.read()
        try:
            if options["channel"]:
                if options["feature"] == FEATURE_FAST:
                    raise CommandError("channel publishes are always kept in the channel's history: drop --feature")
                published = server_channel_publish(app=app, channel=str(options["channel"]), content=content,
                                                   publisher="manage.py send")
                answer = {"channel": published.channel, "offset": published.offset,
                          "subscribers": published.subscribers}
            else:
                recipients = [u.strip() for arg in options["to"] for u in str(arg).split(",") if u.strip()]
                result = server_message_send(
                    app=app, recipients=recipients, content=content, group=len(recipients) > 1,
                    feature=str(options["feature"]), sender=options["sender"], reference=str(options["reference"]),
                    confirmation=bool(options["confirmation"]),
                )
                answer = {"feature": result.feature, "from": result.sender, "recipients": list(result.recipients)}
                if result.message_id is not None:
                    answer["id"] = str(result.message_id)
                else:
                    answer["connections"] = result.connections
        except SendRefused as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from None
        self.stdout.write(json.dumps(answer))
