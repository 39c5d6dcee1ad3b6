"""The JavaScript client as a user gets it: clients/js packed with `npm pack`, installed from the
tarball into a fresh project (no registry: it has no dependencies), imported by its package name in
Node and used against a real web node; and its TypeScript declarations cover what it exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from apps_registry.services import api_key_create
from messaging.models import Delivery, DeliveryState
from tests.wsclient import wait_for

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "clients" / "js"
SOURCE = (PACKAGE / "switchboard.js").read_text()
DECLARATIONS = (PACKAGE / "switchboard.d.ts").read_text()

USE_IT = """
import { Switchboard } from "switchboard-client";

const [url, from, to] = process.argv.slice(2);
setTimeout(() => { console.error("timed out"); process.exit(3); }, 25000).unref();
const options = { url, appId: "app-id-343", acks: true };
const alice = new Switchboard({ ...options, userId: from });
const bob = new Switchboard({ ...options, userId: to });
for (const sb of [alice, bob]) sb.on("error", (e) => console.error(sb.options.userId, e.message));
const got = new Promise((resolve) => bob.on("message", resolve));
await Promise.all([alice.connect(), bob.connect()]);
const accepted = await alice.send(to, "hello from npm", { reference: "npm-1" });
const message = await got;
await new Promise((resolve) => setTimeout(resolve, 300)); // bob's ACK goes out (ackDelayMs)
alice.close();
bob.close();
console.log(JSON.stringify({ accepted, message }));
"""

LIST_EXPORTS = """
import * as sb from "switchboard-client";
const proto = sb.Switchboard.prototype;
const names = Object.getOwnPropertyNames(proto).filter((n) => n !== "constructor" && !n.startsWith("_"));
const isGetter = (n) => Object.getOwnPropertyDescriptor(proto, n).get !== undefined;
console.log(JSON.stringify({ exports: Object.keys(sb).sort(), methods: names.filter((n) => !isGetter(n)).sort(),
  getters: names.filter(isGetter).sort() }));
"""

ANSWER_IT = """
import { Switchboard } from "switchboard-client";

const [url, userId] = process.argv.slice(2);
setTimeout(() => { console.error("timed out"); process.exit(3); }, 25000).unref();
const sb = new Switchboard({ url, appId: "app-id-343", userId, acks: true });
sb.on("error", (e) => console.error(userId, e.message));
const asked = [];
sb.onRequest(async (content, request) => { asked.push(request); return { confirmed: content }; });
const answered = new Promise((resolve) => sb.on("answered", resolve));
await sb.connect();
console.log(JSON.stringify({ sessionId: sb.sessionId })); // the test asks the user now
const answer = await answered;
await new Promise((resolve) => setTimeout(resolve, 300)); // the ACK goes out (ackDelayMs)
sb.close();
console.log(JSON.stringify({ asked, answer }));
"""


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.fail("Node.js is needed to test the JavaScript client package: apt-get install nodejs (make sysdeps)")
    return node


def _websocket_flags(node: str) -> list[str]:
    """Node 22 has a global WebSocket; Node 20.10+ has it behind a flag."""
    probe = "process.exit(typeof WebSocket === 'function' ? 0 : 1)"
    for flags in ([], ["--experimental-websocket"]):
        if subprocess.run([node, *flags, "-e", probe], capture_output=True, timeout=30).returncode == 0:
            return flags
    version = subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()
    pytest.fail(f"Node.js {version} has no global WebSocket: the client package needs Node.js 22 or later "
                "(20.10+ with --experimental-websocket)")


def _npm(*args: str, cwd: Path) -> str:
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("npm is needed to pack and install the JavaScript client package")
    result = subprocess.run([npm, *args, "--no-audit", "--no-fund", "--loglevel=error"], cwd=cwd,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> dict:
    """A fresh npm project with switchboard-client installed from the tarball `npm pack` made."""
    where = tmp_path_factory.mktemp("npm")
    packed = json.loads(_npm("pack", str(PACKAGE), "--json", "--pack-destination", str(where), cwd=where))[0]
    app = where / "app"
    app.mkdir()
    (app / "package.json").write_text(json.dumps({"name": "a-switchboard-app", "private": True, "type": "module"}))
    _npm("install", "--offline", str(where / packed["filename"]), cwd=app)
    return {"dir": app, "packed": packed}


def test_the_package_holds_the_client_its_declarations_and_its_readme(project):
    packed = project["packed"]
    assert packed["name"] == "switchboard-client" and packed["filename"].endswith(".tgz")
    assert sorted(f["path"] for f in packed["files"]) == ["README.md", "package.json", "switchboard.d.ts",
                                                          "switchboard.js"]
    installed = project["dir"] / "node_modules" / "switchboard-client"
    assert (installed / "switchboard.js").read_text() == SOURCE
    manifest = json.loads((project["dir"] / "package.json").read_text())
    assert manifest["dependencies"]["switchboard-client"].startswith("file:")


def test_the_declarations_name_every_export_method_event_and_option_of_the_client(project):
    listed = subprocess.run([_node(), "--input-type=module", "-e", LIST_EXPORTS], cwd=project["dir"],
                            capture_output=True, text=True, timeout=30)
    assert listed.returncode == 0, listed.stderr
    found = json.loads(listed.stdout)
    assert found["exports"] == ["Switchboard", "default", "reconnectDelay"]
    assert "export function reconnectDelay(" in DECLARATIONS and "export default Switchboard;" in DECLARATIONS
    declared_class = DECLARATIONS.split("export class Switchboard {", 1)[1]
    declared_methods = set(re.findall(r"^  (\w+)(?:<[^>]*>)?\(", declared_class, re.MULTILINE)) - {"constructor"}
    assert sorted(declared_methods) == found["methods"]
    declared_getters = set(re.findall(r"^  readonly (\w+):", declared_class, re.MULTILINE))
    assert set(found["getters"]) <= declared_getters and "sessionId" in found["getters"]
    emitted = set(re.findall(r'_emit\("(\w+)"', SOURCE)) | {"message", "confirmation"}  # (those two by type)
    events = DECLARATIONS.split("export interface SwitchboardEvents {", 1)[1].split("}\n", 1)[0]
    assert set(re.findall(r"^  (\w+):", events, re.MULTILINE)) == emitted
    defaults = SOURCE.split("const DEFAULTS = {", 1)[1].split("};", 1)[0]
    options = DECLARATIONS.split("export interface SwitchboardOptions {", 1)[1].split("\n}", 1)[0]
    assert set(re.findall(r"^  (\w+):", defaults, re.MULTILINE)) <= set(re.findall(r"^  (\w+)\??:", options,
                                                                                   re.MULTILINE))
    # The TypeScript compiler, where this machine has one offline, checks them too.
    tsc = shutil.which("tsc") or shutil.which("tsc", path=str(ROOT / "tests" / "node" / "node_modules" / ".bin"))
    if tsc:
        (project["dir"] / "use.ts").write_text(
            'import { Switchboard, type SendResult } from "switchboard-client";\n'
            'const sb = new Switchboard({ url: "ws://h/ws", appId: "a", userId: "ANZ-1", acks: true });\n'
            'sb.on("message", (m) => m.content.length);\n'
            'export async function go(): Promise<SendResult> { await sb.connect(); return sb.send("ANZ-2", "hi"); }\n')
        checked = subprocess.run([tsc, "--noEmit", "--strict", "--module", "nodenext", "--moduleResolution", "nodenext",
                                  "use.ts"], cwd=project["dir"], capture_output=True, text=True, timeout=120)
        assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.system
@pytest.mark.django_db
def test_an_app_that_installed_the_package_sends_a_reliable_message_in_ack_mode_and_it_is_received(project, node):
    runtime = _node()
    (project["dir"] / "use.mjs").write_text(USE_IT)
    result = subprocess.run([runtime, *_websocket_flags(runtime), "use.mjs", node.ws_url, "ANZ-52001", "ANZ-52002"],
                            cwd=project["dir"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    accepted, message = answer["accepted"], answer["message"]
    assert accepted["id"].isdigit() and accepted["duplicate"] is False and accepted["recipients"] == 1
    assert message == {"from": "ANZ-52001", "content": "hello from npm", "id": accepted["id"], "seq": message["seq"],
                       "reference": "npm-1"}
    wait_for(lambda: Delivery.objects.filter(message_id=int(accepted["id"]), state=DeliveryState.DELIVERED).count() == 1)


@pytest.fixture(scope="module")
def api_key(demo_network, django_db_blocker) -> str:
    """The app's server: an API key of ANZ (the app the Node scripts log in to)."""
    with django_db_blocker.unblock():
        return api_key_create(app=demo_network["anz"], name="js package tests")[1]


@pytest.mark.system
@pytest.mark.django_db
def test_an_app_that_installed_the_package_answers_a_request_its_server_made_through_the_rest_api(project, node,
                                                                                                 api_key):
    runtime = _node()
    (project["dir"] / "answer.mjs").write_text(ANSWER_IT)
    script = subprocess.Popen([runtime, *_websocket_flags(runtime), "answer.mjs", node.ws_url, "ANZ-52011"],
                              cwd=project["dir"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        connected = json.loads(script.stdout.readline() or "{}")  # (the script gives up by itself after 25 s)
        asked = httpx.post(f"{node.url}/api/v1/users/ANZ-52011/requests", json={"content": "confirm order 9?"},
                           headers={"Authorization": f"Bearer {api_key}"}, timeout=10)
        out, err = script.communicate(timeout=60)
    finally:
        script.kill()
    assert script.returncode == 0, out + err
    assert connected["sessionId"]
    assert asked.status_code == 201, asked.text
    request_id = asked.json()["id"]
    answer = json.loads(out.strip().splitlines()[-1])
    [request] = answer["asked"]
    assert (request["requestId"], request["content"]) == (request_id, "confirm order 9?")
    assert answer["answer"] == {"requestId": request_id, "type": "resolve", "content": '{"confirmed":"confirm order 9?"}',
                                "replay": False}
    state = httpx.get(f"{node.url}/api/v1/requests/{request_id}", headers={"Authorization": f"Bearer {api_key}"},
                      timeout=10).json()
    assert (state["direction"], state["state"], state["outcome_content"]) == (
        "to_client", "resolved", '{"confirmed":"confirm order 9?"}')
    wait_for(lambda: Delivery.objects.filter(message_id=int(request["id"]), state=DeliveryState.DELIVERED).count() == 1)
