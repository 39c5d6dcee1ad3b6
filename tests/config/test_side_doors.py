"""No side doors (issue 43): the product reaches Celery, takes a "one at a time" lock and waits
before a retry each through one module.

- work is handed to the workers through foundation.handoff's dispatcher only: no other module calls
  Celery's `send_task`, `apply_async` or `.delay(`;
- every lock is foundation.locks': no advisory-lock SQL and no Redis lease (redis-py's `.lock(`,
  SETNX, SET with NX) anywhere else. SET NX marks that hold nothing (DEDUPE_MARKS) stay where they are
  used, each saying so there;
- every retry wait is foundation.backoff's `Backoff`: no exponential wait written by hand (2 ** n,
  x ** attempts, 1 << n, a doubling capped by min(), SQL's power(2, ...)).

The product is what tests/config/test_layers.py walks, less the development machinery (devstack,
which imports nothing of the product: its restart waits are its own).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.config.test_layers import MODULES, PRODUCT

HANDOFF_MODULE = "foundation.handoff"
LOCK_MODULE = "foundation.locks"
BACKOFF_MODULE = "foundation.backoff"
CELERY_HAND_OFFS = {"send_task", "apply_async", "delay"}
# SET NX used as a mark, not a lock: nothing is held, nothing released (each says so where it is set).
DEDUPE_MARKS = {
    "foundation.handoff": "a link sender's wake-up on its way: one task per mark; the sender it wakes "
                          "takes its own lock (foundation.locks)",
    "foundation.signed_calls": "a signed call's nonce: a replay is refused; nothing is held",
}
ADVISORY_SQL = re.compile(r"pg_(try_)?advisory|locktype\s*=\s*'advisory'", re.IGNORECASE)
LUA_NX = re.compile(r"\bNX\b")
SQL_POWER_OF_TWO = re.compile(r"\bpower\(\s*2\b", re.IGNORECASE)
COUNTS_FAILURES = re.compile(r"attempt|fail|retr|tries|restart", re.IGNORECASE)

PRODUCT_MODULES = {name: path for name, path in MODULES.items() if name.split(".")[0] in PRODUCT}


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _strings(tree: ast.AST) -> list[ast.Constant]:
    """Every string constant but the docstrings (prose may name what the code must not do)."""
    docs = _docstrings(tree)
    return [node for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs]


def _called(node: ast.AST) -> str:
    """The name a call calls (`x.y.send_task(...)` -> send_task, `min(...)` -> min)."""
    func = node.func if isinstance(node, ast.Call) else None
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _name(node: ast.AST) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def _two(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in (2, 2.0) and not isinstance(node.value, bool)


def celery_hand_offs(source: str) -> list[str]:
    """Calls that hand work to Celery directly."""
    return [f"{node.lineno}: .{_called(node)}(" for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CELERY_HAND_OFFS]


def locks_taken(source: str) -> list[tuple[str, str]]:
    """(kind, where) of every advisory-lock statement and Redis lease; kind "mark" for a SET with NX
    (a lease, or a dedupe mark where DEDUPE_MARKS says so)."""
    tree = ast.parse(source)
    found = [("advisory", f"{node.lineno}: {node.value.strip()[:60]}") for node in _strings(tree)
             if ADVISORY_SQL.search(node.value)]
    found += [("lease", f"{node.lineno}: NX in {node.value.strip()[:60]!r}") for node in _strings(tree)
              if LUA_NX.search(node.value)]
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        if node.func.attr in ("lock", "setnx"):
            found.append(("lease", f"{node.lineno}: .{node.func.attr}("))
        elif node.func.attr == "set" and any(kw.arg == "nx" and not (isinstance(kw.value, ast.Constant)
                                                                      and kw.value.value is False)
                                             for kw in node.keywords):
            found.append(("mark", f"{node.lineno}: .set(..., nx=...)"))
    return found


def exponential_waits(source: str) -> list[str]:
    """Waits that grow by hand: 2 ** n, x ** <a count of failures>, 1 << n, pow(2, n), a doubling
    capped by min(...) or `*= 2`, and SQL's power(2, ...)."""
    tree = ast.parse(source)
    found = [f"{node.lineno}: {node.value.strip()[:60]}" for node in _strings(tree) if SQL_POWER_OF_TWO.search(node.value)]
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            if (_two(node.left) and not isinstance(node.right, ast.Constant)) or COUNTS_FAILURES.search(
                    ast.unparse(node.right)):
                found.append(f"{line}: {ast.unparse(node)}")
        elif (isinstance(node, ast.BinOp) and isinstance(node.op, ast.LShift) and isinstance(node.left, ast.Constant)
              and node.left.value == 1 and not isinstance(node.right, ast.Constant)):
            found.append(f"{line}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and _called(node) == "pow" and node.args and _two(node.args[0]):
            found.append(f"{line}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and _called(node) == "min" and any(
                isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Mult) and (_two(arg.left) or _two(arg.right))
                for arg in node.args):
            found.append(f"{line}: {ast.unparse(node)}")
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Mult) and _two(node.value):
            found.append(f"{line}: {ast.unparse(node)}")
    return found


def _source(path: Path) -> str:
    return path.read_text()


# --- the product ----------------------------------------------------------------------------------


def test_no_product_module_hands_work_to_celery_but_the_door_of_foundation_handoff():
    offenders = [f"{module}:{where}" for module, path in PRODUCT_MODULES.items() if module != HANDOFF_MODULE
                 for where in celery_hand_offs(_source(path))]
    assert offenders == []
    assert celery_hand_offs(_source(PRODUCT_MODULES[HANDOFF_MODULE]))  # (the door itself does)


def test_no_advisory_lock_or_redis_lease_outside_the_lock_module():
    offenders = [f"{module}:{where}" for module, path in PRODUCT_MODULES.items() if module != LOCK_MODULE
                 for kind, where in locks_taken(_source(path)) if not (kind == "mark" and module in DEDUPE_MARKS)]
    assert offenders == []
    assert {kind for kind, _ in locks_taken(_source(PRODUCT_MODULES[LOCK_MODULE]))} == {"advisory", "lease"}


@pytest.mark.parametrize("module", sorted(DEDUPE_MARKS))
def test_each_set_nx_left_outside_the_lock_module_is_a_mark_that_says_it_is_not_a_lock(module):
    source = _source(PRODUCT_MODULES[module])
    assert [kind for kind, _ in locks_taken(source)] == ["mark"]
    assert "a dedupe mark, not a lock" in source


def test_no_exponential_wait_is_written_outside_backoff():
    offenders = [f"{module}:{where}" for module, path in PRODUCT_MODULES.items() if module != BACKOFF_MODULE
                 for where in exponential_waits(_source(path))]
    assert offenders == []
    assert len(exponential_waits(_source(PRODUCT_MODULES[BACKOFF_MODULE]))) == 2  # in Python and in SQL


# --- the finders find (probes) --------------------------------------------------------------------


def test_a_task_sent_to_celery_directly_is_found():
    probe = ("from celery import current_app\n"
             "def later(run):\n"
             "    current_app.send_task('analytics.tasks.export_run', kwargs={'job_run_id': run})\n"
             "    export_run.delay(run)\n"
             "    export_run.apply_async(args=[run], countdown=5)\n")
    assert celery_hand_offs(probe) == ["3: .send_task(", "4: .delay(", "5: .apply_async("]
    assert celery_hand_offs("handoff.task_enqueue('analytics.tasks.export_run', [7])\nasyncio.sleep(delay)\n") == []


def test_an_advisory_lock_or_a_redis_lease_is_found_and_a_docstring_that_names_one_is_not():
    probe = ('"""One export at a time (a Postgres advisory lock, with SET NX)."""\n'
             'def f(cur, redis):\n'
             '    cur.execute("SELECT pg_advisory_xact_lock(%s)", [1])\n'
             '    cur.execute(f"SELECT pg_try_advisory_lock({key})")\n'
             '    lock = redis.lock("sb:lock:x", timeout=60, blocking=False)\n'
             '    redis.set("sb:lease:x", b"1", nx=True, px=60000)\n'
             '    redis.setnx("sb:lease:y", b"1")\n'
             '    SCRIPT = "return redis.call(\'SET\', KEYS[1], ARGV[1], \'NX\', \'PX\', ARGV[2])"\n'
             '    redis.set("sb:plain", b"1", nx=False)\n')
    assert [(kind, where.split(":")[0]) for kind, where in locks_taken(probe)] == [
        ("advisory", "3"), ("advisory", "4"), ("lease", "8"), ("lease", "5"), ("mark", "6"), ("lease", "7")]


def test_an_exponential_wait_written_by_hand_is_found_and_backoff_or_a_plain_product_is_not():
    probe = ("def f(attempt, failures, delay, n):\n"
             "    time.sleep(min(30.0, 0.2 * 2**attempt))\n"
             "    wait = min(5.0, 0.25 * 2 ** (failures - 1))\n"
             "    delay = min(delay * 2, 5.0)\n"
             "    delay *= 2\n"
             "    countdown = 1.5 ** self.request.retries\n"
             "    later = 1 << n\n"
             "    sql = 'make_interval(secs => 2 * power(2, d.attempts))'\n"
             "    wait = math.pow(2, n)\n")
    assert sorted(int(where.split(":")[0]) for where in exponential_waits(probe)) == [2, 3, 4, 5, 6, 7, 8, 9]
    fine = ("def f(attempt, size):\n"
            "    time.sleep(CONNECTION_RETRY.seconds(attempt))\n"
            "    magnitude = 10 ** math.floor(math.log10(size))\n"
            "    hint = max(0.05, last_flush * 2)\n"
            "    deadline = settings.FORWARD_TIMEOUT_SECONDS * 2\n"
            "    largest = 2 ** 63 - 1\n")
    assert exponential_waits(fine) == []
