"""The web node's event-loop lag over a measured window, beside the latencies it explains.

The node times a timer due every LOOP_LAG_INTERVAL_SECONDS (foundation.loop_watch) into the
histogram `switchboard_event_loop_lag_seconds` on its /metrics; the harness reads it at the window's
two ends and keeps the difference: how many ticks ran, how many were late by more than 10 ms, and the
bucket bounds under which 99% and all of them fell. A stall of the loop delays every message the node
handles meanwhile, so a latency tail that the loop's lag matches is the node's own.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

METRIC = "switchboard_event_loop_lag_seconds"
LATE_SECONDS = 0.01


@dataclass(frozen=True)
class LoopLag:
    ticks: int
    late: int  # ticks more than LATE_SECONDS late
    p99_le_ms: float | None  # the bucket bound under which 99% of the ticks fell (None: no ticks)
    max_le_ms: float | None  # the bucket bound under which all of them fell (inf: over the last bound)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict | None) -> LoopLag | None:
        return None if data is None else cls(**data)

    def text(self) -> str:
        def bound(v: float | None) -> str:
            return "-" if v is None else ("> 2500" if math.isinf(v) else f"≤ {v:g}")

        return f"{bound(self.p99_le_ms)} / {bound(self.max_le_ms)}"

    def summary(self) -> str:
        """For a run's line: `loop lag p99 ≤ 5 ms, max ≤ 25 ms, 1 of 1936 ticks over 10 ms`."""
        p99, worst = self.text().split(" / ")
        return f"loop lag p99 {p99} ms, max {worst} ms, {self.late} of {self.ticks} ticks over 10 ms"


def metrics_url(ws_url: str) -> str:
    parts = urlsplit(ws_url)
    scheme = "https" if parts.scheme == "wss" else "http"
    return f"{scheme}://{parts.netloc}/metrics"


def lag_buckets(ws_url: str) -> dict[float, float] | None:
    """The node's lag histogram now, as {upper bound (s): cumulative count}; None if unreadable."""
    try:
        text = httpx.get(metrics_url(ws_url), timeout=5).text
    except httpx.HTTPError:
        return None
    for family in text_string_to_metric_families(text):
        if family.name == METRIC:
            return {float(s.labels["le"]): s.value for s in family.samples if s.name.endswith("_bucket")}
    return None


def lag_window(before: dict[float, float] | None, after: dict[float, float] | None) -> LoopLag | None:
    if not before or not after:
        return None
    bounds = sorted(after)
    counts = {b: after[b] - before.get(b, 0.0) for b in bounds}
    ticks = counts[bounds[-1]]
    if ticks <= 0:
        return LoopLag(0, 0, None, None)
    on_time = max((counts[b] for b in bounds if b <= LATE_SECONDS), default=0.0)
    p99 = next(b for b in bounds if counts[b] >= 0.99 * ticks)
    worst = next(b for b in bounds if counts[b] >= ticks)
    return LoopLag(ticks=int(ticks), late=int(ticks - on_time), p99_le_ms=p99 * 1000, max_le_ms=worst * 1000)


class LagProbe:
    """Reads the histogram at the window's start and end (WindowHooks), for one platform target."""

    def __init__(self, ws_url: str | None) -> None:
        self.ws_url = ws_url
        self._before: dict[float, float] | None = None
        self.window: LoopLag | None = None

    def start(self) -> None:
        if self.ws_url:
            self._before = lag_buckets(self.ws_url)

    def stop(self) -> None:
        if self.ws_url:
            self.window = lag_window(self._before, lag_buckets(self.ws_url))
