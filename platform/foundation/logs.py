"""Logging that stays readable when a failure repeats.

`RepeatFilter` (installed on the console handler by the settings) lets the first record of a kind
through (logger, level and message template: "publishing %d events failed: %r" is one kind
whatever its arguments) and holds back its repeats for `window` seconds; the first record of that
kind after the window carries "(N similar suppressed in the last Ws)". Only the first record of a
window keeps its traceback. A Postgres outage under load used to write one traceback per failed
frame: 307,000 lines in 35 s; now it writes a line per kind every window.

`loggable` makes a client-supplied string (a user id, a reason quoting an origin, a channel name)
safe for one log line: a newline in a refused `userId` used to start a forged log line of its own.
"""

from __future__ import annotations

import logging
import re
import threading
import time

LOGGED_VALUE_MAX = 200  # characters of one client-supplied value in a log line
# Control characters (C0, DEL, C1), line and paragraph separators, and bidirectional overrides.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def loggable(value: object, limit: int = LOGGED_VALUE_MAX) -> str:
    """`value` as text for a log line: every control character escaped as repr() writes it (a newline
    is a backslash and an n), cut to `limit` characters with a mark that it was."""
    text = str(value)
    cut = len(text) > limit
    text = _UNSAFE.sub(lambda m: repr(m.group())[1:-1], text[:limit])
    return text + "…(cut)" if cut else text


class RepeatFilter(logging.Filter):
    def __init__(self, window: float = 10.0, max_kinds: int = 10_000):
        super().__init__()
        self.window = window
        self.max_kinds = max_kinds
        self._seen: dict[tuple[str, int, str], tuple[float, int]] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, str(record.msg))
        now = time.monotonic()
        with self._lock:
            first, suppressed = self._seen.get(key, (0.0, 0))
            if first and now - first < self.window:
                self._seen[key] = (first, suppressed + 1)
                return False
            if len(self._seen) >= self.max_kinds:
                self._seen.clear()  # bounded: a flood of distinct messages must not grow memory
            self._seen[key] = (now, 0)
        if suppressed:
            record.msg = f"{record.msg} ({suppressed} similar suppressed in the last {self.window:.0f}s)"
        return True
