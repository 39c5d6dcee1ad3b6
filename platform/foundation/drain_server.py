"""The web node's drain, Twisted's side: daphne's Server, told to stop, lets its clients go first.

On the first SIGTERM (or SIGINT: `make run`'s Ctrl-C), in this order:
1. the process is marked draining (foundation.draining): /readyz answers 503, and a WebSocket or
   stream arriving on a connection accepted before is refused (1012, 503);
2. every listening port is closed: no new TCP connection is accepted;
3. the application's drain runs (messaging.gateway.drain, given as `drain`): sockets closed with 1012 and
   streams told to reconnect, spread over DRAIN_SECONDS, their ends settled, the batchers flushed,
   the Node deregistered;
4. the node waits for the requests still running (each HTTP or WebSocket application instance)
   and stops the reactor.

A second SIGTERM or SIGINT, or DRAIN_SECONDS + DRAIN_GRACE_SECONDS passing since the first, stops
the reactor at once: daphne cancels whatever application instance is still running. The process
exits 0 after a full drain, 1 when it was cut short.

Daphne's Server.run gives the reactor its signal handlers (SIGTERM and SIGINT would stop it at
once); this server runs it without them and installs its own, once the reactor runs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable

from daphne.server import Server
from twisted.internet import reactor

from foundation.draining import drain_begin, drain_bound, drain_window

log = logging.getLogger(__name__)
# Stopping the reactor cancels the applications and joins threads; should that itself hang, the
# process leaves anyway this long after a stop was asked for.
HARD_EXIT_SECONDS = 5.0

Drain = Callable[[float], Awaitable[str]]  # the window in seconds -> one line saying what it did


class DrainingServer(Server):
    drain: Drain | None = None  # the application's side (config.web gives messaging.gateway.drain's)

    def __init__(self, *args, **kwargs) -> None:
        kwargs["signal_handlers"] = False  # ours, installed when the reactor runs
        super().__init__(*args, **kwargs)
        self.ports: list = []
        self.exit_code = 0
        self._started_at: float | None = None
        self._stopping = False

    @classmethod
    def draining_with(cls, drain: Drain) -> type[DrainingServer]:
        return type(cls.__name__, (cls,), {"drain": staticmethod(drain)})

    def run(self) -> None:
        reactor.callWhenRunning(self._install_signal_handlers)
        super().run()

    def listen_success(self, port) -> None:
        self.ports.append(port)
        super().listen_success(port)

    def _install_signal_handlers(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame) -> None:
        # In the main thread, between two bytecodes of whatever runs: hand over to the reactor.
        reactor.callFromThread(self._signalled, signal.Signals(signum).name)

    def _signalled(self, name: str) -> None:
        if drain_begin():
            self._drain_start(name)
        else:
            self._stop(f"{name} again while draining: stopping at once")

    def _drain_start(self, name: str) -> None:
        self._started_at = time.monotonic()
        window, bound = drain_window(), drain_bound()
        for port in self.ports:
            port.stopListening()
        log.info("draining on %s: readyz 503, not accepting; closing sockets over %.1fs (cut at %.1fs)",
                    name, window, bound)
        reactor.callLater(bound, self._stop, f"drain cut short: {bound:.1f}s passed")
        asyncio.ensure_future(self._drain(window))

    async def _drain(self, window: float) -> None:
        try:
            if self.drain is not None:
                log.info("%s", await self.drain(window))
            await self._applications_done()
        except Exception:
            log.exception("draining failed; stopping")
            self.exit_code = 1
        if not self._stopping:
            log.info("drained in %.1fs", time.monotonic() - self._started_at)
            self._stop(None)

    async def _applications_done(self) -> None:
        """Wait for every request and socket still being served (the bound cuts this short)."""
        while any(not details["application_instance"].done() for details in list(self.connections.values())
                  if "application_instance" in details):
            await asyncio.sleep(0.05)

    def _stop(self, why: str | None) -> None:
        if self._stopping:
            return
        self._stopping = True
        if why is not None:
            log.warning("%s", why)
            self.exit_code = 1
        timer = threading.Timer(HARD_EXIT_SECONDS, os._exit, (self.exit_code or 1,))
        timer.daemon = True
        timer.start()
        if reactor.running:
            reactor.stop()
