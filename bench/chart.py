"""Hand-written SVG line charts against offered rate, one line per target: p99 latency (log scale)
and server CPU per delivered message (linear, from zero).

No plotting library: the chart is a few dozen SVG elements, and keeping it as text keeps the
benchmark free of heavy dependencies and the output diffable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from xml.sax.saxutils import escape

WIDTH, HEIGHT = 820, 460
LEFT, RIGHT, TOP, BOTTOM = 70, 230, 50, 60
COLORS = ("#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf")
LOSS_COLOR = "#d62728"


@dataclass(frozen=True)
class Point:
    rate: float
    value: float | None  # p99 ms or CPU ms/msg; None: nothing came back
    lost: int


@dataclass(frozen=True)
class Series:
    label: str
    points: list[Point]


def _nice_step(span: float, target_ticks: int = 6) -> float:
    raw = span / max(1, target_ticks)
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)


class _Axes:
    """Linear x (rate); log y (latency, which spans decades) unless a subclass says otherwise."""

    y_label = "p99 latency (ms, log scale)"

    def __init__(self, max_rate: float, min_value: float, max_value: float) -> None:
        self.step = _nice_step(max_rate)
        self.x_max = math.ceil(max_rate * 1.05 / self.step) * self.step
        self.y_lo = math.floor(math.log10(min(max(min_value, 0.1), 1.0)))
        self.y_hi = math.ceil(math.log10(max(max_value, 1000.0)))
        self.plot_w = WIDTH - LEFT - RIGHT
        self.plot_h = HEIGHT - TOP - BOTTOM

    @property
    def y_top(self) -> float:
        return float(10**self.y_hi)

    def y_ticks(self) -> list[float]:
        return [float(10**exp) for exp in range(self.y_lo, self.y_hi + 1)]

    def x(self, rate: float) -> float:
        return LEFT + rate / self.x_max * self.plot_w

    def y(self, value: float) -> float:
        frac = (math.log10(max(value, 10**self.y_lo)) - self.y_lo) / (self.y_hi - self.y_lo)
        return TOP + (1 - frac) * self.plot_h

    def grid(self) -> list[str]:
        out = [f'<rect x="{LEFT}" y="{TOP}" width="{self.plot_w}" height="{self.plot_h}" fill="none" stroke="#999"/>']
        tick = 0.0
        while tick <= self.x_max + 1e-9:
            x = self.x(tick)
            out.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + self.plot_h}" stroke="#eee"/>')
            out.append(f'<text x="{x:.1f}" y="{TOP + self.plot_h + 18}" text-anchor="middle">{tick:g}</text>')
            tick += self.step
        for value in self.y_ticks():
            y = self.y(value)
            label = f"{value:g}"
            out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + self.plot_w}" y2="{y:.1f}" stroke="#eee"/>')
            out.append(f'<text x="{LEFT - 8}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
        out.append(
            f'<text x="{LEFT + self.plot_w / 2}" y="{HEIGHT - 15}" text-anchor="middle">'
            "offered rate (messages/s)</text>"
        )
        out.append(
            f'<text transform="translate(18 {TOP + self.plot_h / 2}) rotate(-90)" text-anchor="middle">'
            f"{escape(self.y_label)}</text>"
        )
        return out


class _LinearAxes(_Axes):
    """From zero: CPU per message is compared as a ratio, and a log scale would hide it."""

    y_label = "server CPU (ms per delivered message)"

    def __init__(self, max_rate: float, max_value: float) -> None:
        super().__init__(max_rate, 1.0, 1000.0)
        self.y_step = _nice_step(max(max_value, 0.1), 5)
        self.y_max = math.ceil(max(max_value, 0.1) * 1.05 / self.y_step) * self.y_step

    @property
    def y_top(self) -> float:
        return self.y_max

    def y_ticks(self) -> list[float]:
        count = round(self.y_max / self.y_step)
        return [round(i * self.y_step, 6) for i in range(count + 1)]

    def y(self, value: float) -> float:
        return TOP + (1 - min(max(value, 0.0), self.y_max) / self.y_max) * self.plot_h


def _series_marks(axes: _Axes, series: Series, color: str) -> list[str]:
    out = []
    ceiling = axes.y_top
    coords = [(axes.x(p.rate), axes.y(p.value if p.value is not None else ceiling), p) for p in series.points]
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y, _ in coords)
    out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
    for x, y, p in coords:
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{color}"/>')
        if p.lost:
            # Losses matter more than latency: ring the point and say how many.
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="8" fill="none" stroke="{LOSS_COLOR}" stroke-width="2"/>')
            out.append(
                f'<text x="{x + 10:.1f}" y="{y - 8:.1f}" fill="{LOSS_COLOR}" font-size="11">lost {p.lost}</text>'
            )
    return out


def _legend(series: list[Series], budget_ms: float | None, note: str | None) -> list[str]:
    x = WIDTH - RIGHT + 20
    out = []
    for i, s in enumerate(series):
        y = TOP + 10 + i * 22
        color = COLORS[i % len(COLORS)]
        out.append(f'<line x1="{x}" y1="{y}" x2="{x + 24}" y2="{y}" stroke="{color}" stroke-width="2"/>')
        out.append(f'<circle cx="{x + 12}" cy="{y}" r="4" fill="{color}"/>')
        out.append(f'<text x="{x + 32}" y="{y + 4}">{escape(s.label)}</text>')
    y = TOP + 10 + len(series) * 22 + 8
    out.append(f'<circle cx="{x + 12}" cy="{y}" r="8" fill="none" stroke="{LOSS_COLOR}" stroke-width="2"/>')
    out.append(f'<text x="{x + 32}" y="{y + 4}">messages lost</text>')
    if budget_ms is not None:
        y += 22
        out.append(f'<line x1="{x}" y1="{y}" x2="{x + 24}" y2="{y}" stroke="{LOSS_COLOR}" stroke-dasharray="6 4"/>')
        out.append(f'<text x="{x + 32}" y="{y + 4}">p99 budget {budget_ms:g} ms</text>')
    if note:
        y += 22
        out.append(f'<text x="{x}" y="{y + 4}" font-size="11">{escape(note)}</text>')
    return out


def render_chart(series: list[Series], title: str, budget_ms: float) -> str:
    """p99 latency (log scale) with the budget drawn across."""
    values = [p.value for s in series for p in s.points if p.value is not None]
    rates = [p.rate for s in series for p in s.points]
    axes = _Axes(max(rates, default=1.0), min(values, default=1.0), max(values + [budget_ms], default=1000.0))
    budget_y = axes.y(budget_ms)
    budget_line = (
        f'<line x1="{LEFT}" y1="{budget_y:.1f}" x2="{LEFT + axes.plot_w}" y2="{budget_y:.1f}" '
        f'stroke="{LOSS_COLOR}" stroke-dasharray="6 4"/>'
    )
    return _document(axes, series, title, budget_ms, [budget_line], "points at the top: nothing received")


def render_cpu_chart(series: list[Series], title: str) -> str:
    """Server CPU per delivered message (linear, from zero)."""
    # A run with no figure (nothing received, no process found) is left out rather than drawn at
    # a made-up height.
    series = [Series(s.label, [p for p in s.points if p.value is not None]) for s in series]
    # The scale follows the runs that lost nothing: a saturated run's figure (its CPU divided by
    # the few messages that got through) can be ten times the rest and would flatten every line.
    # Such points sit at the top edge, ringed.
    comparable = [p.value for s in series for p in s.points if p.value is not None and not p.lost]
    values = comparable or [p.value for s in series for p in s.points if p.value is not None]
    rates = [p.rate for s in series for p in s.points]
    axes = _LinearAxes(max(rates, default=1.0), max(values, default=1.0))
    return _document(axes, series, title, None, [], "off-scale points: at the top")


def _document(
    axes: _Axes, series: list[Series], title: str, budget_ms: float | None, extra: list[str], note: str | None
) -> str:
    body = [
        f'<text x="{WIDTH / 2}" y="24" text-anchor="middle" font-size="15" font-weight="bold">{escape(title)}</text>',
        *axes.grid(),
        *extra,
    ]
    for i, s in enumerate(series):
        body += _series_marks(axes, s, COLORS[i % len(COLORS)])
    body += _legend(series, budget_ms, note)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">\n'
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>\n' + "\n".join(body) + "\n</svg>\n"
    )
