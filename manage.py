#!/usr/bin/env python
"""Django's command-line utility for Switchboard."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
from pathlib import Path

# The project packages `config`, `foundation` and `devstack` live in platform/ (a plain folder,
# not a package: a package named `platform` would shadow the standard library).
sys.path.insert(0, str(Path(__file__).resolve().parent / "platform"))


# Settings that run on a developer's machine: without DATABASE_URL / REDIS_URL, the embedded
# Postgres and Redis are started (or reused) here and their URLs handed over. Importing settings
# never starts anything; production settings never get embedded services.
DEVELOPMENT_SETTINGS = {"config.settings.local", "config.settings.test"}


def main() -> None:
    # `kill -USR2 <pid>` prints what every thread of a command is doing, to its stderr: how an
    # operator (or a test about to kill it) sees where a command that does not stop is stuck.
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
    if os.environ["DJANGO_SETTINGS_MODULE"] in DEVELOPMENT_SETTINGS:
        from devstack.embedded import urls_hand_over

        urls_hand_over(os.environ)
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
