"""`python manage.py takeover`: see and steer standby takeovers (messaging.federation.takeover.take), on the
standby domain: the planned maintenance of a home is `takeover take domain-03` before it stops and
`takeover hand-back domain-03` after it is back."""

from __future__ import annotations

import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from messaging.federation.standby.copy import copy_lag
from messaging.federation.takeover.take import hand_back, take_over, takeovers_shown


class Command(BaseCommand):
    help = ("Show who serves whose users (no arguments), take a home's users over here "
            "(take HOME), or hand them back (hand-back HOME), on the home's standby domain")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", nargs="?", choices=["take", "hand-back"])
        parser.add_argument("home", nargs="?", help="the home domain, e.g. domain-03")
        parser.add_argument("--wait", type=float, default=60.0,
                            help="hand-back: seconds to wait for the home to take every change (default 60)")

    def handle(self, *args: object, **options: object) -> None:
        action, home = options["action"], options["home"]
        if action is None:
            return self._show()
        if not home:
            raise CommandError(f"takeover {action} needs the home domain's name")
        if action == "take":
            try:
                answer = take_over(str(home), manual=True, reason=f"asked for by hand on {settings.DOMAIN_NAME}")
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(f"{home}: {answer['state']}" + (f" ({answer['merged']} deliveries merged)"
                                                               if "merged" in answer else ""))
            return None
        deadline = time.monotonic() + float(options["wait"])
        while True:
            answer = hand_back(str(home), manual=True)
            if answer["state"] not in ("waiting", "closing") or time.monotonic() > deadline:
                break
            self.stderr.write(f"{home}: {answer['changes_waiting']} changes not yet taken by {home}; waiting"
                              if answer["state"] == "waiting" else
                              f"{home}: its users' connections closing here ({answer['seconds_left']} s)")
            time.sleep(1.0)
        self.stdout.write(f"{home}: {answer['state']}")
        if answer["state"] not in ("handed back",):
            raise CommandError(f"{home} was not handed back: {answer['state']}")
        return None

    def _show(self) -> None:
        here = settings.DOMAIN_NAME
        rows = takeovers_shown()
        held = [r["home"] for r in rows if r["held"] and r["holder"] == here]
        self.stdout.write(f"{here} serves its own users" + (f" and those of {', '.join(held)} it stands by for"
                                                             if held else ""))
        for r in rows:  # one line per home and standby: each holds the home's ranges it stands by for
            state = f"held by {r['holder']} since {r['taken_at']}" if r["held"] else \
                f"at home (last held by {r['holder']} {r['taken_at']} - {r['returned_at']})"
            self.stdout.write(f"  {r['home']}: {state}{' (by hand)' if r['manual'] else ''}")
        for standby, (waiting, lag) in sorted(copy_lag().items()):
            self.stdout.write(f"  copy to {standby}: {waiting} changes waiting, {lag:.1f} s behind")
