"""Calls the platform makes to other servers: addresses a tenant chose (webhook receivers, auth URLs),
and, without the address filter, the ones the operator configured (neighbouring domains, the meta
domain).

Three guarantees, whatever the other side does:

1. **A deadline for the whole exchange.** A timeout per connect, read and write (what HTTP clients
   give) lets a receiver that answers one byte every 0.25 s never trip a 10 s read timeout. Here the whole
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
   only when listed on their own). The connection is made to a checked address (the pool's
   connector below does the resolving: foundation.http1 never resolves a name itself), so DNS
   rebinding between check and connect is impossible; the URL's host name still goes into the
   Host header and TLS SNI, and the certificate is verified against it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
import ssl
import threading
from collections.abc import Coroutine, Sequence
from functools import lru_cache
from typing import Any

import certifi
from django.conf import settings

from foundation.http1 import Answer, Http1Pool, HttpError  # (Answer: what every caller imports from here)
from foundation.loop_local import loop_local

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
# Cloud instance metadata (AWS, GCP, Azure, OpenStack on IPv4; AWS on IPv6): credentials live there.
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254"))
USER_AGENT = "Switchboard/1"  # (a caller's own User-Agent, a webhook's, replaces it)
# What a sync caller waits beyond the deadline for the loop to report the cancelled call.
SYNC_GRACE_SECONDS = 5.0


class OutgoingError(Exception):
    """The call did not produce an answer; str() says why, in words fit for a log or an error column."""


class OutgoingRefused(OutgoingError):
    """The destination's address is not one the platform calls."""


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


async def _connect_checked(host: str, port: int, tls: ssl.SSLContext | None) -> tuple[Any, Any]:
    """Resolve `host` here, check every address, and connect only to a checked one (TLS still
    names the host: SNI, and the certificate verified against it)."""
    error: OSError | None = None
    for address in await host_resolve_checked(host, port):
        try:
            return await asyncio.open_connection(address, port, ssl=tls, server_hostname=host if tls else None)
        except ssl.SSLError:
            raise
        except OSError as exc:
            error = exc
    assert error is not None
    raise error


async def _connect_configured(host: str, port: int, tls: ssl.SSLContext | None) -> tuple[Any, Any]:
    return await asyncio.open_connection(host, port, ssl=tls, server_hostname=host if tls else None)


def _tls_context() -> ssl.SSLContext:
    """Certificates verified against certifi's CA bundle (as the platform's calls always were)."""
    return ssl.create_default_context(cafile=certifi.where())


def outgoing_client(name: str, *, max_connections: int, max_keepalive: int, checked: bool = True) -> Http1Pool:
    """One connection pool per event loop and purpose (foundation.http1). Never follows redirects,
    ignores proxy variables (a proxy would connect to addresses nobody checked).

    `checked=False` skips the address filter, for addresses the operator configured (the
    neighbouring domains of the network, which are usually on private networks); the deadline and
    the answer cap hold all the same."""
    def make() -> Http1Pool:
        return Http1Pool(_connect_checked if checked else _connect_configured, max_connections=max_connections,
                         max_keepalive=max_keepalive, ssl_context=_tls_context, user_agent=USER_AGENT)

    return loop_local(("outgoing", name), make)


# --- one call ------------------------------------------------------------------------------------


async def outgoing_post(client: Http1Pool, url: str, *, content: bytes, headers: dict[str, str],
                        deadline: float, max_bytes: int) -> Answer:
    """POST and read at most `max_bytes` of the answer, all within `deadline` seconds. Raises
    OutgoingError (OutgoingRefused for a refused address) when there is no answer."""
    return await outgoing_request(client, "POST", url, content=content, headers=headers, deadline=deadline,
                                  max_bytes=max_bytes)


async def outgoing_request(client: Http1Pool, method: str, url: str, *, content: bytes = b"",
                           headers: dict[str, str], deadline: float, max_bytes: int) -> Answer:
    """One request, its answer read up to `max_bytes`, the whole exchange within `deadline` seconds."""
    headers = {**headers, "Accept-Encoding": "identity"}
    try:
        async with asyncio.timeout(deadline):
            return await client.request(method, url, content=content, headers=headers, max_bytes=max_bytes)
    except TimeoutError:
        raise OutgoingError(f"no answer within {deadline:g} s") from None
    except OutgoingError:
        raise
    except (HttpError, OSError) as exc:
        raise OutgoingError(str(exc)[:500] or type(exc).__name__) from None


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
