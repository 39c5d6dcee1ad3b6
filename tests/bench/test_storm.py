"""The reconnect-storm benchmark runs end to end: a small storm on a platform of its own comes back
whole and is reported with its wall time, its CPU per AUTH_CLIENT and its memory per connection, with
the app's webhook endpoint getting a call for every user that came and went."""

from __future__ import annotations

import json

import pytest

from bench import storm
from bench.storm_client import masked_text_frame, read_frames


def test_a_client_frame_is_masked_with_the_zero_key_and_server_frames_are_cut_whole():
    assert masked_text_frame("hi") == b"\x81\x82\0\0\0\0hi"
    buffer = bytearray(b"\x81\x02ok\x89\x00\x81\x7e\x01\x00" + b"x" * 200)
    assert read_frames(buffer) == [(0x1, b"ok"), (0x9, b"")]
    assert len(buffer) == 204  # the 256-byte frame is not all there yet


@pytest.mark.timeout(900)
def test_a_storm_of_fifty_clients_comes_back_whole_and_is_reported(tmp_path, capsys, benchmarks_alone, monkeypatch):
    out = tmp_path / "storm.json"
    # The platform as `make run` configures it (this process's test settings hand work to no broker).
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "config.settings.local")

    assert storm.main(["--clients", "50", "--rounds", "1", "--client-procs", "1", "--settle", "0.5",
                       "--webhooks", "endpoint", "--json", str(out), "--quiet"]) == 0

    [result] = json.loads(out.read_text())
    assert result["held"] == {"admitted": 50}
    [storm_round] = result["rounds"]
    assert storm_round["outcomes"] == {"admitted": 50}
    assert 0 < storm_round["to_all_back_s"] < 60
    assert result["cpu_ms_per_auth_by_kind"]["web"] > 0
    assert result["rss_kb_per_connection"] is not None
    # Each of the 50 users went and came back: at most one user.disconnected and one user.connected
    # each (none when the new connection registered before the old one's cleanup ran).
    assert set(storm_round["webhooks_recorded"]) <= {"user.connected", "user.disconnected"}
    assert all(n <= 50 for n in storm_round["webhooks_recorded"].values())
    # ... and every call recorded over the run (warm-up and first connections too) reached the receiver.
    assert result["webhooks"]["received"] == result["webhooks"]["recorded"]
    assert result["webhooks"]["recorded"]["user.connected"] >= 70  # the 20 warm-up clients and the 50
    output = capsys.readouterr().out
    assert "| clients |" in output and "+ endpoint" in output
