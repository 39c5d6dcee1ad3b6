"""The building's structure (docs/architecture.md, "Layers"): layers point down, nothing goes in
circles, and an import hidden inside a function counts as much as one at the top of a module.

    foundation  <-  apps_registry  <-  presence  <-  messaging  <-  analytics  <-  config
    (imports no app)                                                (the composition root)
    devstack: the development machinery, imported by no product module but the local settings
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {  # top-level package -> its folder
    "foundation": ROOT / "platform" / "foundation",
    "apps_registry": ROOT / "apps_registry",
    "presence": ROOT / "presence",
    "messaging": ROOT / "messaging",
    "analytics": ROOT / "analytics",
    "config": ROOT / "platform" / "config",
    "devstack": ROOT / "platform" / "devstack",
}
PRODUCT = ["foundation", "apps_registry", "presence", "messaging", "analytics", "config"]  # bottom to top
DEVSTACK_ALLOWED_IN = {"config.settings.local"}  # reads where the embedded services run; starts nothing


def _modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            if "migrations" in path.parts:
                continue
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, ast.stmt]]:
    """(project module imported, the statement) for every import in the module, wherever it stands."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.append((target, node))
    return found


GRAPH = {name: {target for target, _ in _imports(name, path)} for name, path in MODULES.items()}


def _layer(module: str) -> str:
    return module.split(".")[0]


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_a_layer_never_imports_one_above_it(package):
    offenders = []
    for module, targets in GRAPH.items():
        if _layer(module) != package:
            continue
        for target in targets:
            layer = _layer(target)
            if layer == "devstack" and package != "devstack":
                wrong = module not in DEVSTACK_ALLOWED_IN
            elif package == "devstack":
                wrong = layer != "devstack"
            else:
                wrong = layer in PRODUCT and PRODUCT.index(layer) > PRODUCT.index(package)
            if wrong:
                offenders.append(f"{module} imports {target}")
    assert offenders == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph.get(successor, ())))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_an_import_inside_a_function_counts_as_much_as_one_at_the_top(tmp_path):
    module = tmp_path / "probe.py"
    module.write_text("from messaging.core import protocol\n\ndef later():\n    from messaging.core.store import messages_store\n")
    assert {target for target, _ in _imports("messaging.probe", module)} == {"messaging.core", "messaging.core.protocol",
                                                                             "messaging.core.store"}


def test_the_cycle_finder_finds_a_cycle_and_only_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_the_project_modules_function_level_imports_included():
    assert _cycles(GRAPH) == []


def test_every_import_inside_a_function_of_the_product_says_why_it_must_be_there():
    unexplained = []
    for module, path in MODULES.items():
        if _layer(module) == "devstack":
            continue
        lines = path.read_text().splitlines()
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    line, above = lines[node.lineno - 1], lines[node.lineno - 2].strip()
                    if "#" not in line and not above.startswith("#"):
                        unexplained.append(f"{path.relative_to(ROOT)}:{node.lineno}: {line.strip()}")
    assert unexplained == []


def test_the_door_from_stored_to_routed_imports_nothing_else_of_messaging():
    assert sorted(target for target in GRAPH["foundation.handoff"] if _layer(target) == "messaging") == []


def test_the_tasks_are_reached_by_name_only():
    """Nothing in the product imports messaging.routing.tasks: work reaches the workers through the door of
    foundation.handoff, by task name, so storing a message never depends on the code that routes it."""
    assert sorted(module for module, targets in GRAPH.items() if "messaging.routing.tasks" in targets) == []


# Inside messaging (docs/architecture.md, "Rooms"): capability packages, bottom to top. A module imports
# its own room and the rooms below it, never one above. The tables (messaging.models and each room's
# models, which it registers) are the floor every room stands on; the modules left loose at the top
# (admin, apps, urls) and the management commands are entry points above them all.
MESSAGING_ROOMS = [
    "webhooks",    # the app's server told what happened (recorded with the change, called by the workers)
    "core",        # a message accepted and stored: protocol, accept, store, idempotency, delivery, receipts
    "channels",    # channel publishes, history and subscriptions
    "federation",  # forwarded between domains: the wire, the link senders, order, standby, takeover
    "requests",    # requests to the app's server and its answers, stored as outcomes; server requests to clients
    "intake",      # taken in from servers: the node's group commit, REST sends, batches, the Redis stream
    "routing",     # routed: the router and the workers' tasks (which run everything below)
    "gateway",     # comes in: /ws, Socket.IO, SSE and stream sockets, the node runtime, drain, limits
    "exchange",    # the ordered event exchange (its own door, `manage.py eventsource`)
    "selftest",    # the platform checking a live deployment
    "api",         # the REST API
    "management",  # manage.py commands
]
MESSAGING_FLOOR = "models"
MESSAGING_TOP = {"messaging.admin", "messaging.apps", "messaging.urls"}


def _room(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "messaging" or len(parts) < 2:
        return None
    if module in MESSAGING_TOP:
        return "top"
    if parts[-1] == "models":
        return MESSAGING_FLOOR
    return parts[1]


def _rank(room: str) -> int:
    if room == MESSAGING_FLOOR:
        return -1
    if room == "top":
        return len(MESSAGING_ROOMS)
    return MESSAGING_ROOMS.index(room)


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import inside messaging that points up a room (or out of the floor)."""
    offenders = []
    for module, targets in graph.items():
        room = _room(module)
        if room is None:
            continue
        for target in targets:
            other = _room(target)
            if other is not None and other != room and _rank(other) > _rank(room):
                offenders.append(f"{module} imports {target}")
    return sorted(offenders)


def test_every_module_of_messaging_lives_in_a_room_or_is_one_of_the_few_at_the_top():
    loose = sorted(m for m in GRAPH if _room(m) not in (None, "top", MESSAGING_FLOOR, *MESSAGING_ROOMS))
    assert loose == []


def test_an_import_that_points_up_a_room_is_found():
    graph = {"messaging.core.store": {"messaging.federation.links", "messaging.models"},
             "messaging.gateway.consumers": {"messaging.core.store", "messaging.channels.hub"},
             "messaging.federation.models": {"messaging.channels.models"}}
    assert _upward(graph) == ["messaging.core.store imports messaging.federation.links"]


def test_inside_messaging_every_import_points_down_a_room():
    assert _upward(GRAPH) == []
