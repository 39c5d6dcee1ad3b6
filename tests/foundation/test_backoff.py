"""The one retry wait (foundation.backoff): in Python and in SQL, the same."""

from __future__ import annotations

import pytest
from django.db import connection

from foundation.backoff import Backoff


def test_the_backoff_doubles_from_its_base_up_to_its_cap_less_its_jitter():
    backoff = Backoff(base=2, cap=60, jitter=0.5)
    for failures, full in [(1, 2), (2, 4), (3, 8), (5, 32), (6, 60), (40, 60), (10_000, 60)]:
        samples = [backoff.seconds(failures) for _ in range(200)]
        assert full * 0.5 <= min(samples) and max(samples) <= full
        assert max(samples) - min(samples) > full * 0.2
    assert [Backoff(2, 900, jitter=0).seconds(n) for n in (1, 2, 3, 12)] == [2, 4, 8, 900]


@pytest.mark.django_db
def test_the_backoff_in_sql_waits_as_long_as_in_python():
    backoff = Backoff(base=2, cap=60, jitter=0.5)
    with connection.cursor() as cur:
        for failures, full in [(1, 2), (3, 8), (6, 60), (100_000, 60)]:
            cur.execute(f"SELECT extract(epoch FROM {backoff.sql('%s')}) FROM generate_series(1, 200)", [failures])
            waits = [float(w) for (w,) in cur.fetchall()]
            assert full * 0.5 <= min(waits) and max(waits) <= full and max(waits) - min(waits) > full * 0.2


def test_a_wait_that_does_not_grow_is_a_backoff_whose_cap_is_its_base():
    assert [Backoff(15.0, 15.0, jitter=0).seconds(n) for n in (1, 2, 40)] == [15.0, 15.0, 15.0]


def test_the_backoff_imports_nothing_of_django():
    """Pure Python, as the client package's copy of it (switchboard_client.backoff) is."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", "import sys, foundation.backoff; "
                             "assert not any(m.split('.')[0] == 'django' for m in sys.modules)"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
