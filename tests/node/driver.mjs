// Drives one real socket.io-client for a Python test (tests/system/test_socketio_node.py): commands
// come as JSON lines on stdin, everything the client sees goes out as JSON lines on stdout.
//   {"op": "connect", "url": ..., "auth": {...}, "opts": {...}, "ackMessages": true}
//   {"op": "emit", "n": 1, "event": "message", "data": {...}}   -> {"ack": 1, "result": ...}
//   {"op": "dropTransport"}   the engine's transport closes under the socket (as when a node dies)
//   {"op": "disconnect"} / {"op": "exit"}
import { createInterface } from "node:readline";
import { io } from "socket.io-client";

let socket = null;
let ackMessages = true;
const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");

function connect({ url, auth, opts, ackMessages: ack }) {
  ackMessages = ack !== false;
  socket = io(url, { auth, reconnectionDelay: 100, reconnectionDelayMax: 500, ...opts });
  socket.on("connect", () => out({ event: "connect", id: socket.id, recovered: socket.recovered,
                                   transport: socket.io.engine.transport.name }));
  socket.io.engine.on("upgrade", (transport) => out({ event: "upgrade", transport: transport.name }));
  socket.io.on("open", () => socket.io.engine.on("upgrade", (t) => out({ event: "upgrade", transport: t.name })));
  socket.on("connect_error", (err) => out({ event: "connect_error", message: err.message, data: err.data ?? null }));
  socket.on("disconnect", (reason) => out({ event: "disconnect", reason }));
  socket.onAny((event, ...args) => {
    const cb = typeof args[args.length - 1] === "function" ? args.pop() : null;
    out({ event, args, acked: Boolean(cb && ackMessages) });
    if (cb && ackMessages) cb({});
  });
}

const rl = createInterface({ input: process.stdin });
rl.on("line", (line) => {
  const cmd = JSON.parse(line);
  switch (cmd.op) {
    case "connect": connect(cmd); break;
    case "emit":
      socket.timeout(10000).emit(cmd.event, cmd.data, (err, result) =>
        out({ ack: cmd.n, result: err ? { timeout: String(err) } : result }));
      break;
    case "dropTransport": socket.io.engine.close(); break;
    case "disconnect": socket.disconnect(); break;
    case "exit": process.exit(0);
  }
});
out({ event: "ready" });
