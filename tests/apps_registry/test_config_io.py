from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
import yaml
from django.core.management import CommandError, call_command

from apps_registry.config_io import ConfigError, config_export, config_import
from apps_registry.models import ClientApp, Domain, DomainLink, UserDistribution
from apps_registry.selectors import user_home_domain

pytestmark = pytest.mark.django_db
EXAMPLE = Path(__file__).resolve().parents[1] / "fixtures" / "linker_meta_4_domains.yaml"


def test_the_linker_example_imports_with_its_domains_links_apps_and_distributions():
    config_import(text=EXAMPLE.read_text())
    assert list(Domain.objects.values_list("name", flat=True)) == ["domain-01", "domain-02", "domain-03", "domain-04"]
    assert DomainLink.objects.count() == 4
    assert ClientApp.objects.count() == 5
    anz = ClientApp.objects.get(app_name="ANZ")
    assert (anz.app_id, anz.master_user_id, anz.auth_url, anz.auth_enabled) == (
        "app-id-343", "ANZ-123223", "http://localhost:4200/auth", False)
    # authEnabled: false is the linker's "authentication disabled": open, as the file says.
    assert set(ClientApp.objects.values_list("auth_mode", flat=True)) == {"none"}
    assert user_home_domain("ANZ-2000000").name == "domain-02"
    assert user_home_domain("ANZ-999999").name == "domain-01"
    assert user_home_domain("ANZ-987654321").name == "domain-04"  # open-ended last range


def test_export_then_import_round_trips_the_example_exactly():
    config_import(text=EXAMPLE.read_text())
    exported = config_export()
    original = yaml.safe_load(EXAMPLE.read_text())
    again = yaml.safe_load(exported)
    assert again["domains"] == original["domains"]
    assert again["domainLinks"] == original["domainLinks"]
    # (every app has Pusher credentials, generated when the file names none: the export names them)
    by_name = {a["appName"]: {k: v for k, v in a.items() if k != "pusher"} for a in again["clientApps"]}
    for app in original["clientApps"]:
        assert by_name[app["appName"]] == app

    summary = config_import(text=exported)
    assert sum(summary.created.values()) == 0 and sum(summary.updated.values()) == 0
    assert config_export() == exported


def test_extension_keys_survive_the_round_trip():
    text = EXAMPLE.read_text() + """
  - appName: NEWS
    appId: news-app
    masterUserId: NEWS-1
    tokenSecret: s3cret
    publicChannels: ["headlines.*"]
    clientSubscriptions: true
"""
    config_import(text=text)
    news = ClientApp.objects.get(app_name="NEWS")
    assert (news.auth_mode, news.token_secret, news.public_channel_patterns, news.client_subscriptions_allowed) == (
        "signed_token", "s3cret", ["headlines.*"], True)
    exported = yaml.safe_load(config_export(include_secrets=True))
    news_out = next(a for a in exported["clientApps"] if a["appName"] == "NEWS")
    assert news_out["tokenSecret"] == "s3cret" and news_out["publicChannels"] == ["headlines.*"]


def test_a_bad_entry_is_named_and_nothing_is_half_imported():
    broken = EXAMPLE.read_text().replace("domainName: domain-03", "domainName: domain-99")
    with pytest.raises(ConfigError, match=r"clientApps\[4\] \(ANZ\) userDistributions\[2\].*domain-99"):
        config_import(text=broken)
    assert Domain.objects.count() == 0 and ClientApp.objects.count() == 0


def test_overlapping_distributions_in_a_file_are_refused():
    broken = EXAMPLE.read_text().replace("from: 1000000", "from: 999000")
    with pytest.raises(ConfigError, match=r"userDistributions\[1\].*overlap"):
        config_import(text=broken)
    assert UserDistribution.objects.count() == 0


def test_a_link_to_an_unknown_domain_is_refused():
    broken = EXAMPLE.read_text().replace("n2: domain-04\n\nclientApps", "n2: domain-07\n\nclientApps")
    with pytest.raises(ConfigError, match=r"domainLinks\[3\].*domain-07"):
        config_import(text=broken)


def test_import_and_export_commands(tmp_path):
    out = StringIO()
    call_command("import_config", str(EXAMPLE), stdout=out)
    assert "domains: 4 created" in out.getvalue()
    target = tmp_path / "exported.yaml"
    call_command("export_config", "--output", str(target), stdout=StringIO())
    assert yaml.safe_load(target.read_text())["domains"][0]["name"] == "domain-01"
    bad = tmp_path / "bad.yaml"
    bad.write_text("domains:\n  - urls: []\n")
    with pytest.raises(CommandError, match=r"domains\[0\]: 'name' is required"):
        call_command("import_config", str(bad))


def test_exports_leave_token_secrets_out_unless_asked_and_imports_keep_them():
    config_import(text="""
domains: [{name: domain-01}]
clientApps:
  - {appName: NEWS, appId: news-app, masterUserId: NEWS-1, tokenSecret: s3cret-of-news,
     userDistributions: [{domainName: domain-01, from: 0}]}
""")
    plain = config_export()
    assert "s3cret-of-news" not in plain and "authMode: signed_token" in plain  # kept signed without its secret
    assert "s3cret-of-news" in config_export(include_secrets=True)
    config_import(text=plain)  # re-importing the secret-less file keeps the app's secret
    from apps_registry.models import ClientApp

    assert ClientApp.objects.get(app_name="NEWS").token_secret == "s3cret-of-news"
    assert ClientApp.objects.get(app_name="NEWS").auth_mode == "signed_token"


def test_an_open_app_is_imported_only_when_the_file_or_the_operator_says_so(tmp_path):
    config_import(text="""
domains: [{name: domain-01}]
clientApps:
  - {appName: QUIET, appId: quiet-app, masterUserId: QUIET-1}
  - {appName: OPEN, appId: open-app, masterUserId: OPEN-1, authEnabled: false}
""")
    assert dict(ClientApp.objects.values_list("app_name", "auth_mode")) == {"QUIET": "signed_token", "OPEN": "none"}
    exported = config_export()
    assert "authMode: signed_token" in exported  # the quiet app is written signed, so it stays signed
    ClientApp.objects.all().delete()
    config_import(text=exported)
    assert dict(ClientApp.objects.values_list("app_name", "auth_mode")) == {"QUIET": "signed_token", "OPEN": "none"}


def test_the_import_names_every_app_it_leaves_open_and_the_operator_can_close_them():
    out = StringIO()
    call_command("import_config", str(EXAMPLE), stdout=out)
    assert "open apps (auth mode none: anyone who knows the appId can log in as any user" in out.getvalue()
    assert "ANZ" in out.getvalue().split("open apps", 1)[1]

    ClientApp.objects.all().delete()
    out = StringIO()
    call_command("import_config", str(EXAMPLE), "--auth-mode", "signed_token", stdout=out)
    assert set(ClientApp.objects.values_list("auth_mode", flat=True)) == {"signed_token"}
    assert "open apps" not in out.getvalue()


def test_the_import_defaults_never_override_what_an_entry_says():
    config_import(default_auth_mode="none", text="""
domains: [{name: domain-01}]
clientApps:
  - {appName: NEWS, appId: news-app, masterUserId: NEWS-1, tokenSecret: s3cret-of-news}
  - {appName: AUTH, appId: auth-app, masterUserId: AUTH-1, authUrl: "https://auth.example.com", authEnabled: true}
""")
    assert dict(ClientApp.objects.values_list("app_name", "auth_mode")) == {"NEWS": "signed_token",
                                                                             "AUTH": "auth_url"}


def test_auth_url_mode_with_authentication_switched_off_is_refused_on_import():
    with pytest.raises(ConfigError, match=r"clientApps\[0\].*authEnabled false would refuse every login"):
        config_import(text="""
clientApps:
  - {appName: NEWS, appId: news-app, masterUserId: NEWS-1, authMode: auth_url,
     authUrl: "https://auth.example.com", authEnabled: false}
""")


def test_a_master_user_id_must_be_a_user_of_its_app():
    with pytest.raises(ConfigError, match="masterUserId 'OTHER-1' is not a user id of NEWS"):
        config_import(text="""
clientApps:
  - {appName: NEWS, appId: news-app, masterUserId: OTHER-1}
""")


NEWS_WITH_SETTINGS = """
  - appName: NEWS
    appId: news-app
    masterUserId: NEWS-1
    settings:
      allowedOrigins: ["https://news.example"]
      maxTokenLifetimeSeconds: 600
      maxConnectionsPerUser: 3
"""


def test_the_settings_that_protect_an_apps_users_travel_in_the_file_and_back():
    config_import(text=EXAMPLE.read_text() + NEWS_WITH_SETTINGS)
    news = ClientApp.objects.get(app_name="NEWS")
    assert (news.allowed_origins, news.max_token_lifetime_seconds, news.max_connections_per_user) == (
        ["https://news.example"], 600, 3)
    exported = yaml.safe_load(config_export())
    [entry] = [a for a in exported["clientApps"] if a["appName"] == "NEWS"]
    # Only what differs from the defaults is written.
    assert entry["settings"] == {"allowedOrigins": ["https://news.example"], "maxTokenLifetimeSeconds": 600,
                                 "maxConnectionsPerUser": 3}
    ClientApp.objects.filter(app_name="NEWS").delete()
    config_import(text=yaml.safe_dump(exported))
    again = ClientApp.objects.get(app_name="NEWS")
    assert (again.allowed_origins, again.max_token_lifetime_seconds, again.max_connections_per_user) == (
        ["https://news.example"], 600, 3)


def test_a_file_without_settings_keeps_the_apps_but_a_mirror_takes_the_metas_defaults_included():
    config_import(text=EXAMPLE.read_text() + NEWS_WITH_SETTINGS)
    without = EXAMPLE.read_text() + NEWS_WITH_SETTINGS.split("    settings:")[0]
    config_import(text=without)
    assert ClientApp.objects.get(app_name="NEWS").allowed_origins == ["https://news.example"]  # left alone
    config_import(text=without, mirror=True)  # the meta dropped them: so does the mirror
    news = ClientApp.objects.get(app_name="NEWS")
    assert (news.allowed_origins, news.max_token_lifetime_seconds, news.max_connections_per_user) == ([], 86400, 10)


@pytest.mark.parametrize(("settings", "message"), [
    ("{maxTokenLifetime: 5}", "unknown setting(s) maxTokenLifetime"),
    ("{maxConnectionsPerUser: 0}", "settings.maxConnectionsPerUser: Ensure this value is greater than or equal to 1."),
    ("{allowedOrigins: https://news.example}", "settings.allowedOrigins must be a list of origins"),
    ("{confirmationEnabled: 1}", "settings.confirmationEnabled must be true or false"),
    ("{retentionDays: true}", "settings.retentionDays must be a number"),
])
def test_a_bad_setting_is_refused_naming_the_app_and_nothing_is_written(settings, message):
    text = EXAMPLE.read_text() + f"""
  - appName: NEWS
    appId: news-app
    masterUserId: NEWS-1
    settings: {settings}
"""
    with pytest.raises(ConfigError, match="clientApps\\[5\\] \\(NEWS\\)") as refused:
        config_import(text=text)
    assert message in str(refused.value)
    assert not ClientApp.objects.exists()


def test_a_link_secret_changed_by_a_file_or_a_pull_keeps_the_old_one_valid_for_the_overlap():
    link_entry = "domainLinks:\n  - {n1: domain-01, n2: domain-02, sharedSecret: %s}\n"
    head = "domains:\n  - {name: domain-01, urls: []}\n  - {name: domain-02, urls: []}\n"
    config_import(text=head + link_entry % ("a" * 43))
    config_import(text=head + link_entry % ("b" * 43), mirror=True)
    assert DomainLink.objects.get().secrets_valid() == ["b" * 43, "a" * 43]


def _with_standbys(standbys: dict[str, str]) -> str:
    """The linker example with a `standby` on ANZ's distributions (home domain -> its standby)."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    for app in doc["clientApps"]:
        for dist in app.get("userDistributions") or []:
            if dist["domainName"] in standbys:
                dist["standby"] = standbys[dist["domainName"]]
    return yaml.safe_dump(doc, sort_keys=False)


def test_a_ranges_standby_domain_is_imported_exported_and_changed_by_a_later_file():
    config_import(text=_with_standbys({"domain-03": "domain-04"}))
    row = UserDistribution.objects.get(app__app_name="ANZ", range_from=3000000)
    assert (row.domain.name, row.standby.name) == ("domain-03", "domain-04")
    assert UserDistribution.objects.filter(standby__isnull=False).count() == 1
    exported = yaml.safe_load(config_export())
    anz = next(a for a in exported["clientApps"] if a["appName"] == "ANZ")
    assert [d.get("standby") for d in anz["userDistributions"]] == [None, None, "domain-04", None]
    assert sum(config_import(text=config_export()).created.values()) == 0  # the same file changes nothing
    config_import(text=_with_standbys({"domain-03": "domain-01"}))
    row = UserDistribution.objects.get(app__app_name="ANZ", range_from=3000000)
    assert row.standby.name == "domain-01"


@pytest.mark.parametrize(("standby", "error"), [
    ("domain-03", "the standby must be another domain than the home (domain-03)"),
    ("domain-09", "unknown standby domain 'domain-09'"),
])
def test_a_standby_that_is_the_home_itself_or_unknown_is_refused_by_name(standby, error):
    with pytest.raises(ConfigError, match=error.replace("(", r"\(").replace(")", r"\)")) as refused:
        config_import(text=_with_standbys({"domain-03": standby}))
    assert "userDistributions[2]" in str(refused.value)
    assert not Domain.objects.exists()  # all or nothing


# Numbers on domain-02 and -03 only: the test database is domain-01's, whose number would move its
# message ids into block 1 for every test after this one.
def _numbered(numbers: dict[str, int]) -> str:
    text = EXAMPLE.read_text()
    for name, number in numbers.items():
        text = text.replace(f"  - name: {name}\n", f"  - name: {name}\n    number: {number}\n")
    return text


def test_a_domains_number_is_imported_exported_and_kept_by_a_file_that_does_not_name_it():
    config_import(text=_numbered({"domain-02": 2, "domain-03": 3}))
    assert dict(Domain.objects.values_list("name", "number")) == {
        "domain-01": None, "domain-02": 2, "domain-03": 3, "domain-04": None}
    exported = yaml.safe_load(config_export())["domains"]
    assert [d.get("number") for d in exported] == [None, 2, 3, None]
    assert sum(config_import(text=EXAMPLE.read_text()).updated.values()) == 0
    assert Domain.objects.get(name="domain-03").number == 3


@pytest.mark.parametrize(("numbers", "error"), [
    ({"domain-02": 2, "domain-03": 2}, r"domains\[2\] \(domain-03\): number 2 is domain-02's"),
    ({"domain-02": 0}, r"domains\[1\] \(domain-02\): 'number' must be a whole number from 1 to 8191"),
    ({"domain-02": 8192}, r"'number' must be a whole number from 1 to 8191"),
])
def test_a_number_out_of_range_or_given_twice_is_refused_by_name(numbers, error):
    with pytest.raises(ConfigError, match=error):
        config_import(text=_numbered(numbers))
    assert Domain.objects.count() == 0


def test_a_domains_number_is_never_changed_by_a_later_file():
    config_import(text=_numbered({"domain-02": 2}))
    with pytest.raises(ConfigError, match=r"domain-02\): its number is 2 and is never changed"):
        config_import(text=_numbered({"domain-02": 5}))
    assert Domain.objects.get(name="domain-02").number == 2
