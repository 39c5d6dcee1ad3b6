"""`make test` on a bare machine: what the tests need from the OS is installed first, or named."""

from __future__ import annotations

import subprocess
from pathlib import Path

from devstack import sysdeps

ROOT = Path(__file__).resolve().parents[2]


def test_the_test_command_installs_the_system_dependencies_before_pytest():
    plan = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    lines = plan.splitlines()
    deps = next(i for i, line in enumerate(lines) if "devstack.sysdeps chromium java haproxy" in line)
    tests = next(i for i, line in enumerate(lines) if "-m pytest" in line)
    assert deps < tests


def test_without_root_a_missing_dependency_gets_a_one_line_instruction_and_a_stop(monkeypatch, capsys):
    monkeypatch.setitem(sysdeps.PRESENT, "chromium", lambda: False)
    monkeypatch.setattr(sysdeps.os, "geteuid", lambda: 1000)
    assert sysdeps.main(["chromium"]) == 1
    err = capsys.readouterr().err
    assert "sudo apt-get install -y chromium" in err


def test_nothing_is_installed_when_everything_is_there(monkeypatch):
    for name in sysdeps.PRESENT:
        monkeypatch.setitem(sysdeps.PRESENT, name, lambda: True)
    monkeypatch.setattr(sysdeps.subprocess, "run", lambda *a, **k: (_ for _ in ()).throw(AssertionError(a)))
    assert sysdeps.main([]) == 0


def test_this_machine_has_a_java_for_spark():
    assert (sysdeps.java_major_version() or 0) >= 17


def test_this_machine_has_haproxy_for_the_load_balancing_tests():
    assert sysdeps.DEPENDENCIES["haproxy"].present()
    assert sysdeps.haproxy_path() == "/usr/sbin/haproxy"  # Debian's package


def test_haproxy_is_found_where_haproxy_path_says(monkeypatch, tmp_path):
    binary = tmp_path / "haproxy"
    binary.write_text("")
    monkeypatch.setenv("HAPROXY_PATH", str(binary))
    assert sysdeps.haproxy_path() == str(binary)
