"""With retention shortened, a steady load leaves the tables' row counts flat (issue 29, item 6).

A real web node, worker and beat; users who stay connected in ACK mode send each other RELIABLE
messages (each delivered and ACKed: a message row, a delivery row that turns `delivered`), while
other users connect and leave all the time (a session row and two presence events each). The row
counts of messages, deliveries, sessions and presence events are sampled every second: once the
first rows are past retention they must stop growing, while far more messages are sent than kept.

Time is compressed so that the run takes about half a minute. With the shipped settings an app keeps
rows at least a day (`retention_days` 1), beat exports every 5 minutes and sweeps every 10, so a
row goes about a day and a few minutes after it was written, and "several minutes of steady load
with retention shortened" means a load many retentions long. Here a retention day lasts
RETENTION_DAY_SECONDS = 2 s, the export and the sweep run every second (each about as often,
relative to the retention, as with a one-hour day at the shipped intervals), and LOAD_SECONDS = 21 s
of load is 10 retentions, about 21 exports and 21 sweeps: the shape of a several-minute run with a
retention of twenty seconds, in a tenth of the time. The sweep's only shortcut is RETENTION_DAY_SECONDS; it runs as beat runs it in production.

It fails without the sweep (RETENTION_SWEEP_SECONDS far beyond the run): every count then grows
by half again between the middle and the last third of the run.
"""

from __future__ import annotations

import itertools
import threading
import time

import pytest
from django.db import connection

from analytics.models import RetentionDay
from apps_registry.models import ClientApp
from tests.loadclients import Peer
from tests.processes import start_beat
from tests.wsclient import WsClient, wait_for

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]  # the processes see the app's retention

DAY_SECONDS = 2
SHORT_RETENTION = {
    "RETENTION_DAY_SECONDS": str(DAY_SECONDS),  # ANZ keeps 1 day: 2 s
    "RETENTION_SWEEP_SECONDS": "1",
    "ANALYTICS_EXPORT_SECONDS": "1",
}
LOAD_SECONDS = 21
SENDERS, RATE = 6, 6.0  # messages per second per sender: 36 a second in all
CHURN_PER_SECOND = 4  # sessions opened and closed again
SAMPLE_SECONDS = 1.0
# The last third's count (_thirds) may exceed the middle third's highest by this much and no more: the counts
# swing with the phase of the export and the sweep. A table that grows with time gains half again.
MARGIN = 0.2
SLACK_ROWS = 10
TABLES = {
    "messages": "messaging_message",
    "deliveries": "messaging_delivery",
    "sessions": "presence_session",
    "presence_events": "presence_presenceevent",
}


def _counts() -> dict[str, int]:
    with connection.cursor() as cur:
        cur.execute("SELECT " + ", ".join(f"(SELECT count(*) FROM {t})" for t in TABLES.values()))
        return dict(zip(TABLES, cur.fetchone(), strict=True))


class Churn(threading.Thread):
    """Users who connect, log in and leave, CHURN_PER_SECOND a second, one after the other."""

    def __init__(self, url: str):
        super().__init__(daemon=True, name="churn")
        self.url = url
        self.done = threading.Event()
        self.sessions = 0
        self.problems: list[str] = []

    def run(self) -> None:
        users = (f"ANZ-{62000 + n % 500}" for n in itertools.count())
        next_at = time.monotonic()
        while not self.done.is_set():
            try:
                with WsClient(self.url) as client:
                    reply = client.auth(next(users))
                    if reply["data"]["isAuthenticated"] is True:
                        self.sessions += 1
                    else:
                        self.problems.append(str(reply))
            except Exception as exc:  # the test fails on it
                self.problems.append(repr(exc))
            next_at = max(next_at + 1 / CHURN_PER_SECOND, time.monotonic() - 1)
            self.done.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> None:
        self.done.set()
        self.join(15)


def _thirds(series: list[int]) -> tuple[int, int]:
    """The highest count of the middle third of the run, and the second highest of the last third:
    one sample may catch a sweep that ran a second late on a busy machine (a third as many rows
    again, once), where a table that grows is higher in every sample of the last third."""
    third = len(series) // 3
    return max(series[third:2 * third]), sorted(series[2 * third:])[-2]


def test_a_steady_load_with_retention_shortened_leaves_the_row_counts_flat(processes, demo_network, tmp_path):
    ClientApp.objects.filter(pk=demo_network["anz"].pk).update(retention_days=1)
    env = {**SHORT_RETENTION, "ANALYTICS_LAKE": str(tmp_path / "lake")}
    web = processes.web("web", **env)
    processes.worker("worker", **env)
    start_beat(processes, tmp_path, **env)

    users = [f"ANZ-{61000 + i}" for i in range(SENDERS)]
    peers = [Peer(user, web.ws_url, users, RATE) for user in users]
    for peer in peers:
        peer.start()
    wait_for(lambda: all(p.connected.is_set() for p in peers), timeout=20)
    churn = Churn(web.ws_url)
    churn.start()
    for peer in peers:
        peer.sending.set()

    samples: list[dict[str, int]] = []
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < LOAD_SECONDS:
        samples.append(_counts())
        time.sleep(max(0.0, SAMPLE_SECONDS * len(samples) - elapsed))
    for peer in peers:
        peer.sending.clear()
    churn.stop()
    for peer in peers:
        peer.leave()

    series = {name: [s[name] for s in samples] for name in TABLES}
    report = f"per second: {series}; removed: {dict(RetentionDay.objects.values_list('source', 'removed'))}"
    problems = [p for peer in peers for p in peer.record.problems] + churn.problems
    assert problems == [], problems[:5]
    sent = sum(len(peer.accepted()) for peer in peers)
    assert sent >= 0.8 * SENDERS * RATE * LOAD_SECONDS, f"only {sent} messages accepted; {report}"
    assert churn.sessions >= 0.6 * CHURN_PER_SECOND * LOAD_SECONDS, f"only {churn.sessions} sessions; {report}"

    thirds = {name: _thirds(values) for name, values in series.items()}
    grown = {name: (middle, last) for name, (middle, last) in thirds.items() if last > middle * (1 + MARGIN) + SLACK_ROWS}
    assert grown == {}, f"grew from the middle to the last third: {grown}; {report}"
    kept = {name: last for name, (_, last) in thirds.items()}
    # What stays is about a retention's worth (plus the export's and the sweep's lag), not the run's.
    assert sent >= 4 * kept["messages"], f"{sent} sent, {kept['messages']} kept; {report}"
    assert sent >= 4 * kept["deliveries"], f"{sent} sent, {kept['deliveries']} kept; {report}"
    assert churn.sessions >= 3 * kept["sessions"], f"{churn.sessions} sessions, {kept['sessions']} kept; {report}"
    removed = dict(RetentionDay.objects.values_list("source", "removed"))
    assert all(removed.get(name, 0) > 0 for name in TABLES), report
