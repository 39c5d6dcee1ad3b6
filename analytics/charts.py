"""Server-rendered SVG charts for the report pages and the dashboard: a time line chart and a
(grouped) bar chart. No JavaScript and nothing fetched from elsewhere: the console works offline.
(Same approach as bench/chart.py.)"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from xml.sax.saxutils import escape

COLORS = ("#417690", "#e67e22", "#2ca02c", "#9467bd", "#d62728", "#8c564b", "#17becf", "#7f7f7f")
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 34, 46


@dataclass(frozen=True)
class TimeSeries:
    label: str
    points: list[tuple[datetime, float]]


@dataclass(frozen=True)
class BarSeries:
    label: str
    values: list[float]  # one per category


def nice_step(span: float, ticks: int = 5) -> float:
    raw = max(span, 1e-9) / ticks
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)


def _fmt(value: float) -> str:
    if value >= 10_000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def _svg(width: int, height: int, title: str, body: list[str], css_class: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="chart {css_class}" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}" font-family="sans-serif" '
            f'font-size="11"><title>{escape(title)}</title><rect width="{width}" height="{height}" fill="#fff"/>'
            f'<text x="{LEFT}" y="18" font-size="13" font-weight="bold" fill="#333">{escape(title)}</text>'
            + "".join(body) + "</svg>")


def _y_axis(top: float, width: int, height: int, y_label: str) -> tuple[list[str], float]:
    step = nice_step(top or 1)
    y_max = math.ceil((top or 1) / step) * step
    plot_h = height - TOP - BOTTOM
    out = []
    tick = 0.0
    while tick <= y_max + 1e-9:
        y = TOP + plot_h * (1 - tick / y_max)
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{width - RIGHT}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#555">{_fmt(tick)}</text>')
        tick += step
    out.append(f'<text transform="translate(14 {TOP + plot_h / 2:.0f}) rotate(-90)" text-anchor="middle" '
               f'fill="#555">{escape(y_label)}</text>')
    return out, y_max


def _legend(labels: list[str], width: int) -> list[str]:
    out, x = [], width - RIGHT
    for i, label in reversed(list(enumerate(labels))):
        x -= 14 + 7 * len(label) + 12
        out.append(f'<rect x="{x}" y="9" width="10" height="10" fill="{COLORS[i % len(COLORS)]}"/>')
        out.append(f'<text x="{x + 14}" y="18" fill="#333">{escape(label)}</text>')
    return out


def line_chart(series: list[TimeSeries], *, title: str, y_label: str, width: int = 760, height: int = 260,
               step: bool = True) -> str:
    """Values over time, one line per series (as steps by default: a count holds until it changes)."""
    points = [p for s in series for p in s.points]
    if not points:
        return _svg(width, height, title, [f'<text x="{LEFT}" y="{height / 2}" fill="#999">no data</text>'],
                    "line-chart")
    t0, t1 = min(t for t, _ in points), max(t for t, _ in points)
    span = max((t1 - t0).total_seconds(), 60.0)
    body, y_max = _y_axis(max(v for _, v in points), width, height, y_label)
    plot_w, plot_h = width - LEFT - RIGHT, height - TOP - BOTTOM

    def x(t: datetime) -> float:
        return LEFT + plot_w * (t - t0).total_seconds() / span

    def y(v: float) -> float:
        return TOP + plot_h * (1 - v / y_max)

    tick_every = next(h for h in (1, 2, 3, 6, 12, 24, 48, 168, 720) if span / 3600 / h <= 8)
    tick = t0.replace(minute=0, second=0, microsecond=0)
    while tick <= t1:
        if tick >= t0:
            label = tick.strftime("%H:%M") if tick_every < 24 else tick.strftime("%m-%d")
            body.append(f'<line x1="{x(tick):.1f}" y1="{TOP}" x2="{x(tick):.1f}" y2="{TOP + plot_h}" stroke="#f3f3f3"/>')
            body.append(f'<text x="{x(tick):.1f}" y="{TOP + plot_h + 16}" text-anchor="middle" fill="#555">'
                        f'{label}</text>')
        tick += timedelta(hours=tick_every)
    body.append(f'<text x="{LEFT + plot_w / 2:.0f}" y="{height - 8}" text-anchor="middle" fill="#555">'
                f'{t0:%Y-%m-%d %H:%M} – {t1:%Y-%m-%d %H:%M} UTC</text>')
    for i, s in reversed(list(enumerate(series))):  # the first series (the total) is drawn on top
        coords = []
        for t, v in sorted(s.points):
            if step and coords:
                coords.append(f"{x(t):.1f},{coords[-1].split(',')[1]}")
            coords.append(f"{x(t):.1f},{y(v):.1f}")
        body.append(f'<polyline class="series" points="{" ".join(coords)}" fill="none" '
                    f'stroke="{COLORS[i % len(COLORS)]}" stroke-width="1.6"/>')
    body += _legend([s.label for s in series], width)
    return _svg(width, height, title, body, "line-chart")


def bar_chart(categories: list[str], series: list[BarSeries], *, title: str, y_label: str, width: int = 760,
              height: int = 260) -> str:
    """Bars per category, one bar per series side by side."""
    values = [v for s in series for v in s.values]
    if not categories or not values:
        return _svg(width, height, title, [f'<text x="{LEFT}" y="{height / 2}" fill="#999">no data</text>'],
                    "bar-chart")
    body, y_max = _y_axis(max(values), width, height, y_label)
    plot_w, plot_h = width - LEFT - RIGHT, height - TOP - BOTTOM
    slot = plot_w / len(categories)
    bar_w = max(2.0, slot * 0.8 / len(series))
    for c, category in enumerate(categories):
        x0 = LEFT + c * slot + slot * 0.1
        for i, s in enumerate(series):
            v = s.values[c]
            h = plot_h * v / y_max
            x = x0 + i * bar_w
            body.append(f'<rect class="bar" x="{x:.1f}" y="{TOP + plot_h - h:.1f}" width="{bar_w - 1:.1f}" '
                        f'height="{h:.1f}" fill="{COLORS[i % len(COLORS)]}"><title>{escape(s.label)} '
                        f'{escape(category)}: {v:g}</title></rect>')
        label = category if len(category) <= slot / 6 else category[: max(3, int(slot / 6) - 1)] + "…"
        body.append(f'<text x="{LEFT + c * slot + slot / 2:.1f}" y="{TOP + plot_h + 16}" text-anchor="middle" '
                    f'fill="#555">{escape(label)}</text>')
    body.append(f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{width - RIGHT}" y2="{TOP + plot_h}" stroke="#999"/>')
    if len(series) > 1 or series[0].label:
        body += _legend([s.label for s in series], width)
    return _svg(width, height, title, body, "bar-chart")
