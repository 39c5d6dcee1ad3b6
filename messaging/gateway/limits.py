"""Rate limits of a web node, in memory on purpose: a connection lives on one node.

- Every frame is counted, before it is parsed: a frame costs its budget whether or not it is JSON,
  so a flood of garbage is refused as cheaply as a flood of PINGs. The frame budget is four times
  the app's per-connection rate; work frames (MESSAGE, GROUP_MESSAGE, FETCH…, SUBSCRIBE,
  CLOSE_CONNECTION) also draw, once parsed, on the app's rate itself. Before authentication every
  frame draws on a small fixed budget (and may be only WS_PREAUTH_MAX_FRAME_BYTES long).
- Work is counted too: each delivery a send creates (one per recipient) draws on a budget per user
  and node, shared by all of the user's connections on the node, so a GROUP_MESSAGE of 100
  recipients costs 100, and opening more connections buys no more.
- A connection whose frames keep being refused (more refusals within ABUSE_WINDOW seconds than its
  burst) is closed with 1008.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass

ABUSE_WINDOW = 10.0
CONTROL_FACTOR = 4
PREAUTH_RATE = 5.0
PREAUTH_BURST = 20


class TokenBucket:
    def __init__(self, rate: float, burst: float):
        self.rate = float(rate)
        self.capacity = float(burst)
        self.tokens = float(burst)
        self.stamp = time.monotonic()

    def take(self, cost: float = 1.0) -> float:
        """0.0 when `cost` tokens were taken; else the seconds until they would be there (nothing taken)."""
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= cost:
            self.tokens -= cost
            return 0.0
        if cost > self.capacity:
            return float("inf")
        return (cost - self.tokens) / self.rate


class Refusals:
    """Refused frames within a sliding window: persistent abuse closes the connection.

    O(1) per refusal, however many come: the window keeps at most tolerance + 1 stamps (the oldest
    leave as new ones come), so a client that floods refused frames costs no more per frame than
    one that sends a few (a copy of the whole window per frame made a flood quadratic)."""

    def __init__(self, tolerance: int):
        self.tolerance = max(20, tolerance)
        self.stamps: collections.deque[float] = collections.deque(maxlen=self.tolerance + 1)

    def add(self) -> bool:
        """Record a refusal; True when the connection is abusive (more than `tolerance` refusals
        within ABUSE_WINDOW seconds)."""
        now = time.monotonic()
        self.stamps.append(now)
        return len(self.stamps) > self.tolerance and now - self.stamps[0] < ABUSE_WINDOW


@dataclass
class ConnectionLimits:
    frames: TokenBucket  # every frame, before it is parsed
    work: TokenBucket | None  # work frames, once parsed (None before authentication: frames is all there is)
    refusals: Refusals

    @classmethod
    def preauth(cls) -> ConnectionLimits:
        return cls(frames=TokenBucket(PREAUTH_RATE, PREAUTH_BURST), work=None, refusals=Refusals(PREAUTH_BURST))

    @classmethod
    def for_app(cls, rate: float, burst: int) -> ConnectionLimits:
        return cls(frames=TokenBucket(rate * CONTROL_FACTOR, burst * CONTROL_FACTOR), work=TokenBucket(rate, burst),
                   refusals=Refusals(burst))


class UserWorkLimits:
    """Delivery budgets per (app, user) on this node, kept while the user has a connection here."""

    def __init__(self) -> None:
        self._buckets: dict[tuple[int, str], tuple[TokenBucket, int]] = {}

    def attach(self, key: tuple[int, str], rate: float, burst: int) -> TokenBucket:
        bucket, holders = self._buckets.get(key, (None, 0))
        if bucket is None:
            bucket = TokenBucket(rate, burst)
        self._buckets[key] = (bucket, holders + 1)
        return bucket

    def detach(self, key: tuple[int, str]) -> None:
        bucket, holders = self._buckets.get(key, (None, 0))
        if bucket is None:
            return
        if holders <= 1:
            del self._buckets[key]
        else:
            self._buckets[key] = (bucket, holders - 1)

    def __len__(self) -> int:
        return len(self._buckets)
