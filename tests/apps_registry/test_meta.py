"""The meta role: the signed export every domain serves, and the pull that mirrors it."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import StringIO

import pytest
import yaml
from django.core.management import CommandError, call_command

from apps_registry.config_io import config_export, config_import
from apps_registry.meta import EXPORT_PATH, MetaPullError, meta_pull
from apps_registry.models import ClientApp, Domain, DomainLink, MetaState, UserDistribution
from foundation.signed_calls import ANSWER_METHOD, DOMAIN_HEADER, SIGNATURE_HEADER, signature_refusal, signed_headers
from tests.apps_registry.test_routing import EXAMPLE
from tests.factories import make_app, make_domain

pytestmark = pytest.mark.django_db
SECRET = "the-network-secret"


@pytest.fixture
def meta_settings(settings):
    settings.META_SECRET = SECRET
    settings.DOMAIN_NAME = "domain-02"
    return settings


def _signed_get(client, path: str = EXPORT_PATH, secret: str = SECRET, **kwargs):
    headers = signed_headers(secret=secret, sender="domain-02", method="GET", path=path, body=b"", **kwargs)
    return client.get(path, headers=headers), headers


# --- the export ----------------------------------------------------------------------------------


def test_a_signed_caller_gets_the_configuration_with_secrets_in_a_signed_answer(client, meta_settings):
    config_import(text=EXAMPLE.read_text())
    response, sent = _signed_get(client)
    assert response.status_code == 200
    assert response.content.decode() == config_export(include_secrets=True)
    doc = yaml.safe_load(response.content)
    assert all(link["sharedSecret"] for link in doc["domainLinks"])  # the links' secrets travel to the mirror
    nonce = sent[SIGNATURE_HEADER].split(",")[1][2:]
    reason, signature = signature_refusal(secret=SECRET, header=response[SIGNATURE_HEADER], method=ANSWER_METHOD,
                                          path=EXPORT_PATH, body=response.content, max_skew=60)
    assert reason is None and signature.nonce == nonce  # the answer is signed for this very request


@pytest.mark.parametrize("case, expected", [
    ("forged", "bad signature"),
    ("stale", "timestamp outside"),
    ("unsigned", "missing or malformed signature"),
])
def test_a_forged_stale_or_unsigned_call_is_refused(client, meta_settings, case, expected):
    if case == "unsigned":
        response = client.get(EXPORT_PATH)
    else:
        response, _ = _signed_get(client, secret="not-the-secret" if case == "forged" else SECRET,
                                  **({"timestamp": int(time.time()) - 3600} if case == "stale" else {}))
    assert response.status_code == 403
    assert expected in response.json()["error"]
    assert "tokenSecret" not in response.content.decode()


def test_a_replayed_call_is_refused(client, meta_settings):
    first, headers = _signed_get(client)
    assert first.status_code == 200
    again = client.get(EXPORT_PATH, headers=headers)
    assert again.status_code == 403
    assert again.json() == {"error": "refused: nonce already used (a replayed call)"}


def test_a_replayed_call_under_another_domains_name_is_refused_too(client, meta_settings):
    # The Switchboard-Domain header is not signed: a recorded call sent again under other names
    # must not get the configuration, with its secrets, once per name.
    first, headers = _signed_get(client)
    assert first.status_code == 200
    for name in ("domain-03", "domain-99", ""):
        again = client.get(EXPORT_PATH, headers={**headers, DOMAIN_HEADER: name})
        assert (again.status_code, again.json()) == (403, {"error": "refused: nonce already used (a replayed call)"})


def test_a_domain_without_meta_secret_exports_nothing(client, settings):
    settings.META_SECRET = ""
    response, _ = _signed_get(client, secret="anything")
    assert response.status_code == 403
    assert "no META_SECRET" in response.json()["error"]


# --- the pull ------------------------------------------------------------------------------------


class FakeMeta:
    """A meta domain on a real socket, serving `document` signed as the export endpoint signs it
    (or signed wrongly, to see the pull refuse it)."""

    def __init__(self):
        self.document = ""
        self.answer_secret = SECRET
        self.answer_nonce: str | None = None  # None: the request's nonce, as the real endpoint answers
        self.unsigned = False
        self.requests: list[str | None] = []
        meta = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                meta.requests.append(self.headers.get(SIGNATURE_HEADER))
                reason, signature = signature_refusal(secret=SECRET, header=self.headers.get(SIGNATURE_HEADER),
                                                      method="GET", path=self.path, body=b"", max_skew=60)
                if reason is not None:
                    self.send_response(403)
                    self.end_headers()
                    return
                body = meta.document.encode()
                self.send_response(200)
                if not meta.unsigned:
                    answer = signed_headers(secret=meta.answer_secret, sender="domain-01", method=ANSWER_METHOD,
                                            path=self.path, body=body, nonce=meta.answer_nonce or signature.nonce)
                    for name, value in answer.items():
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_meta(meta_settings):
    meta = FakeMeta()
    meta_settings.META_URL = meta.url
    meta.document = EXAMPLE.read_text()
    yield meta
    meta.close()


def test_a_pull_applies_the_metas_configuration_and_records_it(fake_meta):
    outcome = meta_pull()
    assert outcome.changed
    assert list(Domain.objects.values_list("name", flat=True)) == ["domain-01", "domain-02", "domain-03", "domain-04"]
    assert ClientApp.objects.count() == 5 and DomainLink.objects.count() == 4
    state = MetaState.objects.get()
    assert (state.meta_url, state.digest, state.last_error) == (fake_meta.url, outcome.digest, "")
    assert state.applied_at is not None


def test_an_unchanged_configuration_changes_nothing(fake_meta, django_assert_max_num_queries):
    first = meta_pull()
    applied_at = MetaState.objects.get().applied_at
    with django_assert_max_num_queries(12):  # the state row, and this domain's export read once; nothing written
        again = meta_pull()
    assert not again.changed and again.digest == first.digest
    assert MetaState.objects.get().applied_at == applied_at


def test_a_local_edit_is_undone_by_the_next_pull_even_when_the_meta_did_not_change(fake_meta):
    meta_pull()
    DomainLink.objects.filter(n1__name="domain-01", n2__name="domain-02").update(enabled=False, weight=9)
    outcome = meta_pull()
    assert outcome.changed
    link = DomainLink.objects.get(n1__name="domain-01", n2__name="domain-02")
    assert (link.enabled, link.weight) == (True, 1)
    assert not meta_pull().changed


def test_a_pull_carries_each_ranges_standby_and_keeps_a_domain_still_named_as_one(fake_meta):
    doc = yaml.safe_load(fake_meta.document)
    anz = next(app for app in doc["clientApps"] if app["appName"] == "ANZ")
    anz["userDistributions"][2]["standby"] = "domain-04"
    fake_meta.document = yaml.safe_dump(doc)
    meta_pull()
    row = UserDistribution.objects.get(app__app_name="ANZ", range_from=3000000)
    assert (row.domain.name, row.standby.name) == ("domain-03", "domain-04")
    doc["domains"] = [d for d in doc["domains"] if d["name"] != "domain-04"]
    doc["domainLinks"] = [link for link in doc["domainLinks"] if "domain-04" not in (link["n1"], link["n2"])]
    anz["userDistributions"] = [d for d in anz["userDistributions"] if d["domainName"] != "domain-04"]
    doc["clientApps"] = [a for a in doc["clientApps"] if a["appName"] != "domain4"]
    fake_meta.document = yaml.safe_dump(doc)
    outcome = meta_pull()
    assert Domain.objects.filter(name="domain-04").exists()  # still the standby of a range here
    assert "domain domain-04 (distributions of a kept app still name it)" in outcome.notice


def test_the_mirror_removes_what_the_meta_no_longer_lists(fake_meta):
    make_app("LOCAL", app_id="local-app", master="LOCAL-1", domain=make_domain("domain-77"))
    meta_pull()
    assert not ClientApp.objects.filter(app_name="LOCAL").exists()
    assert not Domain.objects.filter(name="domain-77").exists()

    doc = yaml.safe_load(fake_meta.document)
    doc["domainLinks"] = [link for link in doc["domainLinks"] if {link["n1"], link["n2"]} != {"domain-01", "domain-02"}]
    doc["clientApps"] = [app for app in doc["clientApps"] if app["appName"] != "domain3"]
    fake_meta.document = yaml.safe_dump(doc)
    meta_pull()
    assert not DomainLink.objects.filter(n1__name="domain-01", n2__name="domain-02").exists()
    assert DomainLink.objects.count() == 3
    assert not ClientApp.objects.filter(app_name="domain3").exists()


def test_the_mirror_keeps_an_app_whose_messages_are_stored_here_and_says_so(fake_meta):
    from messaging.core.store import message_send

    app = make_app("KEEP", app_id="keep-app", master="KEEP-1", domain=make_domain("domain-02"))
    message_send(app_id=app.pk, sender="KEEP-1", recipients=["KEEP-2"], content="history")
    outcome = meta_pull()
    assert ClientApp.objects.filter(app_name="KEEP").exists() and app.distributions.count() == 1
    assert "app KEEP" in outcome.notice and "app KEEP" in MetaState.objects.get().notice


def test_a_pull_never_applies_an_answer_it_cannot_verify(fake_meta):
    fake_meta.answer_secret = "forged"
    with pytest.raises(MetaPullError, match="bad signature"):
        meta_pull()
    fake_meta.answer_secret, fake_meta.unsigned = SECRET, True
    with pytest.raises(MetaPullError, match="missing or malformed signature"):
        meta_pull()
    fake_meta.unsigned, fake_meta.answer_nonce = False, "recorded0earlier0answer"
    with pytest.raises(MetaPullError, match="signed for another request"):
        meta_pull()
    assert not Domain.objects.exists() and not ClientApp.objects.exists()
    state = MetaState.objects.get()
    assert "signed for another request" in state.last_error and state.applied_at is None


def test_the_command_pulls_now_and_fails_with_exit_code_1_and_a_message(fake_meta, meta_settings):
    out = StringIO()
    call_command("meta_pull", stdout=out)
    assert "configuration applied" in out.getvalue()
    meta_settings.META_URL = "http://127.0.0.1:9"  # nothing listens there
    with pytest.raises(CommandError, match="meta pull failed: .*unreachable") as failure:
        call_command("meta_pull")
    assert failure.value.returncode == 1
    assert "unreachable" in MetaState.objects.get().last_error


def test_the_beat_task_pulls_and_is_safe_to_run_twice(fake_meta):
    from apps_registry.tasks import meta_pull as task

    assert task.apply().get().startswith("configuration applied")
    assert task.apply().get().startswith("configuration unchanged")
    assert ClientApp.objects.count() == 5


def test_the_beat_schedules_the_pull_only_where_meta_url_is_set(monkeypatch):
    import importlib

    import config.settings.network as network

    monkeypatch.setenv("META_URL", "http://meta.example:8001")
    monkeypatch.setenv("META_PULL_SECONDS", "7")
    try:
        entry = importlib.reload(network).NETWORK_BEAT_SCHEDULE["meta-pull"]
        assert (entry["task"], entry["schedule"]) == ("apps_registry.tasks.meta_pull", 7.0)
        monkeypatch.delenv("META_URL")
        assert "meta-pull" not in importlib.reload(network).NETWORK_BEAT_SCHEDULE
    finally:
        monkeypatch.undo()
        importlib.reload(network)


def test_the_worker_finds_the_task():
    from config.celery import app

    app.loader.import_default_modules()
    assert "apps_registry.tasks.meta_pull" in app.tasks


def test_the_admin_shows_where_the_configuration_comes_from_and_warns_against_local_edits(fake_meta, operator):
    meta_pull()
    page = operator.get("/admin/apps_registry/domain/").content.decode()
    assert f"Configuration pulled from {fake_meta.url} at " in page and "last error: none" in page
    for model in ("domain", "domainlink", "clientapp", "userdistribution"):
        page = operator.get(f"/admin/apps_registry/{model}/").content.decode()
        assert "edited on the meta domain; local edits are overwritten" in page


def test_a_domain_without_meta_url_shows_no_meta_line(operator, settings):
    settings.META_URL = ""
    page = operator.get("/admin/apps_registry/domain/").content.decode()
    assert "Configuration pulled from" not in page and "edited on the meta domain" not in page


def test_a_domain_told_to_pull_without_the_secret_is_warned(settings):
    from apps_registry.checks import check_meta_role

    settings.META_URL, settings.META_SECRET = "http://meta.example:8001", ""
    assert [w.id for w in check_meta_role(None)] == ["switchboard.W013"]
    settings.META_SECRET = SECRET
    assert check_meta_role(None) == []


def _network_warnings() -> dict[str, list[str]]:
    from django.core.checks import run_checks

    found: dict[str, list[str]] = {}
    for m in run_checks(include_deployment_checks=True):
        if m.id in ("switchboard.W014", "switchboard.W015", "switchboard.W016", "switchboard.W017"):
            found.setdefault(m.id, []).append(m.msg)
    return found


def test_check_deploy_warns_of_a_network_in_the_clear_or_signed_with_short_secrets(settings):
    settings.DOMAIN_NAME = "domain-01"
    settings.META_URL, settings.META_SECRET = "http://meta.example:8001", "short"
    here = make_domain("domain-01")
    clear = make_domain("domain-02", urls=["ws://10.0.0.2:8002/ws"])
    local = make_domain("domain-03", urls=["http://127.0.0.1:8003"])
    safe = make_domain("domain-04", urls=["https://domain-04.example", "wss://domain-04.example/ws"])
    DomainLink.objects.create(n1=here, n2=clear, shared_secret="x" * 31)
    DomainLink.objects.create(n1=here, n2=local)
    DomainLink.objects.create(n1=safe, n2=here)
    warnings = _network_warnings()
    assert warnings == {
        "switchboard.W014": ["META_URL (http://meta.example:8001) is not https: the configuration it pulls, with "
                             "every secret, travels in the clear."],
        "switchboard.W015": ["META_SECRET is shorter than 32 bytes."],
        "switchboard.W016": ["Calls to neighbour domain-02 go to http://10.0.0.2:8002, not https: forwarded "
                             "messages travel in the clear."],
        "switchboard.W017": ["The link domain-01 - domain-02 has a shared secret shorter than 32 bytes."],
    }
    settings.META_URL, settings.META_SECRET = "https://meta.example", "m" * 32
    DomainLink.objects.filter(n2=clear).update(shared_secret="y" * 43)
    Domain.objects.filter(pk=clear.pk).update(urls=["https://10.0.0.2:8443", "ws://10.0.0.2:8002/ws"])
    assert _network_warnings() == {}


def test_check_deploy_warns_of_a_standby_that_is_not_a_neighbour_of_its_home(settings):
    from django.core.checks import run_checks

    settings.DOMAIN_NAME = "domain-01"
    here, linked, far = make_domain("domain-01"), make_domain("domain-02"), make_domain("domain-03")
    DomainLink.objects.create(n1=here, n2=linked)
    app = make_app(domain=here)
    UserDistribution.objects.filter(app=app).update(standby=far)

    def warnings() -> list[str]:
        return [m.msg for m in run_checks(include_deployment_checks=True) if m.id == "switchboard.W018"]

    assert warnings() == ["domain-03 is the standby of ranges homed on domain-01 but not an enabled neighbour: the "
                          "live copy of their mailboxes cannot reach it and waits here."]
    UserDistribution.objects.filter(app=app).update(standby=linked)
    assert warnings() == []


def test_check_deploy_warns_of_a_domain_without_a_number_in_a_network_that_numbers_its_domains(settings):
    from django.core.checks import run_checks

    # Not domain-01: the test database is domain-01's, and its number would move its message ids.
    settings.DOMAIN_NAME = "domain-05"
    here, other = make_domain("domain-05"), make_domain("domain-06")

    def warnings() -> list[str]:
        return [m.msg for m in run_checks(include_deployment_checks=True) if m.id == "switchboard.W019"]

    assert warnings() == []  # nobody has a number: every domain draws ids as before
    Domain.objects.filter(pk=other.pk).update(number=6)
    assert warnings() == ["domain-05 has no number while other domains of the network have one: its messages "
                          "take another id in every other domain that stores them."]
    Domain.objects.filter(pk=here.pk).update(number=5)
    assert warnings() == []
