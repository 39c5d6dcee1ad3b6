"""The selftest's run: start it with the operator API, make the checks in order, print one line
each with its latency, end the run (also on a failure or Ctrl-C), and say whether all passed.

    ok    reliable+confirmation        23 ms
    FAIL  fetch after offline        5002 ms  timed out after 5 s waiting for …
    skip  presence                      0 ms  app has no master

A check that needs an earlier one that failed is not made (`skip`, naming it); the exit status is
0 only when no check failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TextIO

import httpx

from messaging.selftest import checks
from messaging.selftest.checks import Run, answered
from messaging.selftest.wire import CheckFailed, CheckSkipped, HookListener

OK, FAIL, SKIP = "ok", "FAIL", "skip"
LABEL_WIDTH = 24


@dataclass(frozen=True)
class Check:
    label: str
    run: Callable[[Run], str | None]
    needs: tuple[str, ...] = ()


CHECKS = [
    Check("authenticate", checks.authenticate),
    Check("reliable+confirmation", checks.reliable_with_confirmation, ("authenticate",)),
    Check("fast", checks.fast, ("authenticate",)),
    Check("group", checks.group, ("authenticate",)),
    Check("fetch after offline", checks.fetch_after_offline, ("authenticate",)),
    Check("ack redelivery", checks.ack_redelivery, ("authenticate",)),
    Check("rest send+status", checks.rest_send_and_status, ("authenticate",)),
    Check("channel over /ws", checks.channel_over_ws, ("authenticate",)),
    Check("channel over sse", checks.channel_over_sse),
    Check("presence to master", checks.presence, ("authenticate",)),
    Check("webhook signature", checks.webhook_signature, ("authenticate",)),
]


@dataclass(frozen=True)
class Options:
    url: str
    key: str
    app: str | None = None
    timeout: float = 5.0
    webhook_listen: tuple[str, int] | None = None
    webhook_url: str | None = None


class Printer:
    def __init__(self, out: TextIO):
        self.out = out
        self.counts = {OK: 0, FAIL: 0, SKIP: 0}

    def line(self, outcome: str, label: str, ms: float, note: str = "") -> None:
        self.counts[outcome] += 1
        text = f"{outcome:<5} {label:<{LABEL_WIDTH}} {ms:>6.0f} ms"
        self.out.write(f"{text}  {note}".rstrip() + "\n")
        self.out.flush()

    def timed(self, label: str, step: Callable[[], str | None]) -> str:
        started = time.perf_counter()
        try:
            note, outcome = step() or "", OK
        except CheckSkipped as exc:
            note, outcome = str(exc), SKIP
        except CheckFailed as exc:
            note, outcome = str(exc), FAIL
        except Exception as exc:  # noqa: BLE001 (an unforeseen answer fails this check, not the run)
            note, outcome = f"{type(exc).__name__}: {exc}", FAIL
        self.line(outcome, label, (time.perf_counter() - started) * 1000, note)
        return outcome


def _start(api: httpx.Client, options: Options) -> dict:
    body = {"app": options.app or "", "webhook_url": options.webhook_url or ""}
    response = api.post("/api/v1/operator/selftest", json=body)
    if response.status_code != 201:
        try:
            error = response.json()
            raise CheckFailed(f"{response.status_code} {error.get('error')}: {error.get('detail')}")
        except ValueError:
            raise CheckFailed(f"{response.status_code}: {response.text[:200]}") from None
    return response.json()


def selftest_run(options: Options, out: TextIO) -> int:
    """Make every check against the deployment at `options.url`; 0 if none failed, else 1."""
    printer = Printer(out)
    base = options.url.rstrip("/")
    hooks = HookListener(*options.webhook_listen) if options.webhook_listen else None
    webhook_url = options.webhook_url
    if hooks is not None and not webhook_url:
        webhook_url = "http://{}:{}/selftest-hook".format(*hooks.address)
    options = replace(options, webhook_url=webhook_url)
    operator = httpx.Client(base_url=base, timeout=options.timeout,
                            headers={"Authorization": f"Bearer {options.key}"})
    grant: dict = {}
    run: Run | None = None
    try:
        where = f"on app {options.app}" if options.app else "on a throwaway app"
        out.write(f"selftest of {base} {where}\n")

        def start() -> str:
            grant.update(_start(operator, options))
            return f"{grant['name']} ({grant['domain']})"

        if printer.timed("start run", start) != OK:
            return _summary(printer, out)
        api = httpx.Client(base_url=base, timeout=options.timeout,
                           headers={"Authorization": f"Bearer {grant['api_key']}"})
        run = Run(base=base, timeout=options.timeout, grant=grant, api=api, hooks=hooks)
        outcomes: dict[str, str] = {}
        for check in CHECKS:
            failed = [need for need in check.needs if outcomes.get(need) != OK]
            if failed:
                outcomes[check.label] = SKIP
                printer.line(SKIP, check.label, 0, f"not made: {', '.join(failed)} failed")
                continue
            outcomes[check.label] = printer.timed(check.label, lambda c=check: c.run(run))
    finally:  # also on a failure and on Ctrl-C: whatever was set up goes
        if run is not None:
            run.close_all()
            run.api.close()
        if grant.get("name"):
            printer.timed("cleanup", lambda: _end(operator, grant["name"]))
        operator.close()
        if hooks is not None:
            hooks.close()
    return _summary(printer, out)


def _end(operator: httpx.Client, name: str) -> str:
    answered(operator.delete(f"/api/v1/operator/selftest/{name}"), 204)
    return f"{name} removed"


def _summary(printer: Printer, out: TextIO) -> int:
    counts = printer.counts
    total = sum(counts.values())
    verdict = "FAILED" if counts[FAIL] else "passed"
    out.write(f"{verdict}: {total} checks, {counts[OK]} ok, {counts[FAIL]} failed, {counts[SKIP]} skipped\n")
    out.flush()
    return 1 if counts[FAIL] else 0
