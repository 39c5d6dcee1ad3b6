"""The report: CPU per delivered message in the tables, and the docs region it may rewrite."""

from __future__ import annotations

import json
import threading
import time

import pytest

from bench.chart import Point, Series, render_cpu_chart
from bench.cpu import CpuWindow, GroupUsage
from bench.model import LoadResult
from bench.report import (
    MARKER_END,
    MARKER_START,
    Row,
    compact_table,
    cpu_table,
    load_rows,
    ratio_sentence,
    results_table,
    row_from_json,
    row_to_json,
    server_cpu_text,
    splice_generated,
)

PLATFORM = {"web": "web", "worker": "worker", "postgres": "postgres", "redis": "redis"}
PUBSUB = {"relay": "relay-pubsub", "redis": "redis"}


def result(received: int = 1000, lost: int = 0) -> LoadResult:
    return LoadResult(
        url="ws://x/ws", feature="RELIABLE", connections=200, processes=2, interval_ms=500.0, payload=1000,
        duration=20.0, warmup=5.0, offered_rate=400.0, connections_ok=200, achieved_rate=400.0,
        sent=received + lost, received=received, lost=lost, p50_ms=10.0, p99_ms=50.0,
    )


def window(**seconds: float) -> CpuWindow:
    return CpuWindow(
        wall_seconds=25.0,
        groups={name: GroupUsage(seconds=s, processes=1, unreaped_exits=0) for name, s in seconds.items()},
        samples=50,
        probe_cpu_seconds=0.1,
    )


def platform_row(rate: float = 300, feature: str = "RELIABLE", **seconds: float) -> Row:
    cpu = window(**(seconds or {"web": 2.4, "worker": 1.5, "postgres": 1.5, "redis": 0.2, "relay-pubsub": 0.01}))
    return Row(rate=rate, target="platform", feature=feature, result=result(), cpu=cpu, server_groups=PLATFORM)


def pubsub_row(rate: float = 300) -> Row:
    cpu = window(web=0.02, worker=0.01, postgres=0.03, redis=0.2, **{"relay-pubsub": 1.6})
    return Row(rate=rate, target="relay-pubsub", feature="-", result=result(), cpu=cpu, server_groups=PUBSUB)


def test_server_cpu_per_message_adds_the_server_groups_and_ignores_idle_others():
    row = platform_row()
    assert row.split_ms() == pytest.approx({"web": 2.4, "worker": 1.5, "postgres": 1.5, "redis": 0.2})
    assert row.server_ms() == (pytest.approx(5.6), True)
    relay = pubsub_row()
    assert relay.split_ms() == pytest.approx({"relay": 1.6, "redis": 0.2})
    assert server_cpu_text(relay) == "1.80"


def test_a_group_that_was_not_found_marks_the_total_as_a_lower_bound():
    row = platform_row(web=2.4, worker=1.5, redis=0.2)  # no postgres group
    assert row.split_ms()["postgres"] is None
    assert server_cpu_text(row) == "≥4.10"


def test_other_cores_are_the_machines_busy_time_less_the_servers_and_the_load_generator():
    row = platform_row()  # 5.61 s of measured groups, 0.1 s of probe over 25 s
    row.cpu.machine_busy_seconds = 5.61 + 0.1 + 2.0 + 12.5  # load generator 0.1 cores x 20 s, others 12.5 s
    row.result.client_cpu_cores = 0.1
    assert row.other_cores() == pytest.approx(0.5)
    row.cpu.machine_busy_seconds = None
    assert row.other_cores() is None


def test_nothing_received_gives_no_figure():
    row = Row(rate=300, target="platform", feature="FAST", result=result(received=0, lost=10),
              cpu=window(web=1.0), server_groups=PLATFORM)
    assert row.server_ms() == (None, False)
    assert server_cpu_text(row) == "-"


def test_results_table_shows_the_total_and_the_split_per_group():
    table = results_table([platform_row(), pubsub_row()], 250)
    header, _, reliable, relay = table.splitlines()
    assert "server CPU ms/msg | web | relay | worker | pg | redis | load gen cores" in header
    assert "| 5.60 | 2.40 | - | 1.50 | 1.50 | 0.20 |" in reliable
    assert "| 1.80 | - | 1.60 | - | - | 0.20 |" in relay


def test_the_cpu_summary_gives_reliable_against_every_other_target():
    rows = [platform_row(), platform_row(feature="FAST", web=1.6, worker=0.0, postgres=0.0, redis=0.2), pubsub_row()]
    table = cpu_table(rows, 300)
    assert "| platform FAST | 1.80 |" in table and table.count("3.1x") == 2
    assert ratio_sentence(rows, 300) == (
        "At 300 msg/s, platform RELIABLE spends 3.1x the CPU of platform FAST, 3.1x the CPU of relay-pubsub "
        "per delivered message."
    )


def test_a_target_that_lost_messages_is_not_compared():
    lossy = Row(rate=300, target="relay-core", feature="-", result=result(received=900, lost=100),
                cpu=window(redis=0.3, **{"relay-core": 2.0}), server_groups={"relay": "relay-core", "redis": "redis"})
    rows = [platform_row(), lossy, pubsub_row()]
    assert "| 100 | (2.2x) |" in cpu_table(rows, 300)  # 5.6 / (2.3 s / 900)
    assert ratio_sentence(rows, 300) == (
        "At 300 msg/s, platform RELIABLE spends 3.1x the CPU of relay-pubsub per delivered message. "
        "Not compared, for lost messages: relay-core."
    )


def test_compact_table_names_each_part_of_the_split():
    table = compact_table([platform_row(), pubsub_row()])
    assert "web 2.40 / worker 1.50 / pg 1.50 / redis 0.20" in table
    assert "relay 1.60 / redis 0.20" in table


def test_a_row_survives_the_json_file(tmp_path):
    row = platform_row()
    again = row_from_json(json.loads(json.dumps(row_to_json(row))))
    assert again.split_ms() == pytest.approx(row.split_ms())
    assert again.result == row.result
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"command": "c", "runs": [row_to_json(row)]}))
    rows, meta = load_rows(path)
    assert meta == {"command": "c"} and rows[0].label == "platform RELIABLE"


def test_a_json_file_from_before_the_cpu_figures_still_loads(tmp_path):
    old = {"rate": 400, "target": "relay", "feature": "-", "result": row_to_json(pubsub_row())["result"]}
    path = tmp_path / "old.json"
    path.write_text(json.dumps([old]))
    rows, meta = load_rows(path)
    assert rows[0].cpu is None and server_cpu_text(rows[0]) == "-" and meta == {}


# -- the generated region of docs/benchmarks.md ---------------------------------------------------

LEGACY = "# Benchmarks\n\nold results\n\n## Command\n\n```sh\npython -m bench.compare --old\n```\n"


def test_a_new_file_is_the_generated_region():
    assert splice_generated(None, "# Benchmarks\nnew\n") == f"{MARKER_START}\n# Benchmarks\nnew\n{MARKER_END}\n"


def test_only_the_region_between_the_markers_is_rewritten():
    existing = f"intro by hand\n\n{MARKER_START}\nold\n{MARKER_END}\n\n## Before\n\nkept\n\n## Analytics on Spark\n\nkept too\n"
    updated = splice_generated(existing, "new")
    assert updated == f"intro by hand\n\n{MARKER_START}\nnew\n{MARKER_END}\n\n## Before\n\nkept\n\n## Analytics on Spark\n\nkept too\n"
    assert splice_generated(updated, "new") == updated


def test_a_file_from_before_the_markers_gets_them_once_and_keeps_what_was_appended():
    existing = LEGACY + "\n## Analytics on Spark\n\nby hand\n"
    updated = splice_generated(existing, "new")
    assert updated == f"{MARKER_START}\nnew\n{MARKER_END}\n\n## Analytics on Spark\n\nby hand\n"
    assert "--old" not in updated


def test_a_file_of_unknown_shape_loses_nothing():
    existing = "# Notes\n\nsomething else\n"
    assert splice_generated(existing, "new") == f"{MARKER_START}\nnew\n{MARKER_END}\n\n{existing}"


def test_a_lone_marker_is_refused_rather_than_guessed():
    with pytest.raises(ValueError):
        splice_generated(f"{MARKER_START}\nhalf a region\n", "new")


def test_the_cpu_chart_leaves_out_runs_without_a_figure():
    svg = render_cpu_chart([Series("platform RELIABLE", [Point(300, 5.8, 0), Point(400, None, 0)])], "t")
    assert svg.startswith("<svg") and svg.count('r="4"') == 2  # one point, one legend dot


def test_the_web_nodes_loop_lag_over_a_window_is_read_from_its_histogram_and_shown_beside_the_latencies():
    from dataclasses import replace

    from bench.loop_lag import lag_window

    before = {0.001: 90.0, 0.005: 98.0, 0.01: 99.0, 0.05: 100.0, 0.25: 100.0, float("inf"): 100.0}
    after = {0.001: 1070.0, 0.005: 1095.0, 0.01: 1097.0, 0.05: 1099.0, 0.25: 1100.0, float("inf"): 1100.0}
    lag = lag_window(before, after)
    assert (lag.ticks, lag.late, lag.p99_le_ms, lag.max_le_ms) == (1000, 2, 5.0, 250.0)
    row = replace(platform_row(), loop_lag=lag)
    assert "| ≤ 5 / ≤ 250 |" in results_table([row, pubsub_row()], 250)
    assert row_from_json(json.loads(json.dumps(row_to_json(row)))).loop_lag == lag


def test_the_collections_over_ten_milliseconds_in_a_window_are_counted_beside_the_late_ticks():
    from bench.loop_lag import lag_window

    before = {0.001: 90.0, 0.01: 99.0, 0.05: 100.0, float("inf"): 100.0}
    after = {0.001: 1070.0, 0.01: 1098.0, 0.05: 1100.0, float("inf"): 1100.0}
    gc_before = {"0": {0.005: 3.0, 0.01: 3.0, 0.025: 3.0, float("inf"): 3.0},
                 "2": {0.005: 0.0, 0.01: 1.0, 0.025: 1.0, float("inf"): 2.0}}
    gc_after = {"0": {0.005: 9.0, 0.01: 9.0, 0.025: 9.0, float("inf"): 9.0},
                "2": {0.005: 0.0, 0.01: 1.0, 0.025: 2.0, float("inf"): 3.0}}

    lag = lag_window(before, after, gc_before, gc_after)

    assert lag.gc_late == {"0": 0, "2": 1}
    assert lag.summary().endswith("1 of 1000 ticks over 10 ms (garbage collections over 10 ms: gen 2: 1)")
    assert lag_window(before, after).summary().endswith("(garbage collections over 10 ms: none)")


def test_the_late_ticks_of_a_window_are_told_by_what_the_node_did_meanwhile():
    from bench.loop_lag import lag_window

    before = {0.01: 99.0, float("inf"): 100.0}
    after = {0.01: 1096.0, float("inf"): 1100.0}
    causes_before = {"not_scheduled": 5.0, "loop": 1.0}
    causes_after = {"not_scheduled": 8.0, "loop": 1.0, "blocked": 0.0}

    lag = lag_window(before, after, causes_before=causes_before, causes_after=causes_after)

    assert lag.late_by_cause == {"not_scheduled": 3, "loop": 0, "blocked": 0} and lag.gc_late == {}
    assert "3 of 1000 ticks over 10 ms (not_scheduled: 3) (garbage collections" in lag.summary()


class _MetricsServer:
    """A node's /metrics as the bench sees it: one lag histogram, and the requests counted."""

    TEXT = ("# TYPE switchboard_event_loop_lag_seconds histogram\n"
            'switchboard_event_loop_lag_seconds_bucket{le="0.01"} 10.0\n'
            'switchboard_event_loop_lag_seconds_bucket{le="+Inf"} 10.0\n')

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests += 1
                body = server.TEXT.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.requests = 0
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"ws://127.0.0.1:{self.httpd.server_address[1]}/ws"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def metrics_server():
    server = _MetricsServer()
    yield server
    server.httpd.shutdown()


def test_the_node_is_scraped_during_the_window_as_a_deployments_prometheus_would(metrics_server):
    from bench.loop_lag import LagProbe

    probe = LagProbe(metrics_server.url, scrape_every=0.05)
    probe.start()
    time.sleep(0.5)
    probe.stop()

    assert probe.window.scrapes >= 4
    assert metrics_server.requests == probe.window.scrapes + 2  # and one read at each end
    assert probe.window.summary().endswith(f"{probe.window.scrapes} scrapes of /metrics in it")


def test_without_scrapes_the_node_is_read_only_at_the_windows_ends(metrics_server):
    from bench.loop_lag import LagProbe

    probe = LagProbe(metrics_server.url)
    probe.start()
    time.sleep(0.2)
    probe.stop()

    assert metrics_server.requests == 2
    assert probe.window.scrapes == 0
