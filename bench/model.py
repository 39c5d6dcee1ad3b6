"""Plain data shared by the load generator's parent and its worker processes (all picklable)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

FEATURES = ("RELIABLE", "FAST")
PROTOCOLS = ("ws", "socketio")  # the native /ws, or Socket.IO over WebSocket at /socket.io/

# Room for "<run>.<process>.<connection>.<counter>|<time_ns>|" ahead of the padding.
MIN_PAYLOAD = 64


@dataclass(frozen=True)
class LoadConfig:
    url: str = "ws://127.0.0.1:8000/ws"
    connections: int = 200
    interval_ms: float = 500.0
    duration: float = 30.0  # seconds of sending, warmup included
    warmup: float = 5.0  # first seconds of sending left out of the latency figures
    feature: str = "RELIABLE"
    processes: int = 4
    app_id: str = "app-id-343"
    app_name: str = "ANZ"
    user_base: int = 500000
    payload: int = 1000
    drain: float = 10.0
    ramp_rate: float = 50.0  # new connections per second, per process
    token: str = "bench"
    connect_timeout: float = 15.0
    confirmation: bool = True
    protocol: str = "ws"

    @property
    def offered_rate(self) -> float:
        return self.connections * 1000.0 / self.interval_ms

    def validate(self) -> None:
        problems = []
        if self.feature not in FEATURES:
            problems.append(f"feature must be one of {FEATURES}")
        if self.protocol not in PROTOCOLS:
            problems.append(f"protocol must be one of {PROTOCOLS}")
        if self.connections < 1 or self.processes < 1:
            problems.append("connections and processes must be at least 1")
        if self.interval_ms <= 0 or self.ramp_rate <= 0:
            problems.append("interval and ramp rate must be positive")
        if not 0 <= self.warmup < self.duration:
            problems.append("warmup must be shorter than duration (duration includes it)")
        if self.payload < MIN_PAYLOAD:
            problems.append(f"payload must be at least {MIN_PAYLOAD} characters (it carries the message id)")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(frozen=True)
class WorkerPlan:
    index: int
    first_connection: int  # global index of this worker's first connection
    connections: int


@dataclass
class WorkerResult:
    index: int
    connections_planned: int
    connections_ok: int = 0
    sent: int = 0
    sent_measured: int = 0
    received: int = 0
    lost: int = 0
    lost_measured: int = 0
    duplicates: int = 0
    stale: int = 0  # echoes of an earlier run (the platform may redeliver them after reconnect)
    unexpected: int = 0  # ids this process never sent
    corrupt: int = 0  # content of the wrong length or without an id
    errors: Counter[str] = field(default_factory=Counter)
    other_frames: Counter[str] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)
    send_lags_ms: list[float] = field(default_factory=list)
    cpu_seconds: float = 0.0
    failure: str | None = None  # traceback if the worker itself crashed


@dataclass
class LoadResult:
    url: str
    feature: str
    connections: int
    processes: int
    interval_ms: float
    payload: int
    duration: float
    warmup: float
    offered_rate: float
    connections_ok: int = 0
    achieved_rate: float = 0.0
    sent: int = 0
    sent_measured: int = 0
    received: int = 0
    lost: int = 0
    lost_measured: int = 0
    duplicates: int = 0
    stale: int = 0
    unexpected: int = 0
    corrupt: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    other_frames: dict[str, int] = field(default_factory=dict)
    samples: int = 0
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    mean_ms: float | None = None
    send_lag_p99_ms: float | None = None
    client_cpu_cores: float = 0.0
    machine_cpu_busy: float | None = None  # fraction of all cores busy while sending
    worker_failures: list[str] = field(default_factory=list)

    @property
    def error_count(self) -> int:
        return sum(self.errors.values()) + len(self.worker_failures)


def percentile(sorted_values: list[float], pct: float) -> float | None:
    """Nearest-rank percentile: a value that was actually observed, never an interpolation."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(pct / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


def merge_results(config: LoadConfig, workers: list[WorkerResult], machine_cpu_busy: float | None) -> LoadResult:
    result = LoadResult(
        url=config.url,
        feature=config.feature,
        connections=config.connections,
        processes=len(workers),
        interval_ms=config.interval_ms,
        payload=config.payload,
        duration=config.duration,
        warmup=config.warmup,
        offered_rate=config.offered_rate,
        machine_cpu_busy=machine_cpu_busy,
    )
    errors: Counter[str] = Counter()
    other: Counter[str] = Counter()
    latencies: list[float] = []
    lags: list[float] = []
    for w in workers:
        for name in (
            "connections_ok",
            "sent",
            "sent_measured",
            "received",
            "lost",
            "lost_measured",
            "duplicates",
            "stale",
            "unexpected",
            "corrupt",
        ):
            setattr(result, name, getattr(result, name) + getattr(w, name))
        errors.update(w.errors)
        other.update(w.other_frames)
        latencies.extend(w.latencies_ms)
        lags.extend(w.send_lags_ms)
        if w.failure:
            result.worker_failures.append(w.failure)
    latencies.sort()
    lags.sort()
    result.errors = dict(errors)
    result.other_frames = dict(other)
    result.achieved_rate = result.sent / config.duration
    result.samples = len(latencies)
    result.p50_ms, result.p95_ms, result.p99_ms = (percentile(latencies, p) for p in (50, 95, 99))
    result.max_ms = latencies[-1] if latencies else None
    result.mean_ms = sum(latencies) / len(latencies) if latencies else None
    result.send_lag_p99_ms = percentile(lags, 99)
    result.client_cpu_cores = sum(w.cpu_seconds for w in workers) / config.duration
    return result
