"""Start a web node: daphne serving config.asgi with Switchboard's WebSocket limits.

    python -m config.web [--bind 0.0.0.0] [--port 8000] [extra daphne options]

Daphne's own message-size ceiling sits well above WS_MAX_FRAME_BYTES, so an oversized frame is
read whole and answered by the consumer with a clean close 1009 instead of daphne dropping the
TCP connection mid-write (which a client sees as 1006).
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--bind", "-b", default=os.environ.get("HOST", "127.0.0.1"))
    parser.add_argument("--port", "-p", default=os.environ.get("PORT", "8000"))
    known, extra = parser.parse_known_args(argv)
    frame_limit = int(os.environ.get("WS_MAX_FRAME_BYTES", 1024 * 1024))
    ceiling = str(max(4 * frame_limit, 4 * 1024 * 1024))

    from daphne.cli import CommandLineInterface

    CommandLineInterface().run([
        "-b", known.bind, "-p", str(known.port), "--proxy-headers",
        "--websocket-max-message-size", ceiling, "--websocket-max-frame-size", ceiling,
        *extra, "config.asgi:application",
    ])


if __name__ == "__main__":
    main(sys.argv[1:])
