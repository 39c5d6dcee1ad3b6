"""An app entry's `endpoints` in the config YAML: request endpoints imported, kept in step with the
file, exported back, and refused with the entry named when they are wrong."""

from __future__ import annotations

import pytest
import yaml

from apps_registry.config_io import ConfigError, config_export, config_import
from apps_registry.models import RequestEndpoint

pytestmark = pytest.mark.django_db

FILE = """
domains: [{name: domain-01, urls: ["http://127.0.0.1:8000"]}]
clientApps:
  - appName: ORD
    appId: app-id-ord
    masterUserId: ORD-1
    userDistributions: [{domainName: domain-01, from: 0}]
    endpoints:
%s
"""


def _file(*endpoints: str) -> str:
    return FILE % "\n".join(f"      - {e}" for e in endpoints)


def test_endpoints_are_imported_and_a_new_webhooks_secret_is_shown_once():
    summary = config_import(text=_file("{name: orders.place, stream: true, timeoutMs: 5000}",
                                       "{name: orders.quote, webhook: 'https://shop.example/hooks/quote'}"))
    place, quote = RequestEndpoint.objects.order_by("name")
    assert (place.name, place.stream, place.webhook_url, place.timeout_ms) == ("orders.place", True, "", 5000)
    assert quote.webhook_url == "https://shop.example/hooks/quote" and quote.stream is False
    assert summary.created["endpoints"] == 2
    assert summary.endpoint_secrets == [("ORD", "orders.quote", quote.webhook_secret)]
    again = config_import(text=_file("{name: orders.place, stream: true, timeoutMs: 5000}",
                                     "{name: orders.quote, webhook: 'https://shop.example/hooks/quote'}"))
    assert (again.created["endpoints"], again.updated["endpoints"], again.endpoint_secrets) == (0, 0, [])
    assert RequestEndpoint.objects.get(name="orders.quote").webhook_secret == quote.webhook_secret  # kept


def test_the_apps_endpoints_become_exactly_the_files_and_export_round_trips():
    config_import(text=_file("{name: a.one, stream: true}", "{name: a.two, stream: true}"))
    config_import(text=_file("{name: a.two, stream: true, maxInFlightPerUser: 4}"))
    assert list(RequestEndpoint.objects.values_list("name", "max_in_flight_per_user")) == [("a.two", 4)]
    [app] = yaml.safe_load(config_export())["clientApps"]
    assert app["endpoints"] == [{"name": "a.two", "stream": True, "timeoutMs": 30000, "maxTimeoutMs": 300000,
                                 "maxInFlightPerUser": 4}]


def test_a_webhooks_secret_travels_only_in_an_export_with_secrets_and_a_mirror_signs_with_it():
    config_import(text=_file("{name: orders.quote, webhook: 'https://shop.example/hooks/quote'}"))
    secret = RequestEndpoint.objects.get().webhook_secret
    [plain] = yaml.safe_load(config_export())["clientApps"]
    assert "webhookSecret" not in plain["endpoints"][0]  # (a file for a repository or a ticket)
    exported = config_export(include_secrets=True)  # what the meta role serves the network
    assert yaml.safe_load(exported)["clientApps"][0]["endpoints"][0]["webhookSecret"] == secret
    RequestEndpoint.objects.all().delete()
    mirrored = config_import(text=exported, mirror=True)  # another domain pulling the meta's file
    assert RequestEndpoint.objects.get().webhook_secret == secret
    assert mirrored.endpoint_secrets == []  # nothing new to show: the secret is the meta's


@pytest.mark.parametrize(("entry", "words"), [
    ("{name: nowhere}", "webhook URL or the stream"),
    ("{name: x, stream: true, colour: red}", "unknown key 'colour'"),
    ("{name: '9lives', stream: true}", "name"),
    ("{name: x, stream: true, timeoutMs: 5000, maxTimeoutMs: 1000}", "max_timeout_ms"),
    ("{name: x, webhook: 'https://a.example/h', webhookSecret: [1]}", "webhookSecret"),
])
def test_a_wrong_endpoint_is_refused_with_its_place_in_the_file(entry, words):
    with pytest.raises(ConfigError) as refused:
        config_import(text=_file(entry))
    assert "endpoints[0]" in str(refused.value) and words in str(refused.value)
    assert not RequestEndpoint.objects.exists()
