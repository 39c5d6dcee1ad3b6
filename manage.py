#!/usr/bin/env python
"""Django's command-line utility for Switchboard."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# The project package `config` lives in platform/ (a plain folder, not a package: a package
# named `platform` would shadow the standard library).
sys.path.insert(0, str(Path(__file__).resolve().parent / "platform"))


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
