"""The CPU accounting: what a group's processes cost between two snapshots, from /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from bench.cpu import (
    CLK_TCK,
    CpuProbe,
    ProcStat,
    account,
    members,
    parse_stat,
    platform_roots,
    postmaster_pid,
    redis_server_pid,
)


def stat(pid: int, ppid: int, own: int, reaped: int = 0, started: int = 1000) -> ProcStat:
    return ProcStat(pid=pid, ppid=ppid, started=started, own=own, reaped=reaped)


def by_key(*stats: ProcStat) -> dict[tuple[int, int], ProcStat]:
    return {s.key: s for s in stats}


def ticks(usage_seconds: float) -> int:
    return round(usage_seconds * CLK_TCK)


def test_stat_line_with_spaces_and_parentheses_in_the_command_name_is_parsed():
    line = "4242 (postgres: a (b) c) S 17 4242 4242 0 -1 4194560 99 0 0 0 30 12 5 2 20 0 1 0 777 3133440 379 0 0\n"
    assert parse_stat(line) == ProcStat(pid=4242, ppid=17, started=777, own=42, reaped=7)


def test_the_own_process_parses():
    me = parse_stat(Path(f"/proc/{os.getpid()}/stat").read_text())
    assert me.pid == os.getpid() and me.ppid == os.getppid()


def test_a_group_is_its_roots_and_all_their_descendants():
    table = {s.pid: s for s in (stat(1, 0, 0), stat(10, 1, 0), stat(11, 10, 0), stat(12, 11, 0), stat(20, 1, 0))}
    assert {key[0] for key in members([10], table)} == {10, 11, 12}


def test_a_dead_root_makes_an_empty_group():
    assert members([99], {1: stat(1, 0, 0)}) == {}


def test_a_process_alive_throughout_counts_its_difference():
    first = by_key(stat(10, 1, own=100))
    last = by_key(stat(10, 1, own=150))
    usage = account(first, {**first, **last}, last)
    assert ticks(usage.seconds) == 50 and usage.processes == 1 and usage.unreaped_exits == 0


def test_a_backend_born_during_the_window_counts_in_full():
    first = by_key(stat(10, 1, own=100))
    last = by_key(stat(10, 1, own=110), stat(11, 10, own=30, started=2000))
    assert ticks(account(first, {**first, **last}, last).seconds) == 10 + 30


def test_a_backend_that_exits_is_counted_once_through_its_parents_reaped_time():
    # The backend had used 40 ticks at the start and 65 when it died; the postmaster's cutime
    # grew by those 65 when it reaped it. Only the 25 of the window may count.
    backend_start, backend_end = stat(11, 10, own=40), stat(11, 10, own=65)
    first = by_key(stat(10, 1, own=100), backend_start)
    last = by_key(stat(10, 1, own=100, reaped=65))
    seen = {**first, backend_end.key: backend_end, **last}
    usage = account(first, seen, last)
    assert ticks(usage.seconds) == 25 and usage.unreaped_exits == 0


def test_a_short_lived_process_never_sampled_still_counts_through_its_parent():
    first = by_key(stat(10, 1, own=100, reaped=5))
    last = by_key(stat(10, 1, own=101, reaped=5 + 12))
    assert ticks(account(first, {**first, **last}, last).seconds) == 1 + 12


def test_a_process_that_vanishes_without_a_reaper_in_the_group_counts_to_its_last_sample():
    root_start, root_seen = stat(10, 1, own=100), stat(10, 1, own=130)
    usage = account(by_key(root_start), by_key(root_seen), {})
    assert ticks(usage.seconds) == 30 and usage.unreaped_exits == 1


def test_a_reused_pid_is_another_process():
    old, new = stat(11, 10, own=500, started=1000), stat(11, 10, own=3, started=5000)
    first = by_key(stat(10, 1, own=0), old)
    last = by_key(stat(10, 1, own=0, reaped=520), new)
    seen = {**first, old.key: stat(11, 10, own=520, started=1000), **last}
    # old: 20 in the window (via the parent's reaped time), new: all of its 3.
    assert ticks(account(first, seen, last).seconds) == 20 + 3


def test_the_probe_sees_children_that_live_and_die_between_samples():
    burn = (
        "import os, time\n"
        "def burn(s):\n"
        "    t = time.process_time()\n"
        "    while time.process_time() - t < s: pass\n"
        "time.sleep(0.3)\n"
        "for _ in range(3):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        burn(0.1)\n"
        "        os._exit(0)\n"
        "    os.waitpid(pid, 0)\n"
        "print('done', flush=True)\n"
        "time.sleep(30)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", burn], stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.1)
        probe = CpuProbe({"group": [proc.pid]}, interval=60.0)  # no sample lands while the children live
        probe.start()
        assert proc.stdout.readline().strip() == "done"  # the three children burned and were reaped
        window = probe.stop()
    finally:
        proc.kill()
        proc.wait()
    usage = window.groups["group"]
    assert 0.25 <= usage.seconds <= 0.6
    assert usage.unreaped_exits == 0
    assert probe.window is window
    assert window.machine_busy_seconds is not None and window.machine_busy_seconds >= usage.seconds - 0.05


# -- finding the processes, on a fake /proc -------------------------------------------------------


def fake_process(proc: Path, pid: int, ppid: int, argv: list[str], cwd: Path) -> None:
    entry = proc / str(pid)
    entry.mkdir(parents=True)
    (entry / "stat").write_text(f"{pid} (x) S {ppid} 0 0 0 -1 0 0 0 0 0 1 1 0 0 20 0 1 0 100 0 0\n")
    (entry / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (entry / "cwd").symlink_to(cwd)


def test_make_run_processes_of_this_checkout_are_found_and_others_are_not(tmp_path):
    proc, repo, other = tmp_path / "proc", tmp_path / "repo", tmp_path / "other"
    repo.mkdir()
    other.mkdir()
    python, celery = "/venv/bin/python", "/venv/bin/celery"
    fake_process(proc, 100, 1, [python, "-m", "devstack.supervise"], repo)
    fake_process(proc, 101, 100, [python, "-m", "config.web", "--port", "8000"], repo)
    fake_process(proc, 102, 100, [python, celery, "-A", "config", "worker", "-c", "4"], repo)
    fake_process(proc, 103, 102, [python, celery, "-A", "config", "worker", "-c", "4"], repo)  # pool child
    fake_process(proc, 104, 100, [python, celery, "-A", "config", "beat"], repo)
    fake_process(proc, 200, 1, [python, "-m", "config.web", "--port", "8001"], other)
    assert platform_roots(repo, proc) == {"web": [101], "worker": [102]}


def test_postmaster_is_taken_from_its_pid_file_only_if_it_runs_in_that_data_directory(tmp_path):
    proc, data = tmp_path / "proc", tmp_path / "data"
    data.mkdir()
    (data / "postmaster.pid").write_text("300\n/data\n1700000000\n5433\n")
    fake_process(proc, 300, 1, ["/pg/bin/postgres", "-D", str(data)], data)
    assert postmaster_pid(data, proc) == 300
    (data / "postmaster.pid").write_text("301\n")  # stale: the pid now belongs to something else
    fake_process(proc, 301, 1, ["/usr/bin/vim"], tmp_path)
    assert postmaster_pid(data, proc) is None


def test_redis_is_found_by_the_port_in_its_title(tmp_path):
    proc = tmp_path / "proc"
    fake_process(proc, 400, 1, ["/bin/redis-server 127.0.0.1:6380        "], tmp_path)
    fake_process(proc, 401, 1, ["/bin/redis-server 127.0.0.1:6390        "], tmp_path)
    pidfile = tmp_path / "redis.pid"
    pidfile.write_text("400\n")
    assert redis_server_pid(6380, pidfile, proc) == 400
    assert redis_server_pid(6390, pidfile, proc) == 401  # the pid file names another server
    assert redis_server_pid(None, pidfile, proc) == 400
    assert redis_server_pid(6999, pidfile, proc) is None
