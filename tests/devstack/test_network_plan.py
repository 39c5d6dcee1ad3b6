"""What `make network` would start (devstack.network, devstack.ring, devstack.ring_plan), read from
the plan without starting anything: ports, each domain's environment and processes, the ring file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from django.db import connection

from apps_registry.config_io import config_import
from apps_registry.models import ClientApp, Domain, DomainLink, UserDistribution
from apps_registry.selectors import user_home_domain
from devstack import network
from devstack.ring_plan import WORKER_QUEUES, domain_number, ring_config_write

EXAMPLE = Path(__file__).resolve().parents[1] / "fixtures" / "linker_meta_4_domains.yaml"  # the seed's, verbatim
ENV = {
    "DATABASE_URL": "postgresql://postgres:pw@127.0.0.1:5999/switchboard",
    "REDIS_URL": "redis://:pw@127.0.0.1:6999/0",
    "DJANGO_SETTINGS_MODULE": "config.settings.local",
}


@pytest.fixture
def ring(tmp_path):
    return network.network_ring(dict(ENV), root=tmp_path)


def test_domain_n_serves_on_port_8000_plus_n_with_its_own_database_and_redis_database(ring):
    assert [ring.ws_url(n) for n in ring.domains()] == [f"ws://127.0.0.1:800{n}/ws" for n in (1, 2, 3, 4)]
    assert ring.admin_url(3) == "http://127.0.0.1:8003/admin/"
    assert [ring.database_url(n) for n in ring.domains()] == [
        f"postgresql://postgres:pw@127.0.0.1:5999/switchboard_domain_0{n}" for n in (1, 2, 3, 4)]
    assert [ring.redis_url(n) for n in ring.domains()] == [f"redis://:pw@127.0.0.1:6999/{n}" for n in (1, 2, 3, 4)]


def test_each_domain_runs_with_its_name_port_node_and_small_concurrency(ring):
    env = ring.plan(2).env
    assert {k: env[k] for k in ("DOMAIN_NAME", "PORT", "NODE_ID", "WORKER_CONCURRENCY")} == {
        "DOMAIN_NAME": "domain-02", "PORT": "8002", "NODE_ID": "domain-02-web", "WORKER_CONCURRENCY": "2"}
    assert env["DATABASE_URL"].endswith("/switchboard_domain_02") and env["REDIS_URL"].endswith("/2")


def test_each_domain_exports_its_analytics_to_a_lake_of_its_own_in_the_ring_directory(ring, tmp_path):
    lakes = [ring.plan(n).env["ANALYTICS_LAKE"] for n in ring.domains()]
    assert lakes == [str(tmp_path.resolve() / "lake" / f"domain-0{n}") for n in (1, 2, 3, 4)]


def test_domain_01_is_the_meta_and_the_others_pull_from_it_with_one_shared_secret(ring, tmp_path):
    assert "META_URL" not in ring.plan(1).env
    assert {ring.plan(n).env["META_URL"] for n in (2, 3, 4)} == {"http://127.0.0.1:8001"}
    secret = json.loads((tmp_path / "secrets.json").read_text())["meta_secret"]
    assert {ring.plan(n).env["META_SECRET"] for n in (2, 3, 4)} == {secret}


def test_the_secrets_and_the_admin_password_stay_the_same_from_one_run_to_the_next(ring, tmp_path):
    again = network.network_ring(dict(ENV), root=tmp_path)
    assert (again.meta_secret, again.admin_password) == (ring.meta_secret, ring.admin_password)
    assert ring.plan(4).env["ADMIN_PASSWORD"] == ring.admin_password


def test_each_domain_has_a_web_node_a_worker_on_every_queue_and_beat(ring):
    assert ring.names() == [f"0{n}/{role}" for n in (1, 2, 3, 4) for role in ("web", "worker", "beat")]
    web, worker, beat = ring.children[3]
    assert web.argv[1:] == ["-m", "config.web", "--bind", "127.0.0.1", "--port", "8003"]
    assert web.ready_url == "http://127.0.0.1:8003/readyz"
    assert worker.argv[worker.argv.index("-Q") + 1] == WORKER_QUEUES == "celery,routing,forwarding,webhooks"
    assert "beat" in beat.argv and beat.env["DOMAIN_NAME"] == "domain-03"


def test_network_base_port_moves_the_ring(tmp_path):
    moved = network.network_ring({**ENV, "NETWORK_BASE_PORT": "9100"}, root=tmp_path)
    assert [moved.http_url(n) for n in moved.domains()] == [f"http://127.0.0.1:910{n}" for n in (1, 2, 3, 4)]
    assert moved.plan(3).env["META_URL"] == "http://127.0.0.1:9101"


def _written(ring) -> dict:
    return yaml.safe_load(ring_config_write(ring.config_path, ring.ports).read_text())


def test_the_ring_file_is_the_seeds_meta_example_on_this_machine_with_a_secret_per_link(ring):
    written, seed = _written(ring), yaml.safe_load(EXAMPLE.read_text())
    assert [d["name"] for d in written["domains"]] == [d["name"] for d in seed["domains"]]
    assert written["domains"][2]["urls"] == ["ws://127.0.0.1:8003/ws", "http://127.0.0.1:8003"]
    # The seed's links, then the ring's diagonals, which carry the network's liveness only.
    assert [(link["n1"], link["n2"], link.get("livenessOnly", False)) for link in written["domainLinks"]] == [
        (link["n1"], link["n2"], False) for link in seed["domainLinks"]] + [
        ("domain-01", "domain-03", True), ("domain-02", "domain-04", True)]
    assert len({link["sharedSecret"] for link in written["domainLinks"]}) == 6
    # The seed's apps; ANZ open as there (no tokenSecret), its news.* channels public and open to
    # client subscriptions so a publish can be watched arriving on every domain, and each of its
    # ranges standing by on the next domain round the ring.
    anz = written["clientApps"][-1]
    assert (anz.pop("publicChannels"), anz.pop("clientSubscriptions")) == (["news.*"], True)
    assert [d.pop("standby") for d in anz["userDistributions"]] == ["domain-02", "domain-03", "domain-04", "domain-01"]
    assert written["clientApps"] == seed["clientApps"]


def test_the_ring_file_keeps_its_secrets_and_its_edits_and_follows_new_ports(ring, tmp_path):
    first = _written(ring)
    ring.config_path.write_text(ring.config_path.read_text() + "# an operator's note\n")
    assert _written(ring) == first and ring.config_path.read_text().endswith("# an operator's note\n")
    moved = network.network_ring({**ENV, "NETWORK_BASE_PORT": "9100"}, root=tmp_path)
    again = _written(moved)
    assert again["domains"][0]["urls"][0] == "ws://127.0.0.1:9101/ws"
    assert again["domainLinks"] == first["domainLinks"]


def test_a_ring_file_from_before_the_liveness_links_gains_them_and_keeps_its_secrets(ring):
    first = _written(ring)
    older = {**first, "domainLinks": [link for link in first["domainLinks"] if not link.get("livenessOnly")]}
    ring.config_path.write_text(yaml.safe_dump(older, sort_keys=False))
    links = _written(ring)["domainLinks"]
    assert links[:4] == older["domainLinks"]  # the seed's links and their secrets, as they were
    assert [(link["n1"], link["n2"], link["livenessOnly"]) for link in links[4:]] == [
        ("domain-01", "domain-03", True), ("domain-02", "domain-04", True)]


@pytest.fixture
def message_ids_kept():
    """The test database is domain-01's: importing the ring file gives it number 1, which moves its
    message ids into block 1 (messaging migration 0029) for every test after this one. Put back."""
    with connection.cursor() as cur:
        cur.execute("SELECT last_value, is_called FROM messaging_message_id_seq")
        last, called = cur.fetchone()
    yield
    with connection.cursor() as cur:
        cur.execute("SELECT setval('messaging_message_id_seq', %s, %s)", [last, called])


@pytest.mark.django_db
def test_the_ring_file_imports_with_anz_users_homed_as_in_the_seed(ring, message_ids_kept):
    summary = config_import(text=ring_config_write(ring.config_path, ring.ports).read_text())
    # Beyond the seed: domain-0N's number is N, its block of message ids.
    assert dict(Domain.objects.values_list("name", "number")) == {f"domain-0{n}": n for n in range(1, 5)}
    assert summary.open_apps == ["domain1", "domain2", "domain3", "domain4", "ANZ"]
    assert ClientApp.objects.count() == 5
    assert sorted(DomainLink.objects.values_list("n1__name", "n2__name", "liveness_only")) == [
        ("domain-01", "domain-02", False), ("domain-01", "domain-03", True), ("domain-01", "domain-04", False),
        ("domain-02", "domain-03", False), ("domain-02", "domain-04", True), ("domain-03", "domain-04", False)]
    homes = {user: user_home_domain(user).name for user in ("ANZ-1", "ANZ-2000000", "ANZ-3123456", "ANZ-9000000")}
    assert homes == {"ANZ-1": "domain-01", "ANZ-2000000": "domain-02", "ANZ-3123456": "domain-03",
                     "ANZ-9000000": "domain-04"}
    # Beyond the seed: every range stands by on the next domain round the ring.
    standbys = {d.domain.name: d.standby.name for d in UserDistribution.objects.select_related("domain", "standby")}
    assert standbys == {"domain-01": "domain-02", "domain-02": "domain-03", "domain-03": "domain-04",
                        "domain-04": "domain-01"}


@pytest.mark.parametrize("text, number", [("domain-02", 2), ("02", 2), ("4", 4)])
def test_a_domain_is_named_as_the_operator_likes(text, number):
    assert domain_number(text) == number


@pytest.mark.parametrize("text", ["domain-05", "0", "", "domain-x"])
def test_a_domain_outside_the_ring_is_refused(text):
    with pytest.raises(ValueError, match="no domain"):
        domain_number(text)


def test_a_control_command_that_names_no_domain_of_the_ring_fails_and_stops_nothing(ring):
    said: list[str] = []
    network.control_handle(ring, "stop domain-07", said.append)
    network.control_handle(ring, "restart everything", said.append)
    assert [line.split(":")[0] for line in said] == ["failed", "failed"]
    assert all(ring.running(n) is False for n in ring.domains())  # never started, nothing stopped


def test_the_ring_file_lives_in_var_network(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("SWITCHBOARD_VAR_DIR", str(tmp_path))
    assert network.network_dir() == tmp_path / "network"
    assert network.control_path() == tmp_path / "network" / "control.sock"
