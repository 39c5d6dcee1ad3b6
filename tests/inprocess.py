"""A web node and a worker in the test process, for tests of `/ws` behaviour that does not depend on
daphne (tests/processes.py starts real ones for what does: frames on the wire, drains, kills).

- The node is the project's own ASGI application (config.asgi) on an event loop of its own, in a
  thread: the same consumers, the same consumer loop (messaging.gateway.connection.inbox serves a
  communicator's events the way it serves daphne's), the same node runtime with its batchers and
  heartbeat, on the real Redis channel layer and presence cache and the test database.
- A client is Channels' WebsocketCommunicator on that loop, behind the synchronous API of
  tests/wsclient.WsClient, so a test reads the same whichever node it talks to.
- The worker is the hand-off's inline dispatcher (foundation.handoff) pumped continuously by a
  thread of its own: what the node hands over runs through the task functions a Celery worker
  runs, on a database connection of its own.

The node and the worker read what is committed: the tests use the module's committed demo tenant
(`demo_network`), as with real processes.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Coroutine
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator
from django.db import connection

from foundation.handoff import InlineDispatcher, dispatcher
from messaging.gateway.runtime import runtime
from tests.wsclient import FrameReader


class NodeLoop:
    """An event loop running in a thread of its own: the node's."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="inprocess-node", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        """The node stops: every task on its loop (the heartbeat, the batchers, the hub) is cancelled."""
        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.run(cancel_all())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class Closed(Exception):
    """The node closed the connection; `code` is its close code."""

    def __init__(self, code: int | None):
        super().__init__(f"closed with {code}")
        self.code = code


class InProcessClient(FrameReader):
    """tests/wsclient.WsClient's API over a WebsocketCommunicator on the node's loop."""

    def __init__(self, node: InProcessNode, path: str = "/ws", headers: list[tuple[bytes, bytes]] | None = None):
        from config.asgi import application  # the node's application, built once the apps are loaded

        self.node = node
        self.frames: list[dict] = []
        self.close_code: int | None = None

        async def open_() -> WebsocketCommunicator:
            communicator = WebsocketCommunicator(application, path, headers=headers or [])
            communicator.scope["client"] = ("127.0.0.1", 40000)
            connected, _ = await communicator.connect(timeout=10)
            assert connected, "the node refused the WebSocket"
            return communicator

        self.communicator = node.loop.run(open_())

    def send_raw(self, text: str) -> None:
        self.node.loop.run(self.communicator.send_to(text_data=text))

    def recv(self, timeout: float = 10) -> dict:
        if self.close_code is not None:
            raise Closed(self.close_code)

        async def output() -> dict:
            # Not receive_output(timeout): on a timeout it cancels the application, and a quiet
            # socket is no reason for a connection to end.
            communicator = self.communicator
            if communicator.future.done() and communicator.output_queue.empty():
                communicator.future.result()  # the consumer's own error, if it failed
                return {"type": "websocket.close", "code": None}
            message = await asyncio.wait_for(communicator.output_queue.get(), timeout)
            if message["type"] == "websocket.close":
                # The close handshake completes, and the server tells the consumer its connection
                # ended, as daphne does.
                await communicator.send_input({"type": "websocket.disconnect", "code": message.get("code", 1000)})
            return message

        try:
            message = self.node.loop.run(output(), timeout + 5)
        except TimeoutError:
            raise TimeoutError(f"no frame within {timeout}s") from None
        if message["type"] == "websocket.close":
            self.close_code = message.get("code", 1000)
            raise Closed(self.close_code)
        frame = json.loads(message["text"])
        self.frames.append(frame)
        return frame

    def wait_closed(self, timeout: float = 10) -> int | None:
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                self.recv(timeout=deadline - time.monotonic())
        except Closed as closed:
            return closed.code
        except TimeoutError:
            pass
        raise TimeoutError("socket still open")

    def close(self, code: int = 1000) -> None:
        """The client goes: what daphne tells the consumer once a client has closed its socket."""
        async def gone() -> None:
            await self.communicator.send_input({"type": "websocket.disconnect", "code": code})
            await self.communicator.wait(timeout=10)

        try:
            self.node.loop.run(gone(), 15)
        except Exception:  # noqa: BLE001  (the consumer may have ended already: nothing left to close)
            pass

    def __enter__(self) -> InProcessClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Worker:
    """Pumps whatever the hand-off dispatcher of the moment has waiting, as a Celery worker would,
    until stopped."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, name="inprocess-worker", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stopping.is_set():
                current = dispatcher()
                ran = current.pump() if isinstance(current, InlineDispatcher) else []
                if not ran:
                    self.stopping.wait(0.01)
        except BaseException as exc:  # noqa: BLE001  (kept for the fixture to report)
            self.errors.append(exc)
        finally:
            connection.close()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(10)


class InProcessNode:
    def __init__(self) -> None:
        self.loop = NodeLoop()
        self.clients: list[InProcessClient] = []

    def client(self, path: str = "/ws", headers: list[tuple[bytes, bytes]] | None = None) -> InProcessClient:
        client = InProcessClient(self, path, headers)
        self.clients.append(client)
        return client

    def quiesce(self, timeout: float = 10) -> None:
        """Every client gone and its end run (presence, session rows, what it held given back), and
        every batcher flushed: nothing of one module's connections is left for the next tests."""
        for client in self.clients:
            client.close()
        self.clients.clear()

        async def ended() -> None:
            node = runtime()
            deadline = time.monotonic() + timeout
            while (node.connections or node.drainable) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            if node.started:
                await node.batchers_flushed()

        self.loop.run(ended(), timeout + 5)


@pytest.fixture(scope="session")
def inprocess_node(django_db_setup, django_db_blocker):
    """The process's one in-process web node (the node runtime is the process's own), stopped at the
    end of the session."""
    node = InProcessNode()
    yield node
    with django_db_blocker.unblock():
        node.loop.stop()


@pytest.fixture(scope="module")
def inprocess(inprocess_node, demo_network, django_db_blocker):
    """A web node and a worker in this process (the module docstring), on the committed demo tenant."""
    with django_db_blocker.unblock():
        if runtime().started:
            # The last module's tenant, and this node's Node row with it, are gone: a new life.
            inprocess_node.loop.run(runtime().join())
        worker = Worker()
        try:
            yield inprocess_node
        finally:
            inprocess_node.quiesce()
            worker.stop()
    assert worker.errors == [], worker.errors
