"""`manage.py selftest URL [--app NAME] [--webhook-listen HOST:PORT [--webhook-url URL]]`: an
operator's end-to-end check of a live deployment, from outside (messaging.selftest.runner). The
operator key comes from SWITCHBOARD_OPERATOR_KEY (preferred: not in the shell's history) or --key."""

from __future__ import annotations

import logging
import os
import sys

from django.core.management.base import BaseCommand, CommandError

from messaging.selftest.runner import Options, selftest_run

KEY_ENV = "SWITCHBOARD_OPERATOR_KEY"


def host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise CommandError(f"--webhook-listen wants HOST:PORT, not {text!r}")
    return host or "0.0.0.0", int(port)  # noqa: S104 (the operator chose to listen on every interface)


class Command(BaseCommand):
    help = "Check a live deployment end to end, from outside, as its clients and an app's server see it."
    requires_system_checks: list[str] = []  # it never touches this machine's database or settings' services

    def add_arguments(self, parser):
        parser.add_argument("url", help="the deployment's base URL, e.g. https://switchboard.example.com")
        parser.add_argument("--key", help=f"an operator key (better: set {KEY_ENV}, kept out of shell history)")
        parser.add_argument("--app", help="run on this existing app (throwaway users of it) instead of a "
                                          "throwaway app")
        parser.add_argument("--timeout", type=float, default=5.0, help="seconds each wait may take (5)")
        parser.add_argument("--webhook-listen", metavar="HOST:PORT",
                            help="check webhooks: listen here for the test endpoint's calls")
        parser.add_argument("--webhook-url", help="the URL the deployment calls to reach --webhook-listen "
                                                  "(default http://HOST:PORT/selftest-hook)")

    def handle(self, *args, **options):
        key = options["key"] or os.environ.get(KEY_ENV, "")
        if not key:
            raise CommandError(f"an operator key is needed: set {KEY_ENV} (or pass --key); "
                               "create one with `manage.py operator_key create NAME`")
        if options["webhook_url"] and not options["webhook_listen"]:
            raise CommandError("--webhook-url needs --webhook-listen (where the calls are received)")
        listen = host_port(options["webhook_listen"]) if options["webhook_listen"] else None
        run = Options(url=options["url"], key=key, app=options["app"], timeout=options["timeout"],
                      webhook_listen=listen, webhook_url=options["webhook_url"])
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per check, not one per request
        try:
            status = selftest_run(run, self.stdout)
        except KeyboardInterrupt:
            self.stderr.write("interrupted (the run was ended and cleaned up)")
            sys.exit(130)
        if status:
            sys.exit(status)
