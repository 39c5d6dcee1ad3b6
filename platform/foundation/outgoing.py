"""Calls the platform makes to other servers: addresses a tenant chose (webhook receivers, auth URLs),
and, without the address filter, the ones the operator configured (neighbouring domains, the meta
domain).

Three guarantees, whatever the other side does:

1. **A deadline for the whole exchange.** httpx's timeouts apply to each connect, read and write,
   so a receiver that answers one byte every 0.25 s never trips a 10 s read timeout. Here the whole
   exchange (address check, connect, TLS handshake, request, headers, body) runs on an event loop
   inside `asyncio.timeout(deadline)`: at the deadline the task is cancelled wherever it waits, and
   its connection is dropped. Sync callers (Celery workers) hand the call to this process's
   outgoing loop thread and wait for it.
2. **A size cap on the answer.** At most `max_bytes` of the body are read (raw, as sent: the caller
   asks for `Accept-Encoding: identity`, so no decompression multiplies what the peer sends);
   `Answer.complete` says whether that was all of it.
3. **An address filter.** Every address the host name resolves to is checked; one refused address
   refuses the host. Loopback, link-local, cloud metadata, unspecified, private and every other
   non-public address is refused unless it lies in OUTGOING_ALLOWED_NETWORKS (metadata addresses
   only when listed on their own). The connection is made to a checked address (the network
   backend below does the resolving, put under httpx's transport by foundation.patches.httpx), so
   DNS rebinding between check and connect is impossible; the URL's host name still goes into the
   Host header and TLS SNI, and the certificate is verified against it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
import threading
from collections.abc import Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import httpcore
import httpx
from django.conf import settings

from foundation.loop_local import loop_local
from foundation.patches.httpx import BackendTransport

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
# Cloud instance metadata (AWS, GCP, Azure, OpenStack on IPv4; AWS on IPv6): credentials live there.
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254"))
# What a sync caller waits beyond the deadline for the loop to report the cancelled call.
SYNC_GRACE_SECONDS = 5.0


class OutgoingError(Exception):
    """The call did not produce an answer; str() says why, in words fit for a log or an error column."""


class OutgoingRefused(OutgoingError):
    """The destination's address is not one the platform calls."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes  # at most the caller's max_bytes
    complete: bool  # False: the answer was longer than max_bytes and was cut off
    headers: dict[str, str] = field(default_factory=dict)  # lower-cased names (the last of a repeated one)


# --- the address filter ----------------------------------------------------------------------------


@lru_cache(maxsize=8)
def networks_parse(values: tuple[str, ...]) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(v, strict=False) for v in values)


def allowed_networks() -> tuple[IPNetwork, ...]:
    return networks_parse(tuple(settings.OUTGOING_ALLOWED_NETWORKS))


def address_refusal(address: str | IPAddress, allowed: Sequence[IPNetwork] = ()) -> str | None:
    """Why this address is not called (None: it may be)."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address):
        ip = ip.ipv4_mapped or ip  # ::ffff:127.0.0.1 is 127.0.0.1
        ip = ipaddress.ip_address(str(ip).split("%", 1)[0])  # a link-local scope is no part of the check
    if ip in METADATA_ADDRESSES:
        # A broad allowed network (10.0.0.0/8, 169.254.0.0/16) never opens the metadata service by accident.
        if any(net.num_addresses == 1 and ip in net for net in allowed):
            return None
        return f"{ip} is a cloud metadata address"
    if any(ip.version == net.version and ip in net for net in allowed):
        return None
    for kind, test in (("unspecified", ip.is_unspecified), ("loopback", ip.is_loopback),
                       ("link-local", ip.is_link_local), ("multicast", ip.is_multicast),
                       ("private", ip.is_private), ("non-public", not ip.is_global)):
        if test:
            return f"{ip} is a {kind} address (not in OUTGOING_ALLOWED_NETWORKS)"
    return None


async def host_resolve_checked(host: str, port: int) -> list[str]:
    """Every address `host` resolves to, all of them allowed; OutgoingRefused when any is not."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise OutgoingError(f"cannot resolve {host}: {exc}") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    allowed = allowed_networks()
    for address in addresses:
        reason = address_refusal(address, allowed)
        if reason:
            raise OutgoingRefused(f"refused: {host} resolves to {reason}")
    if not addresses:
        raise OutgoingError(f"cannot resolve {host}")
    return addresses


class _CheckedBackend(httpcore.AsyncNetworkBackend):
    """httpcore asks its network backend to connect to the URL's host; this one resolves the name
    itself, checks every address and connects only to a checked one (the TLS layer above still uses
    the host name for SNI and the certificate)."""

    def __init__(self) -> None:
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None) -> httpcore.AsyncNetworkStream:
        error: Exception | None = None
        for address in await host_resolve_checked(host, port):
            try:
                return await self._inner.connect_tcp(address, port, timeout=timeout, local_address=local_address,
                                                     socket_options=socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                error = exc
        assert error is not None
        raise error

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None) -> httpcore.AsyncNetworkStream:
        raise OutgoingRefused("refused: unix sockets are not called")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def outgoing_client(name: str, *, max_connections: int, max_keepalive: int, checked: bool = True) -> httpx.AsyncClient:
    """One client (and connection pool) per event loop and purpose: building one loads the CA
    bundle, far too slow to do per call. Never follows redirects, ignores proxy variables (a proxy
    would connect to addresses nobody checked).

    `checked=False` skips the address filter, for addresses the operator configured (the
    neighbouring domains of the network, which are usually on private networks); the deadline and
    the answer cap hold all the same."""
    def make() -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_keepalive)
        transport = (BackendTransport(limits, _CheckedBackend()) if checked else
                     httpx.AsyncHTTPTransport(verify=httpx.create_ssl_context(), limits=limits, trust_env=False))
        return httpx.AsyncClient(transport=transport, follow_redirects=False, trust_env=False)

    return loop_local(("outgoing", name), make)


# --- one call ------------------------------------------------------------------------------------


async def outgoing_post(client: httpx.AsyncClient, url: str, *, content: bytes, headers: dict[str, str],
                        deadline: float, max_bytes: int) -> Answer:
    """POST and read at most `max_bytes` of the answer, all within `deadline` seconds. Raises
    OutgoingError (OutgoingRefused for a refused address) when there is no answer."""
    return await outgoing_request(client, "POST", url, content=content, headers=headers, deadline=deadline,
                                  max_bytes=max_bytes)


async def outgoing_request(client: httpx.AsyncClient, method: str, url: str, *, content: bytes = b"",
                           headers: dict[str, str], deadline: float, max_bytes: int) -> Answer:
    """One request, its answer read up to `max_bytes`, the whole exchange within `deadline` seconds."""
    headers = {**headers, "Accept-Encoding": "identity"}
    try:
        async with asyncio.timeout(deadline):
            async with client.stream(method, url, content=content, headers=headers, timeout=deadline) as response:
                answered = {name.lower(): value for name, value in response.headers.items()}
                body = bytearray()
                async for chunk in response.aiter_raw():
                    body += chunk
                    if len(body) > max_bytes:
                        return Answer(response.status_code, bytes(body[:max_bytes]), complete=False, headers=answered)
                return Answer(response.status_code, bytes(body), complete=True, headers=answered)
    except (TimeoutError, httpx.TimeoutException):
        raise OutgoingError(f"no answer within {deadline:g} s") from None
    except OutgoingError:
        raise
    except (httpx.HTTPError, httpx.InvalidURL, OSError) as exc:
        raise OutgoingError(f"{type(exc).__name__}: {exc}"[:500]) from None


# --- from sync code (workers) ----------------------------------------------------------------------


class _LoopThread:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="outgoing-loop", daemon=True).start()


_loop: _LoopThread | None = None
_loop_lock = threading.Lock()


def run_outgoing(coro: Coroutine[Any, Any, Any], deadline: float) -> Any:
    """Run an outgoing call from sync code on this process's outgoing loop (one per process: a
    forked pool child starts its own). The call's own deadline ends it; the grace only covers the
    loop reporting back."""
    global _loop
    with _loop_lock:
        if _loop is None or _loop.pid != os.getpid():
            _loop = _LoopThread()
        loop = _loop.loop
    future = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return future.result(deadline + SYNC_GRACE_SECONDS)
    except TimeoutError:
        future.cancel()
        raise OutgoingError(f"no answer within {deadline:g} s") from None
