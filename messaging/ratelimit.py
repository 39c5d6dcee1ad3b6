"""Per-connection token bucket. In memory on purpose: a connection lives on one node."""

from __future__ import annotations

import time


class TokenBucket:
    def __init__(self, rate: float, burst: int):
        self.rate = rate
        self.capacity = float(burst)
        self.tokens = float(burst)
        self.stamp = time.monotonic()
        self.refusals: list[float] = []

    def allow(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        self.refusals.append(now)
        return False

    def abusive(self, window: float = 10.0) -> bool:
        """Persistent abuse: more refused frames within `window` seconds than the burst allows."""
        now = time.monotonic()
        self.refusals = [t for t in self.refusals if now - t < window]
        return len(self.refusals) > max(20, self.capacity)
