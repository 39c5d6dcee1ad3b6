"""The reconnect-storm benchmark runs end to end: a small storm on a platform of its own comes back
whole and is reported with its wall time, its CPU per AUTH_CLIENT and its memory per connection."""

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
def test_a_storm_of_fifty_clients_comes_back_whole_and_is_reported(tmp_path, capsys, benchmarks_alone):
    out = tmp_path / "storm.json"

    assert storm.main(["--clients", "50", "--rounds", "1", "--client-procs", "1", "--settle", "0.5",
                       "--json", str(out), "--quiet"]) == 0

    [result] = json.loads(out.read_text())
    assert result["held"] == {"admitted": 50}
    [storm_round] = result["rounds"]
    assert storm_round["outcomes"] == {"admitted": 50}
    assert 0 < storm_round["to_all_back_s"] < 60
    assert result["cpu_ms_per_auth_by_kind"]["web"] > 0
    assert result["rss_kb_per_connection"] is not None
    assert "| clients |" in capsys.readouterr().out
