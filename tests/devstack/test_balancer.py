"""HAProxy's configuration for `make run WEB_NODES=N` and docker-compose.yml (devstack.balancer), and
how `make run` lays out its web nodes and workers (devstack.supervise)."""

from __future__ import annotations

import re
import socket

import pytest

from devstack import balancer, supervise

SERVERS = [balancer.Server("web-1", 8001), balancer.Server("web-2", 8002), balancer.Server("web-3", 8003)]


def section(config: str, name: str) -> list[str]:
    """The directives of one section (`defaults`, `backend web`...), stripped."""
    lines = config.splitlines()
    start = lines.index(name) + 1
    body = []
    for line in lines[start:]:
        if not line.startswith(" "):
            break
        body.append(line.strip())
    return body


@pytest.fixture
def config() -> str:
    return balancer.haproxy_config(port=8000, servers=SERVERS, stats_port=8004)


def test_haproxy_accepts_the_generated_configuration(config, tmp_path):
    path = balancer.write_config(tmp_path / "haproxy.cfg", config)
    assert balancer.check_config(path) is None


def test_a_configuration_haproxy_refuses_is_reported_with_haproxys_words(tmp_path):
    path = balancer.write_config(tmp_path / "haproxy.cfg", "frontend x\n    bind nowhere:port\n")
    assert "nowhere" in (balancer.check_config(path) or "")


def test_haproxy_listens_on_the_port_and_every_web_node_is_a_health_checked_server(config):
    assert "bind 127.0.0.1:8000" in section(config, "frontend switchboard")
    backend = section(config, "backend web")
    assert [line for line in backend if line.startswith("server ")] == [
        "server web-1 127.0.0.1:8001 check", "server web-2 127.0.0.1:8002 check", "server web-3 127.0.0.1:8003 check"]


def test_a_node_is_in_rotation_only_while_readyz_answers_200_checked_every_second(config):
    backend = section(config, "backend web")
    assert "option httpchk GET /readyz HTTP/1.1" in backend
    assert "http-check send hdr Host localhost" in backend  # a host ALLOWED_HOSTS holds by default
    assert "http-check expect status 200" in backend
    assert "default-server inter 1s fall 1 rise 2" in backend
    assert not [line for line in backend if "shutdown-sessions" in line]  # a draining node closes its own


def test_websockets_get_a_long_tunnel_and_go_to_the_node_with_the_fewest_connections(config):
    defaults = section(config, "defaults")
    assert "mode http" in defaults and "timeout tunnel 1h" in defaults
    # SSE streams send a heartbeat every 30 s: plain HTTP silence may last longer than that
    assert "timeout server 60s" in defaults and "timeout client 60s" in defaults
    assert "balance leastconn" in section(config, "backend web")
    assert "option redispatch 1" in defaults and "retries 3" in defaults


def test_the_nodes_learn_the_clients_address_and_never_a_scheme_the_client_chose(config):
    frontend = section(config, "frontend switchboard")
    assert "option forwardfor" in frontend
    assert "http-request set-header X-Forwarded-Proto http" in frontend


def test_the_stats_page_is_on_the_loopback_interface_only(config):
    assert "bind 127.0.0.1:8004" in section(config, "listen stats")
    assert "listen stats" not in balancer.haproxy_config(port=8000, servers=SERVERS)


def test_haproxy_needs_a_web_node_behind_it():
    with pytest.raises(ValueError):
        balancer.haproxy_config(port=8000, servers=[])


def test_composes_haproxy_cfg_is_the_generated_one_and_haproxy_accepts_it():
    text = balancer.COMPOSE_FILE.read_text()
    assert text == balancer.compose_config(), "regenerate: python -m devstack.balancer --compose > platform/haproxy.cfg"
    assert balancer.check_config(balancer.COMPOSE_FILE) is None
    assert "server-template web 10 web:8000 check resolvers docker init-addr none" in section(text, "backend web")


def test_compose_and_make_run_share_every_rule_but_the_servers_and_composes_internal_listener(config):
    def rules(text: str) -> list[str]:
        kept, internal = [], False
        for line in text.splitlines()[1:]:
            internal = line == "frontend internal" or (internal and line.startswith(" "))
            if (line and not internal and "path_beg /internal/" not in line
                    and not re.match(r"\s*(bind|server|server-template|nameserver|hold)\b|resolvers", line)):
                kept.append(line)
        return kept

    assert rules(config) == rules(balancer.compose_config())


def test_compose_serves_the_calls_between_domains_only_on_the_internal_listener():
    compose = balancer.compose_config()
    assert "http-request deny deny_status 404 if { path_beg /internal/ }" in section(compose, "frontend switchboard")
    internal = section(compose, "frontend internal")
    assert "bind *:8001" in internal and "http-request deny deny_status 404 unless { path_beg /internal/ }" in internal
    published = (balancer.COMPOSE_FILE.parents[1] / "docker-compose.yml").read_text()
    assert '"${INTERNAL_BIND:-127.0.0.1}:${INTERNAL_PORT:-8001}:8001"' in published  # private, by default loopback


def test_one_web_node_keeps_the_plain_shape_on_the_port_itself():
    [web] = supervise._web_nodes({}, "127.0.0.1", 8000, [])
    assert web.name == "web" and web.env == {}  # its NODE_ID: the host name and port, as always
    assert web.argv[-4:] == ["--bind", "127.0.0.1", "--port", "8000"]


def test_three_web_nodes_get_their_own_node_id_and_port_and_trust_haproxy():
    nodes = supervise._web_nodes({"TRUSTED_PROXIES": "10.0.0.1"}, "0.0.0.0", 8000, [8001, 8002, 8003])
    assert [(n.name, n.env["NODE_ID"], n.env["PORT"]) for n in nodes] == [
        ("web-1", "web-1", "8001"), ("web-2", "web-2", "8002"), ("web-3", "web-3", "8003")]
    assert all(n.argv[-4:-2] == ["--bind", "127.0.0.1"] for n in nodes)  # only HAProxy faces the network
    assert {n.env["TRUSTED_PROXIES"] for n in nodes} == {"10.0.0.1,127.0.0.1"}
    assert [n.ready_url for n in nodes] == [f"http://127.0.0.1:{p}/readyz" for p in (8001, 8002, 8003)]


def test_workers_are_numbered_when_there_are_several():
    assert [w.name for w in supervise._workers(8000, 1)] == ["worker"]
    assert [w.name for w in supervise._workers(8000, 2)] == ["worker-1", "worker-2"]
    assert all("celery,routing" in w.argv for w in supervise._workers(8000, 2))


@pytest.mark.parametrize("value", ["0", "-1", "three"])
def test_a_node_count_that_is_not_a_positive_number_stops_make_run(value):
    with pytest.raises(SystemExit, match="WEB_NODES must be a whole number"):
        supervise._count({"WEB_NODES": value}, "WEB_NODES")


def test_a_taken_port_beside_port_is_replaced_by_a_free_one_rather_than_stopping_a_node():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1] - 2  # the second node's port is taken
        ports = supervise.side_ports(port, 3)
    assert ports[1] != port + 2 and len(set(ports)) == 3  # web-2 elsewhere, no port given twice
