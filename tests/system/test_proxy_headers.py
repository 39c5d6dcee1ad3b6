"""Behind a trusted proxy that appends to X-Forwarded-For, a web node sees the client's real address
(the rightmost hop that is not a trusted proxy), whatever the client wrote into the header: the
metrics allow-list and the session record agree on it."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from tests.wsclient import WsClient, wait_for

pytestmark = [pytest.mark.system, pytest.mark.django_db]

CLIENT = "203.0.113.9"  # the address the proxy (this test, on 127.0.0.1) appends


def status(url: str, forwarded_for: str | None = None) -> int:
    request = urllib.request.Request(url, headers={"X-Forwarded-For": forwarded_for} if forwarded_for else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_client_spoofing_x_forwarded_for_through_a_trusted_proxy_is_seen_at_its_real_address(processes):
    from presence.models import Session

    node = processes.web("web", TRUSTED_PROXIES="127.0.0.1", METRICS_ALLOWED_IPS="127.0.0.1/32", METRICS_TOKEN="")
    assert status(f"{node.url}/metrics") == 200  # the proxy itself is on the allow-list
    # the client wrote "127.0.0.1" into the header; the proxy appended the address it saw
    assert status(f"{node.url}/metrics", f"127.0.0.1, {CLIENT}") == 403
    with WsClient(node.ws_url, additional_headers={"X-Forwarded-For": f"127.0.0.1, {CLIENT}"}) as client:
        client.auth("ANZ-11090")
        wait_for(lambda: Session.objects.filter(user_id="ANZ-11090").exists())
    assert Session.objects.get(user_id="ANZ-11090").remote_addr == CLIENT
