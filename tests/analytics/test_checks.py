"""Misconfigured analytics settings are caught by system checks."""

from __future__ import annotations

from analytics.checks import check_analytics


def test_the_shipped_settings_pass():
    assert check_analytics(None) == []


def test_an_empty_lake_or_spark_master_is_an_error(settings):
    settings.ANALYTICS_LAKE = ""
    settings.SPARK_MASTER = " "
    assert [e.id for e in check_analytics(None)] == ["switchboard.E020", "switchboard.E021"]


def test_a_missing_spark_defaults_file_is_an_error(settings, tmp_path):
    settings.SPARK_DEFAULTS_FILE = tmp_path / "nowhere.conf"
    assert [e.id for e in check_analytics(None)] == ["switchboard.E022"]


def test_a_retention_day_of_no_seconds_is_an_error(settings):
    settings.RETENTION_DAY_SECONDS = 0
    assert [e.id for e in check_analytics(None)] == ["switchboard.E024"]
