"""Logging that stays readable when a failure repeats.

`RepeatFilter` (installed on the console handler by the settings) lets the first record of a kind
through (logger, level and message template: "publishing %d events failed: %r" is one kind
whatever its arguments) and holds back its repeats for `window` seconds; the first record of that
kind after the window carries "(N similar suppressed in the last Ws)". Only the first record of a
window keeps its traceback. A Postgres outage under load used to write one traceback per failed
frame: 307,000 lines in 35 s; now it writes a line per kind every window.
"""

from __future__ import annotations

import logging
import threading
import time


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
