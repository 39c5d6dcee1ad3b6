"""Three web nodes behind a real HAProxy, configured by devstack.balancer as `make run WEB_NODES=3`
does: the load-balancer system tests' cluster (tests/system/test_load_balancer.py, test_socketio_cluster.py)."""

from __future__ import annotations

from devstack import balancer
from tests.processes import free_port
from tests.wsclient import wait_for

NODES = ("web-1", "web-2", "web-3")


class Cluster:
    def __init__(self, factory, directory, workers: int = 1, **env: str):
        self.factory, self.env = factory, env
        self.nodes = {name: factory.web(name, NODE_ID=name, TRUSTED_PROXIES="127.0.0.1", **env) for name in NODES}
        for i in range(workers):
            factory.worker(f"worker-{i + 1}" if workers > 1 else "worker", **env)
        self.port, self.stats_port = free_port(), free_port()
        servers = [balancer.Server(name, proc.port) for name, proc in self.nodes.items()]
        config = balancer.write_config(directory / "haproxy.cfg", balancer.haproxy_config(
            port=self.port, servers=servers, stats_port=self.stats_port))
        self.lb = factory.spawn("haproxy", balancer.haproxy_argv(config))
        wait_for(lambda: self.states() == dict.fromkeys(NODES, "UP"), timeout=20)

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    def restart(self, name: str) -> None:
        """A node that ended (drained, killed) started again on its port, and back in rotation."""
        old = self.nodes[name]
        old.kill()
        self.nodes[name] = self.factory.web(name, port=old.port, NODE_ID=name, TRUSTED_PROXIES="127.0.0.1", **self.env)
        wait_for(lambda: self.states().get(name) == "UP", timeout=20)

    def states(self) -> dict[str, str]:
        try:
            return balancer.server_states(self.stats_port)
        except OSError:
            return {}


def live_nodes(users: list[str]) -> dict[str, str]:
    from presence.models import Session

    return dict(Session.objects.filter(user_id__in=users, disconnected_at__isnull=True).values_list("user_id", "node_id"))
