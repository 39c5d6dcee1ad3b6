"""The Python client as a user gets it: clients/python built into a wheel, installed into a fresh
virtual environment (no Django there, nothing of the server), and used against a real web node: the
app's server sends through the REST API with its API key, and a user's Realtime connection in ACK
mode receives it and a message from another Realtime user."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from switchboard_client.backoff import Backoff as ClientBackoff

from apps_registry.services import api_key_create
from foundation.backoff import Backoff
from messaging.models import Delivery, DeliveryState
from tests.wsclient import wait_for

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "clients" / "python"

USE_IT = """
import asyncio, importlib.util, json, sys

import switchboard_client
from switchboard_client import Realtime, SwitchboardClient

url, ws_url, key = sys.argv[1:4]
assert importlib.util.find_spec("django") is None, "Django is installed here"
assert importlib.util.find_spec("foundation") is None and importlib.util.find_spec("messaging") is None


async def main():
    with SwitchboardClient(url, key) as api:
        from_server = await asyncio.to_thread(api.send, "ANZ-53002", "from the server", reference="srv-1")
    options = dict(app_id="app-id-343", acks=True)
    async with Realtime(ws_url, user_id="ANZ-53001", **options) as alice, \\
            Realtime(ws_url, user_id="ANZ-53002", **options) as bob:
        got, two = [], asyncio.Event()

        async def read():
            async for message in bob.messages():  # each acknowledged once the loop moves on
                got.append({"from": message.sender, "content": message.content, "id": message.id})
                if len(got) == 2:
                    two.set()

        reader = asyncio.create_task(read())
        accepted = await alice.send("ANZ-53002", "from alice")
        await two.wait()
    await reader  # closing the client ended the loop
    print(json.dumps({"server": from_server["id"], "alice": accepted.id, "duplicate": accepted.duplicate,
                      "got": got, "file": switchboard_client.__file__, "django": "django" in sys.modules}))


asyncio.run(asyncio.wait_for(main(), 30))
"""


def _run(argv: list, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=180, **kwargs)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory) -> dict:
    """A new virtual environment (without the system's or the project's packages) with the wheel
    of clients/python installed; httpx and websockets come from the package index."""
    where = tmp_path_factory.mktemp("pip")
    wheels = where / "wheels"
    # Built by the project's locked setuptools (no isolated build fetching another).
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", wheels, PACKAGE])
    built = sorted(wheels.glob("switchboard_client-*.whl"))
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(where / "venv")
    python = where / "venv" / "bin" / "python"
    _run([python, "-m", "pip", "install", "--quiet", "--find-links", wheels, "switchboard-client"])
    return {"python": python, "wheels": built, "dir": where}


@pytest.mark.system  # (its fresh environment gets httpx and websockets from the package index)
def test_the_wheel_holds_the_package_and_its_typing_marker_and_needs_only_httpx_and_websockets(fresh_venv):
    assert [w.name for w in fresh_venv["wheels"]] == ["switchboard_client-0.1.0-py3-none-any.whl"]
    shown = _run([fresh_venv["python"], "-c", "import importlib.metadata as m, json; "
                  "print(json.dumps({'requires': m.requires('switchboard-client'), "
                  "'files': [str(f) for f in m.files('switchboard-client')]}))"])
    found = json.loads(shown.stdout)
    assert sorted(r.split(">")[0].split("<")[0].split("=")[0] for r in found["requires"]) == ["httpx", "websockets"]
    assert {"switchboard_client/py.typed", "switchboard_client/realtime.py", "switchboard_client/rest.py",
            "switchboard_client/backoff.py"} <= set(found["files"])


@pytest.fixture(scope="module")
def api_key(demo_network, django_db_blocker) -> str:
    with django_db_blocker.unblock():
        return api_key_create(app=demo_network["anz"], name="python package test")[1]


@pytest.mark.system
@pytest.mark.django_db
def test_an_app_that_installed_the_wheel_sends_by_rest_and_receives_in_ack_mode_with_realtime(fresh_venv, node,
                                                                                               api_key):
    script = fresh_venv["dir"] / "use_it.py"
    script.write_text(USE_IT)
    result = _run([fresh_venv["python"], script, node.url, node.ws_url, api_key], cwd=fresh_venv["dir"])
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["file"].startswith(str(fresh_venv["dir"] / "venv")) and answer["django"] is False
    assert sorted(answer["got"], key=lambda m: m["from"]) == [  # (either may come first)
        {"from": "ANZ-123223", "content": "from the server", "id": answer["server"]},
        {"from": "ANZ-53001", "content": "from alice", "id": answer["alice"]}]
    assert answer["duplicate"] is False
    for message_id in (answer["server"], answer["alice"]):  # both acknowledged by bob's loop
        wait_for(lambda m=message_id: Delivery.objects.filter(message_id=int(m), state=DeliveryState.DELIVERED).exists())


def test_the_packages_copy_of_the_backoff_waits_as_the_platforms():
    for base, cap, jitter in [(0.4, 30.0, 0.0), (2.0, 60.0, 0.5), (1.0, 16.0, 0.0)]:
        ours, theirs = ClientBackoff(base, cap, jitter), Backoff(base, cap, jitter)
        for failures in (0, 1, 2, 5, 9, 40, 10_000):
            random.seed(failures)
            expected = theirs.seconds(failures)
            random.seed(failures)
            assert ours.seconds(failures) == expected
