"""Who the client is behind a reverse proxy: the one place proxy headers are believed.

A proxy *appends* the address it received a connection from to `X-Forwarded-For`; whatever stands to
the left of that came from further out, and a client can write anything there. So the client is the
**rightmost** hop that is not one of TRUSTED_PROXIES, found by walking from the right:

- the peer (the socket's address) must itself be a trusted proxy, or no header counts at all;
- each hop that is a trusted proxy is skipped; the first that is not is the client;
- a hop that is not an address (`unknown`, garbage) ends the walk: the client is the trusted hop
  to its right, the last one that can be vouched for;
- when every hop is a trusted proxy, the leftmost one is the client.

`X-Forwarded-Proto` (http or https) is believed from a trusted peer only, like the address; when a
proxy appended to a client's value the rightmost value is the proxy's. foundation.patches.daphne
applies this to every HTTP request and WebSocket before the application sees it, so `scope["client"]`
(Django's REMOTE_ADDR) and `scope["scheme"]` (request.is_secure()) are what the admin login throttle,
the metrics allow-list, the stream caps and the rate limits all read.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence

from django.conf import settings

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

FORWARDED_FOR = b"x-forwarded-for"
FORWARDED_PROTO = b"x-forwarded-proto"
SCHEMES = ("http", "https")


def trusted_networks(entries: Iterable[str] | None = None) -> list[Network]:
    """TRUSTED_PROXIES (or `entries`) as networks; a bare address is a network of one."""
    names = getattr(settings, "TRUSTED_PROXIES", []) if entries is None else entries
    return [ipaddress.ip_network(n, strict=False) for n in names]


def hop_address(hop: str) -> Address | None:
    """The address in one X-Forwarded-For hop (`1.2.3.4`, `1.2.3.4:5678`, `[::1]:80`, `::1`), or None."""
    hop = hop.strip()
    if hop.startswith("[") and "]" in hop:
        hop = hop[1:hop.index("]")]
    elif hop.count(":") == 1:
        hop = hop.split(":", 1)[0]
    try:
        return ipaddress.ip_address(hop)
    except ValueError:
        return None


def _trusted(addr: Address | None, networks: Sequence[Network]) -> bool:
    return addr is not None and any(addr in net for net in networks)


def peer_trusted(peer: Sequence | None, networks: Sequence[Network]) -> bool:
    """Whether the socket's peer (`[host, port]`) is a trusted proxy."""
    return bool(peer) and _trusted(hop_address(str(peer[0])), networks)


def _header_values(headers: Mapping, name: bytes) -> list[str]:
    """Every value of a header, in order, from daphne's headers (a Twisted `Headers` or a dict)."""
    if hasattr(headers, "getRawHeaders"):
        raw = headers.getRawHeaders(name) or []
    else:
        found = next((v for k, v in headers.items() if k.lower() == name), None)
        raw = [] if found is None else found if isinstance(found, list) else [found]
    return [v.decode("latin-1") if isinstance(v, bytes) else str(v) for v in raw]


def forwarded_client(peer: list | None, hops: Sequence[str], networks: Sequence[Network]) -> list | None:
    """The client's `[host, port]` given the peer and the X-Forwarded-For hops (see the module doc)."""
    if not hops or not peer_trusted(peer, networks):
        return peer
    client = peer
    for hop in reversed(hops):
        addr = hop_address(hop)
        if addr is None:
            return client
        client = [str(addr), 0]
        if not _trusted(addr, networks):
            return client
    return client


def forwarded_scheme(peer: list | None, values: Sequence[str], scheme: str | None,
                     networks: Sequence[Network]) -> str | None:
    """The scheme a trusted proxy says the client used; otherwise the socket's own."""
    if not values or not peer_trusted(peer, networks):
        return scheme
    said = values[-1].split(",")[-1].strip().lower()
    return said if said in SCHEMES else scheme


def client_from_headers(headers: Mapping, peer: list | None, scheme: str | None,
                        networks: Sequence[Network]) -> tuple[list | None, str | None]:
    """(client address, scheme) of a request whose socket peer is `peer`, from its raw headers."""
    hops = [hop for value in _header_values(headers, FORWARDED_FOR) for hop in value.split(",") if hop.strip()]
    return (forwarded_client(peer, hops, networks),
            forwarded_scheme(peer, _header_values(headers, FORWARDED_PROTO), scheme, networks))
