"""What the report pages and the dashboard show: charts and tables built from report rows.
Presentation only; the admin views render these, the selectors fetch the rows."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from analytics.jobs import datasets as ds

from .charts import BarSeries, TimeSeries, bar_chart, line_chart
from .models import REPORT_KINDS, JobKind, Report, ReportRow
from .selectors import report_figures

REPORT_BUTTONS = [(kind.value, kind.label) for kind in REPORT_KINDS]
SERIES_SHOWN = 6  # lines or bar groups per chart: the largest ones; the tables have all


@dataclass
class Table:
    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)


@dataclass
class Section:
    title: str
    svg: str = ""
    table: Table | None = None
    note: str = ""


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, s = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min" + (f" {s} s" if s else "")
    hours, m = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h" + (f" {m} min" if m else "")
    return f"{hours // 24} d {hours % 24} h"


def number(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def place(app: str, subgroup: str) -> str:
    if not app and not subgroup:
        return "all apps"
    return f"{app or 'all apps'} {subgroup}".strip()


def report_sections(report: Report, *, width: int = 900) -> list[Section]:
    return (presence_sections if report.kind == JobKind.PRESENCE else backlog_sections)(report, width=width)


# --- presence ------------------------------------------------------------------------------------

def concurrency_chart(report: Report, *, width: int, height: int = 260, everyone_only: bool = False,
                      rows: list[ReportRow] | None = None) -> str:
    """All apps, and (unless everyone_only) the places with the highest peaks."""
    if rows is None:
        rows = report_figures(report, ds.CONCURRENT, ds.MINUTE, everyone=everyone_only)
    by_place: dict[tuple[str, str], list[tuple[datetime, float]]] = defaultdict(list)
    for r in rows:
        by_place[(r.app, r.subgroup)].append((r.period, r.value))
    peaks = {k: max(v for _, v in points) for k, points in by_place.items()}
    shown = [("", ""), *sorted((k for k in by_place if k != ("", "")), key=lambda k: -peaks[k])[: SERIES_SHOWN - 1]]
    series = [TimeSeries(place(*k), by_place[k]) for k in shown if k in by_place]
    return line_chart(series, title="Concurrent connections per minute", y_label="connections", width=width,
                      height=height)


def presence_sections(report: Report, *, width: int) -> list[Section]:
    minutes = report_figures(report, ds.CONCURRENT, ds.MINUTE)
    peak_minute = max(((r.value, r.period) for r in minutes if not r.app and not r.subgroup), default=None)
    sections = [Section("Concurrent connections", concurrency_chart(report, width=width, rows=minutes),
                        note=f"Peak {number(peak_minute[0])} at {peak_minute[1]:%Y-%m-%d %H:%M} UTC (all apps); "
                             "each minute shows the most connections open at once during it." if peak_minute else "")]

    per_place: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for metric in (ds.PEAK_CONCURRENT, ds.SESSIONS_ENDED):
        for r in report_figures(report, metric, ds.RANGE):
            per_place[(r.app, r.subgroup)][metric] = r.value
    for r in report_figures(report, ds.UNIQUE_USERS, ds.RANGE):
        per_place[(r.app, r.subgroup)][ds.UNIQUE_USERS] = r.value
    for r in report_figures(report, ds.SESSION_LENGTH, ds.RANGE):
        per_place[(r.app, r.subgroup)][r.bucket] = r.value
    table = Table(["app", "domain", "peak connections", "unique users", "sessions ended", "session p50", "p90", "p99"])
    for (app, sub), f in sorted(per_place.items(), key=lambda kv: (kv[0] != ("", ""), kv[0])):
        table.rows.append([app or "all apps", sub or "all", number(f.get(ds.PEAK_CONCURRENT)),
                           number(f.get(ds.UNIQUE_USERS)), number(f.get(ds.SESSIONS_ENDED)),
                           *(duration(f.get(label)) for label, _ in ds.PERCENTILES)])
    sections.append(Section("Per app and domain", table=table,
                            note="Session lengths are of the sessions that ended in the range."))

    days = [r for r in report_figures(report, ds.UNIQUE_USERS, ds.DAY_GRAIN) if not r.app and not r.subgroup]
    sections.append(Section("Unique users per day", bar_chart(
        [f"{r.period:%Y-%m-%d}" for r in days], [BarSeries("", [r.value for r in days])],
        title="Unique users per day (all apps)", y_label="users", width=width, height=220)))

    hourly: dict[datetime, dict[str, float]] = defaultdict(dict)
    for metric in (ds.CONNECTS, ds.DISCONNECTS):
        for r in report_figures(report, metric, ds.HOUR):
            if not r.app and not r.subgroup:
                hourly[r.period][metric] = r.value
    hours = sorted(hourly)
    fmt = "%H:00" if (report.until - report.since) <= timedelta(days=1) else "%m-%d %H"
    sections.append(Section("Connects and disconnects per hour", bar_chart(
        [h.strftime(fmt) for h in hours],
        [BarSeries(m, [hourly[h].get(m, 0) for h in hours]) for m in (ds.CONNECTS, ds.DISCONNECTS)],
        title="Connects and disconnects per hour (all apps)", y_label="per hour", width=width, height=220)))

    top = sorted(report_figures(report, ds.TOP_USERS, ds.RANGE), key=lambda r: (-r.value, r.app, r.bucket))
    sections.append(Section("Users with the most connected time", table=Table(
        ["app", "user", "connected"], [[r.app, r.bucket, duration(r.value)] for r in top[:25]]),
        note=f"Up to {ds.TOP_USERS_PER_APP} per app; time within the range, all of a user's connections added up."))
    return sections


# --- backlog -------------------------------------------------------------------------------------

def backlog_age_chart(report: Report, *, width: int, height: int = 240) -> str:
    counts = {(r.subgroup, r.bucket): r.value for r in report_figures(report, ds.BACKLOG) if not r.app}
    labels = [label for label, _ in ds.AGE_BUCKETS]
    return bar_chart(labels, [BarSeries(group, [counts.get((group, b), 0) for b in labels])
                              for group in (ds.PENDING, ds.DEAD)],
                     title="Backlog by age (all apps)", y_label="deliveries", width=width, height=height)


def latency_chart(report: Report, *, width: int, height: int = 240) -> str:
    values: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    delivered = {(r.app, r.subgroup): r.value for r in report_figures(report, ds.DELIVERED)}
    for r in report_figures(report, ds.LATENCY):
        values[(r.app, r.subgroup)][r.bucket] = r.value
    keys = [("", "")] + sorted((k for k in values if k[0] and k[1]), key=lambda k: -delivered.get(k, 0))[
        : SERIES_SHOWN - 1]
    keys = [k for k in keys if k in values]
    return bar_chart([place(*k) for k in keys],
                     [BarSeries(label, [values[k].get(label, 0) for k in keys]) for label, _ in ds.PERCENTILES],
                     title="Delivery latency, accepted → delivered (ms)", y_label="ms", width=width, height=height)


def backlog_sections(report: Report, *, width: int) -> list[Section]:
    as_of = f"as of {report.as_of:%Y-%m-%d %H:%M:%S} UTC" if report.as_of else "no snapshot exported yet"
    by_app: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for r in report_figures(report, ds.BACKLOG):
        by_app[(r.app, r.subgroup)][r.bucket] = r.value
    labels = [label for label, _ in ds.AGE_BUCKETS]
    table = Table(["app", "state", *labels, "total"])
    for (app, group), counts in sorted(by_app.items(), key=lambda kv: (kv[0][0] != "", kv[0])):
        table.rows.append([app or "all apps", group, *(number(counts.get(b, 0)) for b in labels),
                           number(sum(counts.values()))])
    sections = [Section(f"Pending and dead deliveries by age ({as_of})", backlog_age_chart(report, width=width),
                        table, "Pending counts every delivery not yet delivered (pending, sent or retrying).")]

    oldest = Table(["app", "oldest pending since", "age"])
    for r in report_figures(report, ds.OLDEST_PENDING):
        since = report.as_of - timedelta(seconds=r.value) if report.as_of else None
        oldest.rows.append([r.app or "all apps", f"{since:%Y-%m-%d %H:%M:%S} UTC" if since else "–", duration(r.value)])
    sections.append(Section("Oldest pending", table=oldest))

    latency: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for metric in (ds.LATENCY, ds.DELIVERED):
        for r in report_figures(report, metric):
            latency[(r.app, r.subgroup)][r.bucket or metric] = r.value
    table = Table(["app", "feature", "delivered", *(f"{label} ms" for label, _ in ds.PERCENTILES)])
    for (app, feature), f in sorted(latency.items(), key=lambda kv: (kv[0][0] != "", kv[0])):
        table.rows.append([app or "all apps", feature or "all", number(f.get(ds.DELIVERED)),
                           *(number(f.get(label)) for label, _ in ds.PERCENTILES)])
    sections.append(Section("Delivery latency", latency_chart(report, width=width), table,
                            "Of the deliveries accepted in the range and delivered; feature = the message kind."))

    attempts: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for r in report_figures(report, ds.ATTEMPTS):
        attempts[(r.app, r.subgroup)][r.bucket] = r.value
    buckets = sorted({b for counts in attempts.values() for b in counts}, key=int)
    states = sorted({state for app, state in attempts if not app})
    chart = bar_chart(buckets, [BarSeries(state, [attempts[("", state)].get(b, 0) for b in buckets])
                                for state in states],
                      title="Attempts per delivery (all apps)", y_label="deliveries", width=width, height=220)
    table = Table(["app", "state", *(f"{b} attempts" for b in buckets)])
    for (app, state), counts in sorted(attempts.items(), key=lambda kv: (kv[0][0] != "", kv[0])):
        table.rows.append([app or "all apps", state, *(number(counts.get(b, 0)) for b in buckets)])
    sections.append(Section("Attempts distribution", chart, table,
                            "Deliveries accepted in the range, by the state they are in now."))

    dead = sorted(report_figures(report, ds.DEAD_LETTERS), key=lambda r: (r.app != "", r.app, -r.value))
    sections.append(Section(f"Dead letters by last error ({as_of})", table=Table(
        ["app", "last error", "dead letters"], [[r.app or "all apps", r.bucket or "(none)", number(r.value)]
                                                for r in dead])))
    return sections
