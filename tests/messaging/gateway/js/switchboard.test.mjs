// The logic of clients/js/switchboard.js against a fake WebSocket (no server).
// Run: node --test tests/messaging/gateway/js/ (tests/messaging/gateway/test_switchboard_js.py runs it under pytest).
import assert from "node:assert/strict";
import { afterEach, test } from "node:test";

import { reconnectDelay, Switchboard } from "../../../../clients/js/switchboard.js";

class FakeSocket {
  static all = [];
  static taken = 0;

  constructor(url) {
    this.url = url;
    this.readyState = 0;
    this.sent = [];
    this.closedWith = null;
    FakeSocket.all.push(this);
  }

  send(text) {
    this.sent.push(JSON.parse(text));
  }

  close(code) {
    this.readyState = 3;
    this.closedWith = code;
  }

  // --- what the server does ---
  open() {
    this.readyState = 1;
    this.onopen?.({});
  }

  receive(type, data = {}, extra = {}) {
    this.onmessage?.({ data: JSON.stringify({ type, data, ...extra }) });
  }

  drop(code = 1006, reason = "") {
    this.readyState = 3;
    this.onclose?.({ code, reason });
  }

  sentOf(type) {
    return this.sent.filter((f) => f.type === type);
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const clients = [];

function client(options = {}) {
  const sb = new Switchboard({
    url: "ws://test/ws", appId: "app-id-343", userId: "ANZ-1001", WebSocket: FakeSocket,
    minDelayMs: 1, firstMaxDelayMs: 2, maxDelayMs: 4, ackDelayMs: 1, sendsPerSecond: 1000, sendBurst: 1000,
    ...options,
  });
  sb.on("error", () => {}); // the tests look at outcomes, not at warnings
  clients.push(sb);
  return sb;
}

/** The next socket the client opens that the test has not looked at yet (opening may be async). */
async function nextSocket() {
  for (let i = 0; i < 200 && FakeSocket.all.length <= FakeSocket.taken; i++) await sleep(2);
  assert.ok(FakeSocket.all.length > FakeSocket.taken, "the client opened no new socket");
  return FakeSocket.all[FakeSocket.taken++];
}

/** Open the next socket and authenticate it; its fetch is answered with nothing missing. */
async function authenticated(sb) {
  const ws = await nextSocket();
  ws.open();
  ws.receive("AUTH_CLIENT_REPLY", { appId: "app-id-343", userId: "ANZ-1001", isAuthenticated: true });
  ws.receive("FETCH_MISSING_MESSAGES_COMPLETE", { leftMissingCount: 0 });
  await sleep(0);
  return ws;
}

afterEach(() => {
  clients.splice(0).forEach((sb) => sb.close());
  FakeSocket.all = [];
  FakeSocket.taken = 0;
});

test("the first reconnect waits 0.5 to 2 s, then the ceiling doubles up to a minute", () => {
  const opts = { minDelayMs: 500, firstMaxDelayMs: 2000, maxDelayMs: 60000 };
  assert.equal(reconnectDelay(0, 1006, opts, () => 0), 500);
  assert.equal(reconnectDelay(0, 1006, opts, () => 1), 2000);
  const ceilings = [0, 1, 2, 3, 4, 5, 6, 10].map((n) => reconnectDelay(n, 1006, opts, () => 1));
  assert.deepEqual(ceilings, [2000, 4000, 8000, 16000, 32000, 60000, 60000, 60000]);
  for (let n = 0; n < 12; n++) {
    for (let i = 0; i < 200; i++) {
      const delay = reconnectDelay(n, 1011, opts);
      assert.ok(delay >= 500 && delay <= Math.min(60000, 2000 * 2 ** n), `attempt ${n}: ${delay}`);
    }
  }
});

test("the jitter spreads reconnects over the whole window rather than a fixed delay", () => {
  const delays = Array.from({ length: 500 }, () => reconnectDelay(3, 1006));
  assert.ok(Math.min(...delays) < 2000 && Math.max(...delays) > 14000);
  assert.ok(new Set(delays).size > 100);
});

test("a restart (1012) or a slow-reader close (4002) reconnects promptly whatever the attempt", () => {
  const opts = { minDelayMs: 500, firstMaxDelayMs: 2000, maxDelayMs: 60000 };
  for (const code of [1012, 4002]) {
    assert.equal(reconnectDelay(9, code, opts, () => 1), 2000);
  }
  assert.equal(reconnectDelay(9, 1013, opts, () => 1), 60000);
});

test("it authenticates with a token asked for again before every connection, then fetches", async () => {
  let asked = 0;
  const sb = client({ acks: true, token: async () => `token-${++asked}` });
  const connected = sb.connect();
  const ws = await nextSocket();
  ws.open();
  assert.deepEqual(ws.sent[0], { type: "AUTH_CLIENT",
    data: { appId: "app-id-343", userId: "ANZ-1001", token: "token-1", acks: true } });
  ws.receive("AUTH_CLIENT_REPLY", { isAuthenticated: true });
  await connected;
  assert.equal(sb.state, "connected");
  assert.deepEqual(ws.sentOf("FETCH_MISSING_MESSAGES_REQUEST")[0].data, { count: 100 });

  ws.drop(1006);
  const again = await nextSocket();
  again.open();
  assert.equal(again.sent[0].data.token, "token-2");
});

test("it fetches again until nothing is left missing", async () => {
  const sb = client();
  let synced = 0;
  sb.on("synced", () => synced++);
  sb.connect();
  const ws = await nextSocket();
  ws.open();
  ws.receive("AUTH_CLIENT_REPLY", { isAuthenticated: true });
  ws.receive("MESSAGE", { from: "ANZ-2", content: "a", id: "1", seq: 1 });
  ws.receive("FETCH_MISSING_MESSAGES_COMPLETE", { leftMissingCount: 1 });
  ws.receive("MESSAGE", { from: "ANZ-2", content: "b", id: "2", seq: 2 });
  ws.receive("FETCH_MISSING_MESSAGES_COMPLETE", { leftMissingCount: 0 });
  assert.equal(ws.sentOf("FETCH_MISSING_MESSAGES_REQUEST").length, 2);
  assert.equal(synced, 1);
});

test("closes 1000 and 1008 end the client; every other close reconnects with a delay", async () => {
  for (const code of [1000, 1008]) {
    const sb = client();
    const disconnects = [];
    sb.on("disconnected", (d) => disconnects.push(d));
    const connected = sb.connect();
    const ws = await nextSocket();
    ws.open();
    ws.drop(code, "invalid token");
    await assert.rejects(connected, /invalid token/);
    await sleep(20);
    assert.equal(sb.state, "closed");
    assert.deepEqual(disconnects, [{ code, reason: "invalid token", willReconnect: false }]);
    assert.equal(FakeSocket.all.length, 1);
    FakeSocket.all = [];
    FakeSocket.taken = 0;
  }
  for (const code of [1006, 1009, 1011, 1012, 1013, 4001, 4002, 4003]) {
    const sb = client();
    const waits = [];
    sb.on("reconnecting", (r) => waits.push(r));
    sb.connect();
    const ws = await authenticated(sb);
    ws.drop(code);
    assert.equal(sb.state, "reconnecting");
    assert.ok(waits[0].delayMs >= 1 && waits[0].delayMs <= 2, `close ${code}`);
    await authenticated(sb);
    assert.equal(sb.state, "connected", `close ${code}`);
    sb.close();
    FakeSocket.all = [];
    FakeSocket.taken = 0;
  }
});

test("the backoff grows while connecting fails and starts over after a stable connection", async () => {
  const sb = client({ minDelayMs: 1, firstMaxDelayMs: 1, maxDelayMs: 1000, random: () => 1, stableMs: 30 });
  const waits = [];
  sb.on("reconnecting", (r) => waits.push(r.delayMs));
  sb.connect();
  for (let i = 0; i < 4; i++) (await nextSocket()).drop(1006);
  assert.deepEqual(waits, [1, 2, 4, 8]);
  const ws = await authenticated(sb);
  await sleep(60); // stable
  ws.drop(1006);
  assert.equal(waits.at(-1), 1);
});

test("close() stops reconnecting and rejects what is still waiting", async () => {
  const sb = client({ acks: true });
  sb.connect();
  const ws = await authenticated(sb);
  const pending = sb.send("ANZ-2", "never accepted");
  sb.close();
  await assert.rejects(pending, /closed/);
  assert.equal(ws.closedWith, 1000);
  await sleep(30);
  assert.equal(FakeSocket.all.length, 1);
  assert.equal(sb.state, "closed");
});

test("a message that comes again with the same id is shown once (and acknowledged again)", async () => {
  const sb = client({ acks: true });
  const shown = [];
  sb.on("message", (m) => shown.push(m));
  sb.connect();
  const ws = await authenticated(sb);
  ws.receive("MESSAGE", { from: "ANZ-2", content: "hi", id: "77", seq: 3 }, { reference: "r-1" });
  ws.receive("MESSAGE", { from: "ANZ-2", content: "hi", id: "77", seq: 3 }, { reference: "r-1" });
  ws.receive("MESSAGE", { from: "ANZ-2", content: "fast" }); // FAST: no id, always shown
  await sleep(10);
  assert.deepEqual(shown, [
    { from: "ANZ-2", content: "hi", id: "77", seq: 3, reference: "r-1" },
    { from: "ANZ-2", content: "fast", id: undefined, seq: undefined, reference: undefined },
  ]);
  assert.deepEqual(ws.sentOf("ACK").flatMap((f) => f.data.ids), ["77", "77"]);
  assert.equal(ws.sentOf("ACK").length, 1, "ACKs go out together");
});

test("the memory of seen ids is bounded: the oldest are forgotten", async () => {
  const sb = client({ seenIds: 3 });
  const shown = [];
  sb.on("message", (m) => shown.push(m.id));
  sb.connect();
  const ws = await authenticated(sb);
  for (const id of ["1", "2", "3", "4", "1", "4"]) ws.receive("MESSAGE", { from: "ANZ-2", content: "x", id, seq: 1 });
  assert.deepEqual(shown, ["1", "2", "3", "4", "1"]);
});

test("ACK mode acknowledges after an async handler resolves, and not when it throws", async () => {
  const sb = client({ acks: true });
  let release;
  const shown = [];
  sb.on("message", (m) => shown.push(m.content));
  sb.on("message", (m) => (m.content === "slow" ? new Promise((r) => { release = r; }) : undefined));
  sb.on("message", (m) => { if (m.content === "bad") throw new Error("handler bug"); });
  sb.connect();
  const ws = await authenticated(sb);
  ws.receive("MESSAGE", { from: "ANZ-2", content: "slow", id: "1", seq: 1 });
  ws.receive("MESSAGE", { from: "ANZ-2", content: "bad", id: "2", seq: 2 });
  ws.receive("MESSAGE_CONFIRMATION", { reference: "r", id: "3", seq: 3 });
  await sleep(10);
  assert.deepEqual(ws.sentOf("ACK").flatMap((f) => f.data.ids), ["3"]);
  release();
  await sleep(10);
  assert.deepEqual(ws.sentOf("ACK").flatMap((f) => f.data.ids), ["3", "1"]);
  ws.receive("MESSAGE", { from: "ANZ-2", content: "bad", id: "2", seq: 2 }); // comes again: shown again
  assert.deepEqual(shown, ["slow", "bad", "bad"]);
});

test("an ACK frame holds at most 2000 ids", async () => {
  const sb = client({ acks: true });
  sb.connect();
  const ws = await authenticated(sb);
  for (let i = 1; i <= 4500; i++) ws.receive("MESSAGE", { from: "ANZ-2", content: "x", id: String(i), seq: i });
  await sleep(10);
  assert.deepEqual(ws.sentOf("ACK").map((f) => f.data.ids.length), [2000, 2000, 500]);
});

test("ACK mode: a send is resent after a reconnect with its clientMessageId until accepted", async () => {
  const sb = client({ acks: true });
  sb.connect();
  const first = await authenticated(sb);
  const sending = sb.send("ANZ-2", "hello", { reference: "ref-1" });
  const accepted = sb.send("ANZ-2", "already taken");
  const [frame, other] = first.sentOf("MESSAGE");
  assert.match(frame.data.clientMessageId, /^sb-/);
  assert.deepEqual(frame, { type: "MESSAGE", reference: "ref-1",
    data: { to: "ANZ-2", content: "hello", clientMessageId: frame.data.clientMessageId } });
  first.receive("MESSAGE_ACCEPTED", { id: "9", clientMessageId: other.data.clientMessageId, recipients: 1 });
  assert.equal((await accepted).id, "9");
  first.drop(1012);

  const second = await authenticated(sb);
  assert.deepEqual(second.sentOf("MESSAGE"), [frame]);
  second.receive("MESSAGE_ACCEPTED", { id: "8", clientMessageId: frame.data.clientMessageId, recipients: 1,
    duplicate: true });
  assert.deepEqual(await sending, { id: "8", clientMessageId: frame.data.clientMessageId, recipients: 1,
    duplicate: true });
  second.drop(1006);
  const third = await authenticated(sb);
  assert.deepEqual(third.sentOf("MESSAGE"), []);
});

test("ACK mode: a group send is matched to its acceptance by its clientMessageId", async () => {
  const sb = client({ acks: true });
  sb.connect();
  const ws = await authenticated(sb);
  const a = sb.sendGroup(["ANZ-2", "ANZ-3"], "to both");
  const b = sb.sendGroup(["ANZ-4"], "to one", { clientMessageId: "mine-1" });
  const [first, second] = ws.sentOf("GROUP_MESSAGE");
  assert.match(first.data.clientMessageId, /^sb-/);
  assert.equal(second.data.clientMessageId, "mine-1");
  ws.receive("MESSAGE_ACCEPTED", { id: "2", clientMessageId: "mine-1", recipients: 1 });
  ws.receive("MESSAGE_ACCEPTED", { id: "1", clientMessageId: first.data.clientMessageId, recipients: 2 });
  assert.equal((await a).id, "1");
  assert.equal((await b).id, "2");
});

test("ACK mode: an acceptance without a clientMessageId belongs to the oldest group send waiting", async () => {
  const sb = client({ acks: true });
  sb.connect();
  const ws = await authenticated(sb);
  const a = sb.sendGroup(["ANZ-2", "ANZ-3"], "to both");
  const b = sb.sendGroup(["ANZ-4"], "to one");
  ws.receive("MESSAGE_ACCEPTED", { id: "1", recipients: 2 });
  ws.receive("MESSAGE_ACCEPTED", { id: "2", recipients: 1 });
  assert.equal((await a).id, "1");
  assert.equal((await b).id, "2");
});

test("ACK mode: a group send is resent after a reconnect with the same clientMessageId", async () => {
  const sb = client({ acks: true });
  sb.connect();
  const first = await authenticated(sb);
  const sending = sb.sendGroup(["ANZ-2", "ANZ-3"], "to both");
  const [frame] = first.sentOf("GROUP_MESSAGE");
  first.drop(1006);
  const second = await authenticated(sb);
  assert.deepEqual(second.sentOf("GROUP_MESSAGE"), [frame]);
  second.receive("MESSAGE_ACCEPTED", { id: "5", clientMessageId: frame.data.clientMessageId, recipients: 2,
    duplicate: true });
  assert.deepEqual(await sending, { id: "5", clientMessageId: frame.data.clientMessageId, recipients: 2,
    duplicate: true });
});

test("sends made while disconnected wait, in order, and go out after authentication", async () => {
  const sb = client({ maxQueued: 2 });
  const one = sb.send("ANZ-2", "one");
  const two = sb.sendGroup(["ANZ-2", "ANZ-3"], "two", { feature: "FAST" });
  await assert.rejects(sb.send("ANZ-2", "three"), /queue full/);
  sb.connect();
  const ws = await authenticated(sb);
  assert.deepEqual(ws.sent.filter((f) => f.type.endsWith("MESSAGE")).map((f) => f.data.content), ["one", "two"]);
  assert.equal(ws.sentOf("GROUP_MESSAGE")[0].feature, "FAST");
  assert.equal((await one).sent, true); // linker mode: written is all the protocol says
  assert.equal((await two).sent, true);
});

test("a rate-limited send goes again after retryAfterMs; another refusal rejects it", async () => {
  const sb = client({ acks: true });
  sb.connect();
  const ws = await authenticated(sb);
  const limited = sb.send("ANZ-2", "again");
  const bad = sb.send("ANZ-5000000", "nobody");
  const [first, second] = ws.sentOf("MESSAGE");
  ws.receive("INVALID_MESSAGE", { reason: "rate limit exceeded", retryAfterMs: 30, data: first.data });
  ws.receive("INVALID_MESSAGE", { reason: "unknown recipient 'ANZ-5000000'", data: second.data });
  await assert.rejects(bad, (err) => err.reason.startsWith("unknown recipient") && err.data.to === "ANZ-5000000");
  await sleep(10);
  assert.equal(ws.sentOf("MESSAGE").length, 2, "not before the delay");
  await sleep(40);
  assert.deepEqual(ws.sentOf("MESSAGE")[2], first);
  ws.receive("MESSAGE_ACCEPTED", { id: "5", clientMessageId: first.data.clientMessageId, recipients: 1 });
  assert.equal((await limited).id, "5");
});

test("server busy is retried too; content over the limit (no echo) rejects the waiting send", async () => {
  const sb = client({ acks: true });
  sb.connect();
  const ws = await authenticated(sb);
  const busy = sb.send("ANZ-2", "later");
  const big = sb.send("ANZ-2", "x".repeat(100));
  const [first] = ws.sentOf("MESSAGE");
  ws.receive("INVALID_MESSAGE", { reason: "server busy: the message was not stored; send it again later",
    retryAfterMs: 5, data: first.data });
  ws.receive("INVALID_MESSAGE", { reason: "content exceeds 64 bytes", limit: 64 });
  await assert.rejects(big, (err) => err.limit === 64);
  await sleep(30);
  ws.receive("MESSAGE_ACCEPTED", { id: "6", clientMessageId: first.data.clientMessageId, recipients: 1 });
  assert.equal((await busy).id, "6");
});

test("channels: offsets are tracked, duplicates at the seam dropped, and resubscribed with since", async () => {
  const sb = client();
  const got = [];
  sb.on("channelMessage", (m) => got.push(`${m.channel}#${m.offset}:${m.content}`));
  sb.connect();
  const ws = await authenticated(sb);
  const subscribing = sb.subscribe("news.sport");
  assert.deepEqual(ws.sentOf("SUBSCRIBE")[0].data, { channel: "news.sport" });
  ws.receive("SUBSCRIBED", { channel: "news.sport", offset: 3 });
  assert.deepEqual(await subscribing, { channel: "news.sport", offset: 3 });
  ws.receive("CHANNEL_MESSAGE", { channel: "news.sport", content: "a", offset: 4 });
  ws.receive("CHANNEL_MESSAGE", { channel: "news.sport", content: "b", offset: 5 });
  ws.receive("CHANNEL_MESSAGE", { channel: "@ANZ-7", content: "server-managed", offset: 2 });
  ws.drop(1006);

  const again = await authenticated(sb);
  assert.deepEqual(again.sentOf("SUBSCRIBE").map((f) => f.data),
    [{ channel: "news.sport", since: 5 }, { channel: "@ANZ-7", since: 2 }]);
  again.receive("CHANNEL_MESSAGE", { channel: "news.sport", content: "b", offset: 5 }); // already seen
  again.receive("CHANNEL_MESSAGE", { channel: "news.sport", content: "c", offset: 6 });
  again.receive("SUBSCRIBED", { channel: "news.sport", offset: 6 });
  assert.deepEqual(got, ["news.sport#4:a", "news.sport#5:b", "@ANZ-7#2:server-managed", "news.sport#6:c"]);
  assert.deepEqual(sb.offsets(), { "news.sport": 6, "@ANZ-7": 2 });

  const leaving = sb.unsubscribe("news.sport");
  again.receive("UNSUBSCRIBED", { channel: "news.sport" });
  await leaving;
  again.drop(1006);
  const third = await authenticated(sb);
  assert.deepEqual(third.sentOf("SUBSCRIBE").map((f) => f.data.channel), ["@ANZ-7"]);
});

test("a subscription made with since and a token asks for them; a refusal rejects it", async () => {
  const sb = client();
  const waiting = sb.subscribe("private.room", { since: 10, token: async () => "grant" });
  sb.connect();
  const ws = await authenticated(sb);
  await sleep(5);
  const [frame] = ws.sentOf("SUBSCRIBE");
  assert.deepEqual(frame.data, { channel: "private.room", since: 10, token: "grant" });
  ws.receive("INVALID_MESSAGE", { reason: "invalid channel token", data: frame.data });
  await assert.rejects(waiting, /invalid channel token/);
  assert.deepEqual(sb.offsets(), {});
});

test("an idle connection sends PING, and one that stays silent is dropped and reconnected", async () => {
  const sb = client({ pingIntervalMs: 20, answerTimeoutMs: 20 });
  sb.connect();
  const ws = await authenticated(sb);
  await sleep(30);
  assert.equal(ws.sentOf("PING").length, 1);
  ws.receive("PONG");
  await sleep(15);
  assert.equal(sb.state, "connected");
  await sleep(60);
  assert.ok(ws.closedWith !== null, "the silent socket was closed");
  assert.ok(FakeSocket.all.length >= 2, "and a new one opened");
});

test("a server PING is answered with PONG, and master notices become events", async () => {
  const sb = client();
  const seen = [];
  sb.on("userConnected", (e) => seen.push(`+${e.userId}`));
  sb.on("userDisconnected", (e) => seen.push(`-${e.userId}`));
  sb.on("onlineUsers", (e) => seen.push(`${e.page}/${e.pages}:${e.users.join(",")}`));
  sb.connect();
  const ws = await authenticated(sb);
  ws.receive("ONLINE_USERS", { users: ["ANZ-1", "ANZ-2"], page: 1, pages: 2, count: 3 });
  ws.receive("ONLINE_USERS", { users: ["ANZ-3"], page: 2, pages: 2, count: 3 });
  ws.receive("PING");
  ws.receive("USER_CONNECTED", { userId: "ANZ-5" });
  ws.receive("USER_DISCONNECTED", { userId: "ANZ-5" });
  assert.equal(ws.sentOf("PONG").length, 1);
  assert.deepEqual(seen, ["1/2:ANZ-1,ANZ-2", "2/2:ANZ-3", "+ANZ-5", "-ANZ-5"]);
});

test("reconnect() while a retry waits opens one socket, not two", async () => {
  const sb = client({ minDelayMs: 40, firstMaxDelayMs: 40 });
  sb.connect();
  const ws = await authenticated(sb);
  ws.drop(1006);
  sb.reconnect();
  await authenticated(sb);
  await sleep(80); // the retry that was waiting is gone
  assert.equal(FakeSocket.all.length, 2);
  assert.equal(sb.state, "connected");
});

test("a URL the browser refuses to open ends the client instead of retrying", async () => {
  class Refusing {
    constructor() { throw new SyntaxError("invalid URL"); }
  }
  const sb = client({ WebSocket: Refusing });
  await assert.rejects(sb.connect(), /cannot open/);
  assert.equal(sb.state, "closed");
});

test("a user homed in another domain is taken there with the same credentials, and stays there", async () => {
  const sb = client({ token: "the-token" });
  const redirects = [];
  sb.on("redirect", (r) => redirects.push(r));
  const connected = sb.connect();
  const wrong = await nextSocket();
  wrong.open();
  wrong.receive("AUTH_CLIENT_REPLY", { appId: "app-id-343", userId: "ANZ-1001", isAuthenticated: false,
    redirect: "ws://home/ws" });
  const home = await nextSocket();
  assert.equal(home.url, "ws://home/ws");
  assert.equal(wrong.closedWith, 1000);
  assert.deepEqual(redirects, [{ from: "ws://test/ws", to: "ws://home/ws", count: 1 }]);
  home.open();
  assert.deepEqual(home.sent[0], { type: "AUTH_CLIENT",
    data: { appId: "app-id-343", userId: "ANZ-1001", token: "the-token" } });
  home.receive("AUTH_CLIENT_REPLY", { isAuthenticated: true });
  await connected;
  assert.equal(sb.state, "connected");

  home.drop(1006); // a later reconnect goes straight home
  const again = await nextSocket();
  assert.equal(again.url, "ws://home/ws");
});

test("while its domain cannot be reached, the client tries the fallback URLs in turn and follows their redirect", async () => {
  const sb = client({ fallbackUrls: ["ws://domain-02/ws", "ws://domain-04/ws"] });
  const fallbacks = [];
  sb.on("fallback", (f) => fallbacks.push(f.to));
  const connected = sb.connect();
  (await nextSocket()).drop(1006); // the home is lost: nothing answers
  const second = await nextSocket();
  assert.equal(second.url, "ws://domain-02/ws");
  second.drop(1006); // nor there
  const third = await nextSocket();
  assert.equal(third.url, "ws://domain-04/ws");
  third.open(); // a domain that answers: it redirects the user to the one that serves it now
  third.receive("AUTH_CLIENT_REPLY", { isAuthenticated: false, redirect: "ws://domain-03/ws" });
  const holder = await nextSocket();
  assert.equal(holder.url, "ws://domain-03/ws");
  holder.open();
  holder.receive("AUTH_CLIENT_REPLY", { isAuthenticated: true });
  await connected;
  assert.deepEqual(fallbacks, ["ws://domain-02/ws", "ws://domain-04/ws"]);
  holder.drop(1012); // handed back: it answered, so no fallback; the holder redirects home from now on
  assert.equal((await nextSocket()).url, "ws://domain-03/ws");
  assert.deepEqual(fallbacks, ["ws://domain-02/ws", "ws://domain-04/ws"]);
});

test("a refusal for now (1013: between domains) is retried where it came from", async () => {
  const sb = client({ fallbackUrls: ["ws://domain-02/ws"] });
  sb.connect();
  const ws = await nextSocket();
  ws.open();
  ws.receive("AUTH_CLIENT_REPLY", { isAuthenticated: false });
  ws.drop(1013, "domain-04 is handing this user back to domain-03; retry");
  assert.equal(sb.state, "reconnecting");
  assert.equal((await nextSocket()).url, "ws://test/ws");
});

test("more than three redirects in a row end the client with an error", async () => {
  const sb = client();
  const errors = [];
  sb.on("error", (e) => errors.push(e.reason));
  const connected = sb.connect();
  for (let i = 0; i < 4; i++) {
    const ws = await nextSocket();
    ws.open();
    ws.receive("AUTH_CLIENT_REPLY", { isAuthenticated: false, redirect: `ws://domain-${i}/ws` });
  }
  await assert.rejects(connected, /too many redirects/);
  assert.equal(sb.state, "closed");
  assert.deepEqual(errors, ["too many redirects"]);
  assert.equal(FakeSocket.all.length, 4); // no fifth socket
});

test("a refusal without a redirect is no redirect", async () => {
  const sb = client();
  const redirects = [];
  sb.on("redirect", (r) => redirects.push(r));
  sb.connect();
  const ws = await nextSocket();
  ws.open();
  ws.receive("AUTH_CLIENT_REPLY", { isAuthenticated: false });
  ws.drop(1008, "refused");
  await sleep(10);
  assert.deepEqual(redirects, []);
  assert.equal(sb.state, "closed");
  assert.equal(FakeSocket.all.length, 1);
});

// --- requests to the app's server (docs/protocol.md "Requests") ---------------------------------

test("a request is resent with its clientMessageId after every reconnect until accepted, then resolves once", async () => {
  const sb = client({ acks: true });
  sb.connect();
  const first = await authenticated(sb);
  const asking = sb.request("orders.place", '{"sku": 7}', { timeoutMs: 30000 });
  const [frame] = first.sentOf("REQUEST");
  assert.match(frame.data.clientMessageId, /^sb-/);
  assert.deepEqual(frame, { type: "REQUEST", data: { endpoint: "orders.place", content: '{"sku": 7}',
    clientMessageId: frame.data.clientMessageId, timeoutMs: 30000 } });
  first.drop(1006); // no REQUEST_ACCEPTED: the client cannot know whether it was stored

  const second = await authenticated(sb);
  assert.deepEqual(second.sentOf("REQUEST"), [frame]);
  second.receive("REQUEST_ACCEPTED", { id: "311", clientMessageId: frame.data.clientMessageId, duplicate: true });
  second.drop(1012);
  const third = await authenticated(sb);
  assert.deepEqual(third.sentOf("REQUEST"), [], "accepted: not sent again");
  third.receive("RESOLVE", { id: "8812", requestId: "311", clientMessageId: frame.data.clientMessageId,
    content: "order 7 placed", seq: 14 });
  assert.deepEqual(await asking, { content: "order 7 placed", requestId: "311", id: "8812",
    clientMessageId: frame.data.clientMessageId, duplicate: true });
  await sleep(10);
  assert.deepEqual(third.sentOf("ACK").flatMap((f) => f.data.ids), ["8812"]);
});

test("an outcome that comes again (a duplicate request, a second fetch) settles the request once and is acknowledged again", async () => {
  const sb = client({ acks: true });
  const unknown = [];
  sb.on("outcome", (o) => unknown.push(o));
  sb.connect();
  const ws = await authenticated(sb);
  let settled = 0;
  const asking = sb.request("orders.quick", "now", { clientMessageId: "r-9" }).then((o) => { settled++; return o; });
  ws.receive("REQUEST_ACCEPTED", { id: "5", clientMessageId: "r-9", duplicate: true });
  const outcome = { id: "90", requestId: "5", clientMessageId: "r-9", content: "done", seq: 3 };
  ws.receive("RESOLVE", outcome);
  ws.receive("RESOLVE", outcome);
  assert.equal((await asking).content, "done");
  await sleep(10);
  assert.equal(settled, 1);
  assert.deepEqual(unknown, [], "a settled request's outcome again is no news");
  assert.deepEqual(ws.sentOf("ACK").flatMap((f) => f.data.ids), ["90", "90"]);
  await assert.rejects(Promise.all([sb.request("orders.quick", "a", { clientMessageId: "r-10" }),
    sb.request("orders.quick", "b", { clientMessageId: "r-10" })]), /waiting already/);
});

test("a REJECT rejects the request with the server's content, the reason and the request id", async () => {
  const sb = client({ acks: true });
  sb.connect();
  const ws = await authenticated(sb);
  const slow = sb.request("orders.later", "slow", { timeoutMs: 700 });
  const refused = sb.request("orders.later", "no stock");
  const [a, b] = ws.sentOf("REQUEST");
  ws.receive("REQUEST_ACCEPTED", { id: "31", clientMessageId: a.data.clientMessageId });
  ws.receive("REQUEST_ACCEPTED", { id: "32", clientMessageId: b.data.clientMessageId });
  ws.receive("REJECT", { id: "91", requestId: "31", clientMessageId: a.data.clientMessageId, content: "", seq: 4,
    reason: "timeout" });
  ws.receive("REJECT", { id: "92", requestId: "32", clientMessageId: b.data.clientMessageId, content: "out of stock",
    seq: 5 });
  await assert.rejects(slow, (err) => err.type === "REJECT" && err.reason === "timeout" && err.requestId === "31"
    && err.content === "" && err.id === "91");
  await assert.rejects(refused, (err) => err.message === "request 32 rejected: out of stock"
    && err.content === "out of stock" && err.reason === undefined && err.requestId === "32");
  await sleep(10);
  assert.deepEqual(ws.sentOf("ACK").flatMap((f) => f.data.ids), ["91", "92"]);
});

test("a request the server refuses rejects at once with its code; a rate-limited one goes again after retryAfterMs", async () => {
  const sb = client({ acks: true });
  sb.connect();
  const ws = await authenticated(sb);
  const unknown = sb.request("orders.nope", "x");
  const limited = sb.request("orders.place", "y");
  const [a, b] = ws.sentOf("REQUEST");
  ws.receive("INVALID_MESSAGE", { reason: "unknown endpoint", code: "unknown_endpoint", data: a.data });
  ws.receive("INVALID_MESSAGE", { reason: "delivery rate limit exceeded", retryAfterMs: 20, limit: 50, data: b.data });
  await assert.rejects(unknown, (err) => err.code === "unknown_endpoint" && err.type === "INVALID_MESSAGE"
    && err.reason === "unknown endpoint");
  await sleep(50);
  assert.deepEqual(ws.sentOf("REQUEST").slice(2), [b]);
  ws.receive("REQUEST_ACCEPTED", { id: "40", clientMessageId: b.data.clientMessageId });
  ws.receive("RESOLVE", { id: "93", requestId: "40", clientMessageId: b.data.clientMessageId, content: "ok", seq: 6 });
  assert.equal((await limited).content, "ok");
});

test("an outcome fetched after a reconnect settles the request, even before its resend is accepted", async () => {
  const sb = client({ acks: true });
  sb.connect();
  const first = await authenticated(sb);
  const asking = sb.request("orders.place", "while away");
  const [frame] = first.sentOf("REQUEST");
  first.drop(1006); // stored, answered meanwhile, but its REQUEST_ACCEPTED was lost

  const second = await nextSocket();
  second.open();
  second.receive("AUTH_CLIENT_REPLY", { isAuthenticated: true });
  assert.deepEqual(second.sent.slice(1).map((f) => f.type), ["FETCH_MISSING_MESSAGES_REQUEST", "REQUEST"]);
  const outcome = { id: "94", requestId: "50", clientMessageId: frame.data.clientMessageId, content: "done", seq: 7 };
  second.receive("RESOLVE", outcome);
  second.receive("FETCH_MISSING_MESSAGES_COMPLETE", { leftMissingCount: 0 });
  assert.deepEqual(await asking, { content: "done", requestId: "50", id: "94", clientMessageId: frame.data.clientMessageId,
    duplicate: false });
  second.receive("REQUEST_ACCEPTED", { id: "50", clientMessageId: frame.data.clientMessageId, duplicate: true });
  second.receive("RESOLVE", outcome); // the duplicate's outcome again: acknowledged, nothing more
  await sleep(10);
  assert.deepEqual(second.sentOf("ACK").flatMap((f) => f.data.ids), ["94", "94"]);
  second.drop(1006);
  const third = await authenticated(sb);
  assert.deepEqual(third.sentOf("REQUEST"), []);
});

test("the outcome of a request the client does not know is an `outcome` event, acknowledged once its listener is done", async () => {
  const sb = client({ acks: true });
  const errors = [];
  sb.on("error", (e) => errors.push(e.reason));
  sb.connect();
  const ws = await authenticated(sb);
  const outcome = { id: "95", requestId: "60", clientMessageId: "before-the-reload", content: "", seq: 8,
    reason: "endpoint_failed" };
  ws.receive("REJECT", outcome); // nobody listens: not acknowledged, and said so
  await sleep(10);
  assert.deepEqual(ws.sentOf("ACK"), []);
  assert.deepEqual(errors, ["unhandled outcome"]);

  let release;
  const seen = [];
  sb.on("outcome", (o) => { seen.push(o); return new Promise((r) => { release = r; }); });
  ws.receive("REJECT", outcome); // it comes again
  assert.deepEqual(seen, [{ type: "reject", content: "", requestId: "60", clientMessageId: "before-the-reload",
    id: "95", reason: "endpoint_failed" }]);
  await sleep(10);
  assert.deepEqual(ws.sentOf("ACK"), [], "not before the listener is done");
  release();
  await sleep(10);
  assert.deepEqual(ws.sentOf("ACK").flatMap((f) => f.data.ids), ["95"]);
});

test("close() rejects the requests still waiting for their outcome", async () => {
  const sb = client();
  sb.connect();
  const ws = await authenticated(sb);
  const accepted = sb.request("orders.place", "a");
  const queued = sb.request("orders.place", "b");
  const [a] = ws.sentOf("REQUEST");
  ws.receive("REQUEST_ACCEPTED", { id: "70", clientMessageId: a.data.clientMessageId });
  sb.close();
  await assert.rejects(accepted, /closed/);
  await assert.rejects(queued, /closed/);
});

// --- sessions (docs/protocol.md "Sessions") -----------------------------------------------------

/** Open the next socket, answer its AUTH_CLIENT with `reply` (a session id by default), and fetch nothing. */
async function loggedIn(sb, reply = {}) {
  const ws = await nextSocket();
  ws.open();
  ws.receive("AUTH_CLIENT_REPLY", { appId: "app-id-343", userId: "ANZ-1001", isAuthenticated: true, ...reply });
  ws.receive("FETCH_MISSING_MESSAGES_COMPLETE", { leftMissingCount: 0 });
  await sleep(0);
  return ws;
}

test("the session id of the reply is presented at every reconnect, and a new one replaces an ended session", async () => {
  const sb = client();
  const logins = [];
  sb.on("connected", (c) => logins.push(c));
  sb.connect();
  const first = await loggedIn(sb, { sessionId: "s-1" });
  assert.equal(first.sent[0].data.sessionId, undefined, "the first login has no session to present");
  assert.equal(sb.sessionId, "s-1");
  assert.throws(() => { sb.sessionId = "s-made-up"; }, TypeError);

  first.drop(1006);
  const second = await loggedIn(sb, { sessionId: "s-1" });
  assert.equal(second.sent[0].data.sessionId, "s-1");
  second.drop(1012);
  const third = await loggedIn(sb, { sessionId: "s-2" }); // s-1 had ended meanwhile
  assert.equal(third.sent[0].data.sessionId, "s-1");
  assert.equal(sb.sessionId, "s-2");
  third.drop(1006);
  const fourth = await loggedIn(sb, { sessionId: "s-2" });
  assert.equal(fourth.sent[0].data.sessionId, "s-2");
  assert.deepEqual(logins.map((c) => [c.sessionId, c.resumed]), [["s-1", false], ["s-1", true], ["s-2", false],
    ["s-2", true]]);
});

test("a session id given to the constructor (kept across a page reload) is presented at the first login", async () => {
  const sb = client({ sessionId: "s-before-the-reload" });
  sb.connect();
  const ws = await loggedIn(sb, { sessionId: "s-before-the-reload" });
  assert.equal(ws.sent[0].data.sessionId, "s-before-the-reload");
});

test("a session id refused as not this user's (wrong_user) is forgotten, and the client logs in afresh at once", async () => {
  const sb = client({ sessionId: "s-of-another-user" });
  const errors = [];
  sb.on("error", (e) => errors.push(e.reason));
  const connected = sb.connect();
  const refused = await nextSocket();
  refused.open();
  assert.equal(refused.sent[0].data.sessionId, "s-of-another-user");
  refused.receive("AUTH_CLIENT_REPLY", { appId: "app-id-343", userId: "ANZ-1001", isAuthenticated: false });
  refused.drop(1008, "wrong_user: the sessionId is not this user's");

  const fresh = await loggedIn(sb, { sessionId: "s-mine" });
  await connected;
  assert.equal(fresh.sent[0].type, "AUTH_CLIENT");
  assert.equal(fresh.sent[0].data.sessionId, undefined);
  assert.equal(sb.state, "connected");
  assert.equal(sb.sessionId, "s-mine");
  assert.deepEqual(errors, ["authentication refused", "wrong_user"]);
});

test("another refusal (1008) of a login that presented a session id still ends the client", async () => {
  const sb = client({ sessionId: "s-1" });
  const connected = sb.connect();
  const ws = await nextSocket();
  ws.open();
  ws.receive("AUTH_CLIENT_REPLY", { isAuthenticated: false });
  ws.drop(1008, "invalid token");
  await assert.rejects(connected, /invalid token/);
  await sleep(20);
  assert.equal(sb.state, "closed");
  assert.equal(FakeSocket.all.length, 1);
});

test("closeSession() acknowledges what was handled, sends CLOSE_SESSION, resolves with the discarded count and ends the client", async () => {
  const sb = client({ acks: true });
  sb.on("message", () => {});
  const disconnects = [];
  sb.on("disconnected", (d) => disconnects.push(d));
  sb.connect();
  const ws = await loggedIn(sb, { sessionId: "s-1" });
  ws.receive("MESSAGE", { from: "ANZ-2", content: "handled", id: "7", seq: 1 });
  const waiting = sb.request("orders.place", "never answered");
  const closing = sb.closeSession();
  assert.deepEqual(ws.sent.slice(-2).map((f) => f.type), ["ACK", "CLOSE_SESSION"]);
  assert.deepEqual(ws.sentOf("ACK")[0].data.ids, ["7"]);
  assert.deepEqual(ws.sentOf("CLOSE_SESSION")[0], { type: "CLOSE_SESSION", data: {} });

  ws.receive("SESSION_CLOSED", { sessionId: "s-1", discarded: 2 });
  assert.equal(await closing, 2);
  await assert.rejects(waiting, /session closed/);
  assert.equal(sb.state, "closed");
  assert.equal(sb.sessionId, null);
  assert.equal(ws.closedWith, 1000);
  await sleep(20);
  assert.equal(FakeSocket.all.length, 1, "no reconnect");
  assert.deepEqual(disconnects, [{ code: 1000, reason: "session closed", willReconnect: false }]);
});

test("closeSession() is sent again after a reconnect when the link dies before SESSION_CLOSED", async () => {
  const sb = client();
  sb.connect();
  const first = await loggedIn(sb, { sessionId: "s-1" });
  const closing = sb.closeSession();
  assert.equal(first.sentOf("CLOSE_SESSION").length, 1);
  first.drop(1006);
  const second = await loggedIn(sb, { sessionId: "s-1" });
  assert.equal(second.sent[0].data.sessionId, "s-1");
  assert.equal(second.sentOf("CLOSE_SESSION").length, 1);
  second.receive("SESSION_CLOSED", { sessionId: "s-1", discarded: 0 });
  assert.equal(await closing, 0);
  assert.equal(sb.state, "closed");
});

// --- the server asking the client (docs/protocol.md "The server asking a client") ---------------

const serverRequest = (n, content) => ({ id: `88${n}`, requestId: `32${n}`, content, seq: n });

test("onRequest: a returned value resolves the server request, a thrown error rejects it, and each is acknowledged once accepted", async () => {
  const sb = client({ acks: true });
  const seen = [];
  const answered = [];
  sb.on("answered", (a) => answered.push(a));
  sb.onRequest(async (content, request) => {
    seen.push(request);
    if (content === "confirm order 9?") return "yes";
    if (content === "which?") return { sku: 7, count: 2 };
    if (content === "out of stock?") throw new Error("no stock left");
    throw Object.assign(new Error("not shown"), { content: "code 7" });
  });
  sb.connect();
  const ws = await loggedIn(sb, { sessionId: "s-1" });
  ws.receive("SERVER_REQUEST", serverRequest(1, "confirm order 9?"));
  ws.receive("SERVER_REQUEST", serverRequest(2, "which?"));
  ws.receive("SERVER_REQUEST", serverRequest(3, "out of stock?"));
  ws.receive("SERVER_REQUEST", serverRequest(4, "custom?"));
  await sleep(10);
  assert.deepEqual(seen[0], { requestId: "321", content: "confirm order 9?", id: "881", seq: 1 });
  const answers = ws.sent.filter((f) => f.type === "RESOLVE" || f.type === "REJECT");
  assert.deepEqual(answers, [
    { type: "RESOLVE", data: { requestId: "321", content: "yes" } },
    { type: "RESOLVE", data: { requestId: "322", content: '{"sku":7,"count":2}' } },
    { type: "REJECT", data: { requestId: "323", content: "no stock left" } },
    { type: "REJECT", data: { requestId: "324", content: "code 7" } },
  ]);
  assert.deepEqual(ws.sentOf("ACK"), [], "not acknowledged before the server accepted the answer");

  for (const n of [1, 2, 3, 4]) ws.receive("ANSWER_ACCEPTED", { requestId: `32${n}` });
  await sleep(10);
  assert.deepEqual(ws.sentOf("ACK").flatMap((f) => f.data.ids), ["881", "882", "883", "884"]);
  assert.deepEqual(answered.map((a) => [a.requestId, a.type, a.content, a.replay]), [
    ["321", "resolve", "yes", false], ["322", "resolve", '{"sku":7,"count":2}', false],
    ["323", "reject", "no stock left", false], ["324", "reject", "code 7", false]]);
});

test("an answer not yet accepted is sent again after a reconnect until accepted, and the handler runs once", async () => {
  const sb = client({ acks: true });
  let calls = 0;
  sb.onRequest(async () => { calls++; await sleep(5); return "later"; });
  sb.connect();
  const first = await loggedIn(sb, { sessionId: "s-1" });
  first.receive("SERVER_REQUEST", serverRequest(1, "still there?"));
  await sleep(20);
  const [answer] = first.sentOf("RESOLVE");
  assert.deepEqual(answer, { type: "RESOLVE", data: { requestId: "321", content: "later" } });
  first.drop(1006); // no ANSWER_ACCEPTED: the client cannot know whether it was taken

  const second = await nextSocket();
  second.open();
  second.receive("AUTH_CLIENT_REPLY", { isAuthenticated: true, sessionId: "s-1" });
  second.receive("SERVER_REQUEST", serverRequest(1, "still there?")); // unacknowledged: pushed again
  second.receive("FETCH_MISSING_MESSAGES_COMPLETE", { leftMissingCount: 0 });
  await sleep(20);
  assert.deepEqual(second.sentOf("RESOLVE"), [answer]);
  second.drop(1012);
  const third = await loggedIn(sb, { sessionId: "s-1" });
  assert.deepEqual(third.sentOf("RESOLVE"), [answer]);
  third.receive("ANSWER_ACCEPTED", { requestId: "321", replay: true });
  await sleep(10);
  assert.deepEqual(third.sentOf("ACK").flatMap((f) => f.data.ids), ["881"]);
  third.drop(1006);
  const fourth = await loggedIn(sb, { sessionId: "s-1" });
  await sleep(10);
  assert.deepEqual(fourth.sentOf("RESOLVE"), [], "accepted: not sent again");
  assert.equal(calls, 1);
});

test("a SERVER_REQUEST that comes again is answered once, and once answered only acknowledged again", async () => {
  const sb = client({ acks: true });
  let calls = 0;
  let release;
  sb.onRequest(() => { calls++; return new Promise((resolve) => { release = resolve; }); });
  sb.connect();
  const ws = await loggedIn(sb);
  ws.receive("SERVER_REQUEST", serverRequest(1, "once?"));
  ws.receive("SERVER_REQUEST", serverRequest(1, "once?")); // while the handler is still at it
  release("once");
  await sleep(10);
  ws.receive("SERVER_REQUEST", serverRequest(1, "once?")); // while its answer waits for ANSWER_ACCEPTED
  ws.receive("ANSWER_ACCEPTED", { requestId: "321" });
  ws.receive("SERVER_REQUEST", serverRequest(1, "once?")); // its ACK was lost: it comes again
  await sleep(10);
  assert.equal(calls, 1);
  assert.deepEqual(ws.sentOf("RESOLVE"), [{ type: "RESOLVE", data: { requestId: "321", content: "once" } }]);
  assert.deepEqual(ws.sentOf("ACK").flatMap((f) => f.data.ids), ["881", "881"]);
});

test("an answer refused for good (request_closed) is not sent again: an error says so, and the SERVER_REQUEST is acknowledged", async () => {
  const sb = client({ acks: true });
  const errors = [];
  sb.on("error", (e) => errors.push(e));
  sb.onRequest(() => "too late");
  sb.connect();
  const ws = await loggedIn(sb);
  ws.receive("SERVER_REQUEST", serverRequest(1, "in time?"));
  await sleep(10);
  ws.receive("INVALID_MESSAGE", { reason: "the request is closed", code: "request_closed",
    data: { requestId: "321", content: "too late" } });
  await sleep(10);
  assert.deepEqual(errors.map((e) => [e.code, e.requestId]), [["request_closed", "321"]]);
  assert.deepEqual(ws.sentOf("ACK").flatMap((f) => f.data.ids), ["881"]);
  ws.drop(1006);
  const again = await loggedIn(sb);
  await sleep(10);
  assert.deepEqual(again.sentOf("RESOLVE"), []);
});

test("a rate-limited answer goes again after retryAfterMs", async () => {
  const sb = client({ acks: true });
  sb.onRequest(() => "yes");
  sb.connect();
  const ws = await loggedIn(sb);
  ws.receive("SERVER_REQUEST", serverRequest(1, "now?"));
  await sleep(10);
  ws.receive("INVALID_MESSAGE", { reason: "rate limit exceeded", retryAfterMs: 20, data: { requestId: "321", content: "yes" } });
  await sleep(50);
  assert.equal(ws.sentOf("RESOLVE").length, 2);
  ws.receive("ANSWER_ACCEPTED", { requestId: "321" });
  await sleep(10);
  assert.deepEqual(ws.sentOf("ACK").flatMap((f) => f.data.ids), ["881"]);
});

test("without a handler a SERVER_REQUEST is not acknowledged and an error says so; when it comes again a handler answers it", async () => {
  const sb = client({ acks: true });
  const errors = [];
  sb.on("error", (e) => errors.push(e.reason));
  sb.connect();
  const ws = await loggedIn(sb);
  ws.receive("SERVER_REQUEST", serverRequest(1, "anyone?"));
  await sleep(10);
  assert.deepEqual(errors, ["unhandled server request"]);
  assert.deepEqual(ws.sentOf("ACK"), []);
  assert.deepEqual(ws.sentOf("RESOLVE"), []);

  sb.onRequest((content) => `here: ${content}`);
  ws.receive("SERVER_REQUEST", serverRequest(1, "anyone?"));
  await sleep(10);
  assert.deepEqual(ws.sentOf("RESOLVE"), [{ type: "RESOLVE", data: { requestId: "321", content: "here: anyone?" } }]);
});
