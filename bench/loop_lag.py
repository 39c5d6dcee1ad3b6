"""The web node's event-loop lag over a measured window, beside the latencies it explains.

The node times a timer due every LOOP_LAG_INTERVAL_SECONDS (foundation.loop_watch) into the
histogram `switchboard_event_loop_lag_seconds` on its /metrics; the harness reads it at the window's
two ends and keeps the difference: how many ticks ran, how many were late by more than 10 ms, and the
bucket bounds under which 99% and all of them fell. A stall of the loop delays every message the node
handles meanwhile, so a latency tail that the loop's lag matches is the node's own. Beside it, the
garbage collections of the window that took longer than 10 ms, by generation
(`switchboard_gc_pause_seconds`): a late tick that one of them matches was the collector's; and the
late ticks by what the node did meanwhile (`switchboard_event_loop_late_ticks_total{cause}`,
foundation.loop_watch): `not_scheduled` ones were the machine's (the loop waited for a core), not the node's.

Between the two ends the probe scrapes /metrics every `scrape_every` seconds (compare's
--scrape-every, 5 s by default), as the Prometheus of a monitored deployment would: what a scrape
costs the node's loop is then in the window's figures, not left out of them. A gauge that walked
the node's whole heap on every scrape (19 ms in one C call, holding the GIL) added a late tick per
scrape for a session before it was seen, because the bench scraped only at the window's ends.
"""

from __future__ import annotations

import math
import threading
from dataclasses import asdict, dataclass, field, replace
from urllib.parse import urlsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

METRIC = "switchboard_event_loop_lag_seconds"
GC_METRIC = "switchboard_gc_pause_seconds"
CAUSE_METRIC = "switchboard_event_loop_late_ticks"
LATE_SECONDS = 0.01


@dataclass(frozen=True)
class LoopLag:
    ticks: int
    late: int  # ticks more than LATE_SECONDS late
    p99_le_ms: float | None  # the bucket bound under which 99% of the ticks fell (None: no ticks)
    max_le_ms: float | None  # the bucket bound under which all of them fell (inf: over the last bound)
    gc_late: dict[str, int] = field(default_factory=dict)  # collections over LATE_SECONDS, by generation
    late_by_cause: dict[str, int] = field(default_factory=dict)  # late ticks by what the node did meanwhile
    scrapes: int = 0  # scrapes of /metrics within the window (at its ends not counted)

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
        collections = ", ".join(f"gen {g}: {n}" for g, n in sorted(self.gc_late.items()) if n)
        causes = ", ".join(f"{c}: {n}" for c, n in sorted(self.late_by_cause.items()) if n)
        return (f"loop lag p99 {p99} ms, max {worst} ms, {self.late} of {self.ticks} ticks over 10 ms"
                + (f" ({causes})" if causes else "")
                + f" (garbage collections over 10 ms: {collections or 'none'})"
                + (f", {self.scrapes} scrapes of /metrics in it" if self.scrapes else ""))


def metrics_url(ws_url: str) -> str:
    parts = urlsplit(ws_url)
    scheme = "https" if parts.scheme == "wss" else "http"
    return f"{scheme}://{parts.netloc}/metrics"


Buckets = dict[float, float]  # a histogram now, as {upper bound (s): cumulative count}


@dataclass(frozen=True)
class Scrape:
    """What one read of the node's /metrics gives the window: its lag histogram (None if unreadable),
    its collections' histograms by generation, and its late ticks by cause (counts)."""

    lag: Buckets | None = None
    collections: dict[str, Buckets] = field(default_factory=dict)
    causes: dict[str, float] = field(default_factory=dict)


def lag_buckets(ws_url: str) -> Scrape:
    """The node's figures now, read from its /metrics."""
    try:
        text = httpx.get(metrics_url(ws_url), timeout=5).text
    except httpx.HTTPError:
        return Scrape()
    lag, collections, causes = None, {}, {}
    for family in text_string_to_metric_families(text):
        if family.name == METRIC:
            lag = {float(s.labels["le"]): s.value for s in family.samples if s.name.endswith("_bucket")}
        elif family.name == GC_METRIC:
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    collections.setdefault(sample.labels["generation"], {})[float(sample.labels["le"])] = sample.value
        elif family.name == CAUSE_METRIC:
            causes.update({s.labels["cause"]: s.value for s in family.samples if s.name.endswith("_total")})
    return Scrape(lag, collections, causes)


def _over(before: Buckets, after: Buckets, seconds: float) -> int:
    """How many of the window's observations were over `seconds` (a bucket bound)."""
    if not after:
        return 0
    total = max(after)
    within = after.get(seconds, 0.0) - before.get(seconds, 0.0)
    return int(after[total] - before.get(total, 0.0) - within)


def lag_window(before: Buckets | None, after: Buckets | None, gc_before: dict[str, Buckets] | None = None,
               gc_after: dict[str, Buckets] | None = None, causes_before: dict[str, float] | None = None,
               causes_after: dict[str, float] | None = None) -> LoopLag | None:
    if not before or not after:
        return None
    gc_before, causes_before = gc_before or {}, causes_before or {}
    gc_late = {gen: _over(gc_before.get(gen, {}), buckets, LATE_SECONDS) for gen, buckets in (gc_after or {}).items()}
    late_by_cause = {cause: int(count - causes_before.get(cause, 0.0)) for cause, count in (causes_after or {}).items()}
    bounds = sorted(after)
    counts = {b: after[b] - before.get(b, 0.0) for b in bounds}
    ticks = counts[bounds[-1]]
    if ticks <= 0:
        return LoopLag(0, 0, None, None, gc_late, late_by_cause)
    on_time = max((counts[b] for b in bounds if b <= LATE_SECONDS), default=0.0)
    p99 = next(b for b in bounds if counts[b] >= 0.99 * ticks)
    worst = next(b for b in bounds if counts[b] >= ticks)
    return LoopLag(ticks=int(ticks), late=int(ticks - on_time), p99_le_ms=p99 * 1000, max_le_ms=worst * 1000,
                   gc_late=gc_late, late_by_cause=late_by_cause)


class LagProbe:
    """Reads the histogram at the window's start and end (WindowHooks), for one platform target, and
    scrapes /metrics every `scrape_every` seconds in between (0: only at the ends)."""

    def __init__(self, ws_url: str | None, scrape_every: float = 0.0) -> None:
        self.ws_url = ws_url
        self.scrape_every = scrape_every
        self._before = Scrape()
        self._stopped = threading.Event()
        self._scraper: threading.Thread | None = None
        self._scrapes = 0
        self.window: LoopLag | None = None

    def start(self) -> None:
        if self.ws_url:
            self._before = lag_buckets(self.ws_url)
            if self.scrape_every > 0:
                self._stopped.clear()
                self._scraper = threading.Thread(target=self._scrape, name="metrics-scraper", daemon=True)
                self._scraper.start()

    def _scrape(self) -> None:
        url = metrics_url(self.ws_url)
        while not self._stopped.wait(self.scrape_every):
            try:
                httpx.get(url, timeout=5).raise_for_status()
            except httpx.HTTPError:
                continue
            self._scrapes += 1

    def stop(self) -> None:
        if self.ws_url:
            if self._scraper is not None:
                self._stopped.set()
                self._scraper.join()
                self._scraper = None
            before, after = self._before, lag_buckets(self.ws_url)
            window = lag_window(before.lag, after.lag, before.collections, after.collections,
                                before.causes, after.causes)
            self.window = None if window is None else replace(window, scrapes=self._scrapes)
