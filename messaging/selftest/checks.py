"""The selftest's checks, one small function each, in the order the runner makes them. Each acts
as a client (over /ws and SSE) or as the app's server (the REST API, with the run's temporary key)
and raises CheckFailed saying what did not happen, or CheckSkipped saying why it cannot be made.

Users: `a` sends, `b` receives, `c` is the ACK-mode user, then the one whose coming and going the
master and the webhook are told about.
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from messaging.selftest.wire import CheckFailed, CheckSkipped, HookListener, Socket, message_with, ws_url
from messaging.webhooks.signing import SIGNATURE_HEADER, signature_verify


@dataclass
class Run:
    """One selftest run: the deployment, what the operator API gave it, and its open sockets."""

    base: str
    timeout: float
    grant: dict[str, Any]
    api: httpx.Client
    hooks: HookListener | None = None
    sockets: dict[str, Socket] = field(default_factory=dict)
    _counter: itertools.count = field(default_factory=itertools.count)

    @property
    def users(self) -> list[str]:
        return list(self.grant["users"])

    def nonce(self, what: str) -> str:
        return f"{self.grant['name']}-{what}-{next(self._counter)}"

    def login(self, role: str, user_id: str, token: str, *, acks: bool = False, auto_ack: bool = True) -> Socket:
        """`role`'s connection, logged in (an earlier one of the role is closed first)."""
        self.logout(role)
        sock = Socket(ws_url(self.base), self.timeout)
        self.sockets[role] = sock
        sock.auth(app_id=self.grant["app_id"], user_id=user_id, token=token, acks=acks)
        sock.auto_ack = acks and auto_ack
        return sock

    def login_user(self, role: str, index: int, *, acks: bool = False, auto_ack: bool = True) -> Socket:
        user_id = self.users[index]
        return self.login(role, user_id, self.grant["users"][user_id], acks=acks, auto_ack=auto_ack)

    def logout(self, role: str) -> None:
        sock = self.sockets.pop(role, None)
        if sock is not None:
            sock.close()

    def close_all(self) -> None:
        for role in list(self.sockets):
            self.logout(role)


def answered(response: httpx.Response, *expected: int) -> dict[str, Any]:
    if response.status_code not in expected:
        raise CheckFailed(f"{response.request.method} {response.request.url.path} answered {response.status_code}: "
                          f"{response.text[:200]}")
    return response.json() if response.content else {}


def authenticate(run: Run) -> str:
    run.login_user("a", 0, acks=True)  # the sender: MESSAGE_ACCEPTED says what was stored
    run.login_user("b", 1)
    return f"{run.users[0]}, {run.users[1]} on {run.grant['app_name']}"


def reliable_with_confirmation(run: Run) -> None:
    a, b = run.sockets["a"], run.sockets["b"]
    content, reference = run.nonce("reliable"), run.nonce("ref")
    a.send("MESSAGE", {"to": run.users[1], "content": content}, reference=reference, feature="RELIABLE",
           confirmationEnabled=True)
    a.expect(lambda f: f["type"] == "MESSAGE_ACCEPTED" and f.get("reference") == reference, "MESSAGE_ACCEPTED")
    got = b.expect(message_with(content), "the RELIABLE message at the recipient")
    if got.get("reference") != reference or not got["data"].get("id"):
        raise CheckFailed(f"the message arrived without its reference or id: {got}")
    a.expect(lambda f: f["type"] == "MESSAGE_CONFIRMATION" and f["data"].get("reference") == reference,
             "MESSAGE_CONFIRMATION at the sender")


def fast(run: Run) -> None:
    content = run.nonce("fast")
    run.sockets["a"].send("MESSAGE", {"to": run.users[1], "content": content}, feature="FAST")
    run.sockets["b"].expect(message_with(content), "the FAST message at the recipient")


def group(run: Run) -> None:
    c = run.login_user("c", 2)
    content = run.nonce("group")
    run.sockets["a"].send("GROUP_MESSAGE", {"to": [run.users[1], run.users[2]], "content": content})
    for who, sock in ((run.users[1], run.sockets["b"]), (run.users[2], c)):
        sock.expect(message_with(content), f"the GROUP_MESSAGE at {who}")


def fetch_after_offline(run: Run) -> None:
    run.logout("b")
    content = run.nonce("offline")
    run.sockets["a"].send("MESSAGE", {"to": run.users[1], "content": content}, reference=content)
    run.sockets["a"].expect(lambda f: f["type"] == "MESSAGE_ACCEPTED" and f.get("reference") == content,
                            "MESSAGE_ACCEPTED (stored while the recipient is offline)")
    b = run.login_user("b", 1)
    b.send("FETCH_MISSING_MESSAGES_REQUEST", {"count": 100})
    b.expect(message_with(content), "the missed message in the fetch")
    b.expect(lambda f: f["type"] == "FETCH_MISSING_MESSAGES_COMPLETE", "FETCH_MISSING_MESSAGES_COMPLETE")


def ack_redelivery(run: Run) -> None:
    c = run.login_user("c", 2, acks=True, auto_ack=False)  # acknowledged by hand, on the second connection
    content = run.nonce("ack")
    run.sockets["a"].send("MESSAGE", {"to": run.users[2], "content": content})
    first = c.expect(message_with(content), "the message at the ACK-mode recipient")
    c = run.login_user("c", 2, acks=True, auto_ack=False)  # closes the first connection before any ACK
    try:  # pushed right after AUTH_CLIENT_REPLY, once the server has taken the first connection's close
        again = c.expect(message_with(content), "the message pushed again", timeout=run.timeout / 2)
    except CheckFailed:  # the close was handled after the new login: a fetch returns it
        c.send("FETCH_MISSING_MESSAGES_REQUEST", {"count": 100})
        again = c.expect(message_with(content), "the unacknowledged message again on the next connection",
                         timeout=run.timeout / 2)
    if again["data"].get("id") != first["data"].get("id"):
        raise CheckFailed(f"redelivered with another id ({again['data'].get('id')} != {first['data'].get('id')})")
    c.send("ACK", {"ids": [again["data"]["id"]]})


def rest_send_and_status(run: Run) -> None:
    content = run.nonce("rest")
    body = {"to": run.users[1], "content": content, "from": run.users[0]}
    headers = {"Idempotency-Key": f"{run.grant['name']}-rest"}
    sent = answered(run.api.post("/api/v1/messages", json=body, headers=headers), 201)
    again = run.api.post("/api/v1/messages", json=body, headers=headers)
    if answered(again, 201).get("id") != sent["id"] or again.headers.get("Idempotent-Replayed") != "true":
        raise CheckFailed(f"a retry with the same Idempotency-Key was not a replay: {again.status_code} {again.text}")
    run.sockets["b"].expect(message_with(content), "the REST-sent message at the recipient")
    deadline = time.monotonic() + run.timeout
    while True:
        status = answered(run.api.get(f"/api/v1/messages/{sent['id']}"), 200)
        states = [d["state"] for d in status.get("deliveries", [])]
        if states == ["delivered"]:
            return
        if time.monotonic() > deadline:
            raise CheckFailed(f"timed out after {run.timeout:g} s waiting for status \"delivered\" (is {states})")
        time.sleep(0.1)


def publish(run: Run, content: str) -> None:
    answered(run.api.post("/messages", json={"channel": run.grant["channel"], "message": content}), 202)


def channel_over_ws(run: Run) -> str:
    b, channel = run.sockets["b"], run.grant["channel"]
    if run.grant["client_subscriptions"] and run.grant["channel_token"]:
        b.send("SUBSCRIBE", {"channel": channel, "token": run.grant["channel_token"]})
        b.expect(lambda f: f["type"] == "SUBSCRIBED" and f["data"].get("channel") == channel, "SUBSCRIBED")
        how = "SUBSCRIBE"
    else:  # the app keeps client subscriptions off: its server subscribes the user
        answered(run.api.put(f"/api/v1/channels/{channel}/subscribers/{run.users[1]}"), 200, 201)
        how = "server subscription"
    content = run.nonce("channel-ws")
    publish(run, content)
    b.expect(lambda f: f["type"] == "CHANNEL_MESSAGE" and f["data"].get("content") == content, "CHANNEL_MESSAGE")
    return how


def channel_over_sse(run: Run) -> None:
    if not run.grant["channel_token"]:
        raise CheckSkipped("the app has no token secret to grant a channel with")
    content = run.nonce("channel-sse")
    params = {"channels": run.grant["channel"], "token": run.grant["channel_token"]}
    timeout = httpx.Timeout(run.timeout)
    try:
        with httpx.Client(base_url=run.base, timeout=timeout) as sse, sse.stream("GET", "/sse/messages",
                                                                                   params=params) as stream:
            if stream.status_code != 200:
                stream.read()
                raise CheckFailed(f"GET /sse/messages answered {stream.status_code}: {stream.text[:200]}")
            deadline, published, event = time.monotonic() + run.timeout, False, ""
            for line in stream.iter_lines():
                if time.monotonic() > deadline:
                    break
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:") and event == "heartbeat" and not published:
                    publish(run, content)  # the stream is live once its first heartbeat came
                    published = True
                elif line.startswith("data:") and event == "message" and json.loads(line[5:]).get("message") == content:
                    return
    except httpx.TimeoutException:
        pass
    raise CheckFailed(f"timed out after {run.timeout:g} s waiting for the message on the SSE stream")


def presence(run: Run) -> None:
    if not run.grant["master"]:
        raise CheckSkipped(run.grant["master_skipped"] or "app has no master")
    master = run.login("master", run.grant["master"], run.grant["master_token"])
    user = run.users[2]
    run.logout("c")
    master.expect(lambda f: f["type"] == "USER_DISCONNECTED" and f["data"].get("userId") == user,
                  f"USER_DISCONNECTED {user} at the master")
    run.login_user("c", 2)
    master.expect(lambda f: f["type"] == "USER_CONNECTED" and f["data"].get("userId") == user,
                  f"USER_CONNECTED {user} at the master")


def webhook_signature(run: Run) -> str:
    """The test endpoint hears about the run's users coming and going, signed with its secret. A
    new endpoint is heard of by every node within seconds, so user `c` comes and goes until a call
    arrives."""
    if run.hooks is None:
        raise CheckSkipped("no --webhook-listen given")
    deadline = time.monotonic() + max(run.timeout, 15)
    while time.monotonic() < deadline:
        for call in run.hooks.taken():
            body = json.loads(call.body or b"{}")
            if body.get("app") != run.grant["app_id"] or body.get("data", {}).get("userId") not in run.users:
                continue
            header = call.headers.get(SIGNATURE_HEADER.lower(), "")
            if not signature_verify(secret=run.grant["webhook_secret"], header=header, body=call.body):
                raise CheckFailed(f"a {body.get('event')} call arrived with a signature that does not verify: "
                                  f"{header[:80]!r}")
            return f"{body.get('event')}, signed"
        run.logout("c")
        time.sleep(0.5)
        run.login_user("c", 2)
        time.sleep(0.5)
    raise CheckFailed(f"no webhook call reached {run.hooks.address[0]}:{run.hooks.address[1]} "
                      f"within {max(run.timeout, 15):g} s")
