"""The comparison's command line: target names and the pids of a platform the harness did not start."""

from __future__ import annotations

import argparse

import pytest

from bench.compare import TARGETS, parse_pids, parse_targets


def test_every_target_runs_by_default_in_a_fixed_order():
    assert TARGETS == ("platform-RELIABLE", "platform-FAST", "relay-core", "relay-pubsub")


def test_the_old_relay_name_still_means_the_core_layer_relay():
    assert parse_targets("platform-FAST,relay") == ["platform-FAST", "relay-core"]
    assert parse_targets("relay,relay-core,relay-pubsub") == ["relay-core", "relay-pubsub"]


def test_the_socketio_targets_run_only_when_asked_for():
    assert parse_targets("socketio-FAST,platform-FAST") == ["socketio-FAST", "platform-FAST"]


def test_an_unknown_target_is_refused():
    with pytest.raises(argparse.ArgumentTypeError):
        parse_targets("relay-redis")


def test_platform_pids_take_several_nodes_per_group():
    assert parse_pids("web=10,web=11,worker=20,postgres=30,redis=40") == {
        "web": [10, 11], "worker": [20], "postgres": [30], "redis": [40],
    }


@pytest.mark.parametrize("text", ["web", "web=abc", "beat=12"])
def test_malformed_platform_pids_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_pids(text)
