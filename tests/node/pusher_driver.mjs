// Drives one real pusher-js client, or Laravel Echo on it, and the official `pusher` server library,
// for a Python test (tests/system/test_pusher_node.py): commands as JSON lines on stdin, everything the
// client sees as JSON lines on stdout. Channel authorizations are made by the `pusher` library's
// authorizeChannel with the app's secret, as the app's server would make them.
//   {"op": "connect", "host", "port", "key", "secret", "appId", "user": {...}?, "signinAs": {...}?, "echo": false}
//   {"op": "subscribe", "channel"} / {"op": "unsubscribe", "channel"} / {"op": "trigger", "channel", "event", "data"}
//   {"op": "bind", "channel", "event"} / {"op": "signin"} (as connect's "signinAs": {id, ...})
//   {"op": "echo", "how": "listen"|"private"|"join"|"whisper"|"listenForWhisper", "channel", "event"?, "data"?}
//   {"op": "api", "n", "call": "trigger"|"triggerBatch"|"get"|"post", "args": [...]}  -> {"api": n, "status", "body"}
//   {"op": "disconnect"} / {"op": "exit"}
import { createInterface } from "node:readline";
import PusherClient from "pusher-js";
import PusherServer from "pusher";
import Echo from "laravel-echo";

const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
let client = null, echo = null, server = null, user = null;

function connect(cmd) {
  user = cmd.user ?? null;
  server = new PusherServer({ appId: cmd.appId, key: cmd.key, secret: cmd.secret, host: cmd.host, port: String(cmd.port),
                              useTLS: false });
  const options = {
    cluster: "mt1", wsHost: cmd.host, wsPort: cmd.port, forceTLS: false, enabledTransports: ["ws"],
    disableStats: true, activityTimeout: cmd.activityTimeout ?? 120000,
    channelAuthorization: {
      customHandler: ({ socketId, channelName }, callback) => {
        const presence = channelName.startsWith("presence-") ? (user ?? { user_id: "anonymous" }) : undefined;
        callback(null, server.authorizeChannel(socketId, channelName, presence));
      },
    },
    userAuthentication: {
      customHandler: ({ socketId }, callback) => callback(null, server.authenticateUser(socketId, cmd.signinAs)),
    },
  };
  if (cmd.echo) {
    echo = new Echo({ broadcaster: "pusher", key: cmd.key, Pusher: PusherClient, ...options });
    client = echo.connector.pusher;
  } else {
    client = new PusherClient(cmd.key, options);
  }
  client.connection.bind("state_change", (s) => out({ event: "state", previous: s.previous, current: s.current }));
  client.connection.bind("connected", () => out({ event: "connected", socket_id: client.connection.socket_id }));
  client.connection.bind("error", (e) => out({ event: "connection_error", data: e?.data ?? e?.error?.data ?? null }));
  client.bind_global((name, data) => out({ event: "global", name, data }));
}

function watch(channel) {
  channel.bind("pusher:subscription_succeeded", (data) =>
    out({ event: "subscribed", channel: channel.name, members: data?.members ? Object.keys(data.members).sort() : null }));
  channel.bind("pusher:subscription_error", (data) => out({ event: "subscription_error", channel: channel.name, data }));
  channel.bind("pusher:member_added", (m) => out({ event: "member_added", channel: channel.name, id: m.id, info: m.info }));
  channel.bind("pusher:member_removed", (m) => out({ event: "member_removed", channel: channel.name, id: m.id }));
  channel.bind("pusher:cache_miss", () => out({ event: "cache_miss", channel: channel.name }));
  channel.bind_global((name, data, meta) => {
    if (!name.startsWith("pusher:")) out({ event: "event", channel: channel.name, name, data, user_id: meta?.user_id ?? null });
  });
}

function echoCommand(cmd) {
  const report = (name) => (data) => out({ event: "echo", name, channel: cmd.channel, data });
  switch (cmd.how) {
    case "listen": echo.channel(cmd.channel).listen(cmd.event, report(cmd.event)); break;
    case "private": echo.private(cmd.channel).listen(cmd.event, report(cmd.event)); break;
    case "join":
      echo.join(cmd.channel)
        .here((users) => out({ event: "echo", name: "here", channel: cmd.channel, data: users }))
        .joining((u) => out({ event: "echo", name: "joining", channel: cmd.channel, data: u }))
        .leaving((u) => out({ event: "echo", name: "leaving", channel: cmd.channel, data: u }))
        .listenForWhisper(cmd.event ?? "typing", report("whisper"));
      break;
    case "whisper": echo.join(cmd.channel).whisper(cmd.event, cmd.data); break;
    case "leave": echo.leave(cmd.channel); break;
  }
}

async function api(cmd) {
  try {
    const response = await server[cmd.call](...cmd.args);
    out({ api: cmd.n, status: response.status, body: await response.json() });
  } catch (err) {
    out({ api: cmd.n, status: err.status ?? null, body: err.body ?? String(err) });
  }
}

const rl = createInterface({ input: process.stdin });
rl.on("line", (line) => {
  const cmd = JSON.parse(line);
  switch (cmd.op) {
    case "connect": connect(cmd); break;
    case "subscribe": watch(client.subscribe(cmd.channel)); break;
    case "unsubscribe": client.unsubscribe(cmd.channel); break;
    case "bind":  // a named binding gets the event's metadata (user_id on presence channels); bind_global does not
      client.channel(cmd.channel).bind(cmd.event, (data, meta) =>
        out({ event: "bound", channel: cmd.channel, name: cmd.event, data, user_id: meta?.user_id ?? null }));
      break;
    case "trigger": out({ event: "triggered", ok: client.channel(cmd.channel).trigger(cmd.event, cmd.data) }); break;
    case "echo": echoCommand(cmd); break;
    case "api": api(cmd); break;
    case "signin":
      client.user.bind_global((name, data) => out({ event: "user_event", name, data }));
      client.signin();
      client.user.signinDonePromise.then(() => out({ event: "signed_in", id: client.user.user_data.id }));
      break;
    case "disconnect": client.disconnect(); break;
    case "exit": process.exit(0);
  }
});
out({ event: "ready" });
