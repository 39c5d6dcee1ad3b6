"""The path of one RELIABLE message through a web node, measured: every module of the project it
enters, in order, from the moment its MESSAGE frame reaches the /ws consumer until its routing task
is handed to Celery (where a worker takes over).

    .venv/bin/python -m pytest bench/message_path.py -q -s -p no:cacheprovider

Runs the real consumer in-process (Channels' test communicator, real Postgres and Redis, the test
database: nothing of an operator's data) with a profiler on every thread. A module entry is a call
whose nearest calling frame of the project is in another module (a coroutine resumed counts once,
when first entered); the table lists them in order, then the distinct modules.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import sys
import threading
from pathlib import Path

import pytest
from channels.testing import WebsocketCommunicator

from foundation.asyncdb import pool_connections_close
from messaging.gateway.consumers import ClientConsumer
from tests.factories import make_app

ROOT = Path(__file__).resolve().parents[1]
RESUMABLE = inspect.CO_COROUTINE | inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR
PROJECT = [ROOT / "messaging", ROOT / "presence", ROOT / "apps_registry", ROOT / "analytics", ROOT / "platform"]


def _module(filename: str) -> str | None:
    path = Path(filename)
    for base in PROJECT:
        if base in path.parents:
            relative = path.relative_to(ROOT / "platform" if base.name == "platform" else ROOT)
            return ".".join(relative.with_suffix("").parts).removesuffix(".__init__")
    return None


class PathTracer:
    """Records module entries on every thread while `active`, until work is first handed to the
    workers: the hand-off's dispatcher (whichever the settings name: Celery's, or the test process's
    inline one) is called."""

    def __init__(self) -> None:
        self.active = False
        self.done = threading.Event()
        self.entries: list[tuple[str | None, str, str]] = []
        self._resumable: dict[int, object] = {}  # coroutine frames entered (held: their ids stay theirs)
        self._lock = threading.Lock()

    def __call__(self, frame, event, arg):
        if event != "call" or not self.active:
            return
        code = frame.f_code
        if code.co_name == "dispatch" and code.co_filename.endswith("handoff.py"):
            self.active = False
            self.done.set()
            return
        module = _module(code.co_filename)
        if module is None or self._resumable.get(id(frame)) is frame:
            return
        caller = frame.f_back
        while caller is not None and _module(caller.f_code.co_filename) is None:
            caller = caller.f_back
        caller_module = _module(caller.f_code.co_filename) if caller is not None else None
        with self._lock:
            if code.co_flags & RESUMABLE:
                self._resumable[id(frame)] = frame
            if caller_module != module:
                self.entries.append((caller_module, module, code.co_name))


@pytest.mark.django_db(transaction=True)
def test_the_path_of_a_reliable_message_through_a_web_node():
    make_app()
    tracer = PathTracer()
    threading.setprofile(tracer)  # threads started from now on (the node's database pool among them)
    sys.setprofile(tracer)
    try:
        asyncio.run(_send_one(tracer))
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
        pool_connections_close()  # the test database can be dropped
    modules = list(dict.fromkeys(module for _, module, _ in tracer.entries))
    print(f"\n{len(tracer.entries)} module entries across {len(modules)} modules, frame to routing task:")
    for caller, module, function in tracer.entries:
        print(f"  {caller or '(event loop / thread pool)'} -> {module}.{function}")
    print("modules:", ", ".join(modules))
    assert tracer.done.is_set()


async def _send_one(tracer: PathTracer) -> None:
    communicator = WebsocketCommunicator(ClientConsumer.as_asgi(), "/ws")
    connected, _ = await communicator.connect()
    assert connected
    await communicator.send_to(text_data=json.dumps(
        {"type": "AUTH_CLIENT", "data": {"appId": "app-id-343", "userId": "ANZ-7001", "token": ""}}))
    assert json.loads(await communicator.receive_from(5))["data"]["isAuthenticated"] is True
    await asyncio.sleep(1)  # what authentication does after its reply (presence, subscriptions) is done
    frame = json.dumps({"type": "MESSAGE", "data": {"to": "ANZ-7002", "content": "traced"}, "reference": "r"})
    tracer.active = True
    await communicator.send_to(text_data=frame)
    for _ in range(100):
        if tracer.done.is_set():
            break
        await asyncio.sleep(0.05)
    tracer.active = False
    await communicator.disconnect()
