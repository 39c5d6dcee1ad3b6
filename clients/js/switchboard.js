/**
 * switchboard.js: the browser client of Switchboard's WebSocket protocol (docs/protocol.md), one
 * dependency-free ES module: the npm package switchboard-client (clients/js in the Switchboard
 * repository), also served by every web node at /static/switchboard/switchboard.js.
 *
 *     import { Switchboard } from "/static/switchboard/switchboard.js";
 *     const sb = new Switchboard({ url: "wss://host/ws", appId: "app-id-343", userId: "ANZ-1001", acks: true });
 *     sb.on("message", (m) => show(m.from, m.content));
 *     await sb.connect();
 *     await sb.send("ANZ-1002", "hello");
 *
 * (A classic <script> loads it with `import("/static/switchboard/switchboard.js")`.) It reconnects
 * by itself with backoff and jitter, fetches what was missed after every authentication, shows a
 * message id once, acknowledges in ACK mode once the app's handlers are done, keeps RELIABLE sends
 * in an outbox until MESSAGE_ACCEPTED (resent with the same clientMessageId after a reconnect), and
 * resumes each channel from its last offset. A request to the app's server (`request()`) is resent
 * with the same clientMessageId after every reconnect until REQUEST_ACCEPTED, then waits for its
 * outcome (RESOLVE or REJECT, pushed or fetched) however long it takes. A user homed in another domain is refused with that
 * domain's WebSocket URL (AUTH_CLIENT_REPLY `redirect`): the client goes there at once with the same
 * credentials, and stays there (at most MAX_REDIRECTS in a row without an authentication).
 *
 * Sessions (docs/protocol.md "Sessions"): the client keeps the sessionId of every AUTH_CLIENT_REPLY
 * and presents it at each reconnect, so the outcomes of its requests are pushed to it wherever it
 * reconnects; a sessionId the server refuses (close 1008 `wrong_user`) is forgotten and the client
 * logs in afresh at once. `closeSession()` ends the session and the client. Requests the app's server
 * makes of the user (SERVER_REQUEST) go to the `onRequest` handler, each requestId once; its answer
 * (RESOLVE or REJECT) is resent after every reconnect until ANSWER_ACCEPTED, and only then, in ACK
 * mode, is the SERVER_REQUEST acknowledged.
 *
 * Answers are matched to what was sent by the server's echo of a refused frame's data (every
 * MESSAGE, GROUP_MESSAGE and REQUEST carries a clientMessageId) and by order: the server answers a
 * connection's frames in order, so in ACK mode an acceptance without an id (from a server older
 * than group clientMessageIds) or a refusal without an echo (content too large) belongs to the
 * oldest send still waiting.
 */

const DEFAULTS = {
  acks: false,
  token: "",
  fetchCount: 100, // messages per FETCH_MISSING_MESSAGES_REQUEST (the server caps it at 2000)
  minDelayMs: 500, // every reconnect waits at least this
  firstMaxDelayMs: 2000, // the first wait is random in [minDelayMs, firstMaxDelayMs], then it doubles
  maxDelayMs: 60000,
  stableMs: 10000, // a connection authenticated this long resets the backoff
  pingIntervalMs: 25000, // PING after this long without a frame from the server
  answerTimeoutMs: 10000, // no frame this long after a PING: the link is dead
  connectTimeoutMs: 15000, // from opening the socket to AUTH_CLIENT_REPLY
  maxQueued: 1000, // sends waiting for a connection or an acceptance
  seenIds: 10000, // message ids remembered to drop redeliveries
  ackDelayMs: 20, // ACKs wait this long to go out together
  sendsPerSecond: 20, // pace of work frames, below the server's default budget (50/s, burst 100)
  sendBurst: 40,
  debug: null, // (direction: "in" | "out", text) => void, for every frame
};

const OPEN = 1;
const NO_RECONNECT = new Set([1000, 1008]); // a normal closure, or a policy the app must fix
const PROMPT = new Set([1012, 4002]); // restart / slow reader: come back soon, nothing is wrong
const ACK_MAX = 2000;
const MAX_REDIRECTS = 3;
const GENERAL_ERROR_TRIES = 5;
const WRONG_USER = "wrong_user"; // the close reason's start when a sessionId is not this user's

/**
 * Milliseconds to wait before reconnect `attempt` (0: the first after a stable connection): random
 * between `minDelayMs` and a ceiling that starts at `firstMaxDelayMs` and doubles up to `maxDelayMs`
 * ("full jitter"). A close asking to come back (1012, 4002) always waits like a first attempt.
 * @param {number} attempt @param {number} code the close code @param {object} [opts] @param {() => number} [random]
 */
export function reconnectDelay(attempt, code, opts = DEFAULTS, random = Math.random) {
  const n = PROMPT.has(code) ? 0 : Math.max(0, attempt);
  const ceiling = Math.min(opts.maxDelayMs, opts.firstMaxDelayMs * 2 ** Math.min(n, 30));
  return Math.round(opts.minDelayMs + random() * Math.max(0, ceiling - opts.minDelayMs));
}

/** An answer's content: a string as it is, anything else as its JSON. */
const answerText = (value) => (typeof value === "string" ? value : JSON.stringify(value) ?? "");

/** A rejection's content: the error's `content` when it has one, else its message. */
function rejectionText(error) {
  try {
    if (error != null && typeof error === "object" && error.content !== undefined) return answerText(error.content);
    return error instanceof Error ? error.message : answerText(error);
  } catch {
    return String(error);
  }
}

const newId = () => (globalThis.crypto?.randomUUID ? `sb-${globalThis.crypto.randomUUID()}`
  : `sb-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 12)}`);
const isThenable = (value) => value != null && typeof value.then === "function";
const failure = (message, extra) => Object.assign(new Error(message), extra);

/**
 * A client connection to Switchboard. Events (subscribe with `on`):
 * - `state` (state): "idle" | "connecting" | "authenticating" | "connected" | "reconnecting" | "closed"
 * - `connected` {appId, userId, sessionId, resumed} (resumed: the sessionId presented was taken back); `disconnected` {code, reason, willReconnect}; `reconnecting` {delayMs, attempt}
 * - `message` {from, content, id, seq, reference} (FAST messages have no id or seq)
 * - `confirmation` {reference, id, seq}; `accepted` {id, clientMessageId, recipients, duplicate}
 * - `channelMessage` {channel, content, offset}; `subscribed` {channel, offset}; `unsubscribed` {channel}
 * - `userConnected` / `userDisconnected` {userId} (the app's master user only)
 * - `onlineUsers` {users, page, pages, count} (the master user only, after each authentication: who
 *   was online then, in `pages` events; apply them, then the userConnected / userDisconnected after)
 * - `synced` {}: a fetch ended with nothing left missing; `error` (Error with reason, data, ...)
 * - `redirect` {from, to, count}: the user lives in another domain; the client now connects to `to`
 * - `fallback` {from, to}: `from` could not be reached at all; the next attempt goes to `to` (of `fallbackUrls`)
 * - `outcome` {type: "resolve" | "reject", content, requestId, clientMessageId, id, reason?}: the outcome of a
 *   request this client is not waiting for (made before a page reload, say); in ACK mode it is acknowledged
 *   like a message (once every listener is done). Without a listener it is not acknowledged (an `error` says so)
 * - `answered` {requestId, type: "resolve" | "reject", content, replay}: the server accepted an answer of the
 *   `onRequest` handler (an answer it refused for good is an `error` with its `code` and `requestId`)
 * In ACK mode a message is acknowledged once every `message` handler returned (or its promise
 * resolved); a handler that throws leaves it unacknowledged, and it comes again later.
 */
export class Switchboard {
  /**
   * @param {{url: string, appId: string, userId: string, token?: string | (() => string | Promise<string>),
   *   acks?: boolean, fallbackUrls?: string[], WebSocket?: Function, random?: () => number}} options
   *   `token` may be a callback, asked before every connection (to refresh it). `fallbackUrls`: other
   *   domains' WebSocket URLs, tried in turn while the current one cannot be reached at all (its
   *   domain lost): any domain of the network redirects the user to the one that serves it now
   *   (its standby, which takes a lost domain's users over). `sessionId`: a session to resume (the
   *   `sessionId` of an earlier client, kept across a page reload, say). The other options and defaults are in DEFAULTS.
   */
  constructor(options) {
    if (!options || !options.url || !options.appId || !options.userId) {
      throw new TypeError("Switchboard needs url, appId and userId");
    }
    this.options = { ...DEFAULTS, ...options };
    this.WebSocket = options.WebSocket || globalThis.WebSocket;
    this.random = options.random || Math.random;
    this.state = "idle"; // see the `state` event
    this._listeners = new Map();
    this._ws = null;
    this._gen = 0; // bumped per socket: callbacks of an older socket are ignored
    this._attempt = 0;
    this._redirects = 0; // redirects followed since the last authentication
    this._opened = false; // the current socket opened (a server answered at its URL)
    this._firstUrl = options.url;
    this._timers = {};
    this._outbox = []; // sends not settled yet, in order: {frame, cmid, group, awaits, state, ...}
    this._recent = []; // linker-mode sends already written: kept briefly to retry a rate-limited one
    this._seen = new Set(); // insertion order: the oldest id is forgotten first
    this._ackIds = [];
    this._channels = new Map(); // name -> {offset, token, server, waiters}
    this._unsubscribing = new Map(); // name -> [{resolve, reject}]
    this._requests = new Map(); // clientMessageId -> {requestId, duplicate, resolve, reject}: waiting for an outcome
    this._sessionId = options.sessionId || null;
    this._presented = null; // the sessionId the current socket's AUTH_CLIENT presented
    this._sessionClosing = null; // closeSession(): {promise, resolve, reject} until SESSION_CLOSED
    this._requestHandler = null; // onRequest()
    this._answers = new Map(); // requestId -> {id, state: "handling" | "answering" | "done"}: each server request once
    this._tokens = this.options.sendBurst;
    this._tokensAt = Date.now();
    this._pausedUntil = 0;
    this._waiting = []; // connect() promises
  }

  /** The session this client belongs to (docs/protocol.md "Sessions"): issued by the server at the first
   * authentication, presented again at every reconnect; null before that and after `closeSession()`. */
  get sessionId() {
    return this._sessionId;
  }

  /** Listen to an event (see the class comment); returns a function that stops listening. */
  on(name, fn) {
    if (!this._listeners.has(name)) this._listeners.set(name, new Set());
    this._listeners.get(name).add(fn);
    return () => this.off(name, fn);
  }

  /** Stop listening. */
  off(name, fn) {
    this._listeners.get(name)?.delete(fn);
  }

  /** Open the connection and keep it open until `close()`: resolves once authenticated, rejects
   * if the server refuses for good (1000, 1008). @returns {Promise<void>} */
  connect() {
    const promise = this.state === "connected" ? Promise.resolve()
      : new Promise((resolve, reject) => this._waiting.push({ resolve, reject }));
    promise.catch(() => {}); // connect() is often not awaited: its failure is also a `disconnected` event
    if (this.state === "idle" || this.state === "closed") {
      this._closing = false;
      this._attempt = 0;
      this._redirects = 0;
      this._open();
    }
    return promise;
  }

  /** Close for good: no reconnect; unsettled sends and subscriptions are rejected. */
  close() {
    this._stop("closed by the client");
  }

  /**
   * End the session (CLOSE_SESSION) and then the client, for good: the outcomes that still waited for it
   * are discarded, and those of its requests answered later are not stored. Sent again after a reconnect
   * until SESSION_CLOSED comes. @returns {Promise<number>} how many outcomes were discarded
   */
  closeSession() {
    if (this.state === "closed" || this.state === "idle") return Promise.reject(new Error("the client is not connected"));
    if (!this._sessionClosing) {
      const waiting = {};
      waiting.promise = new Promise((resolve, reject) => Object.assign(waiting, { resolve, reject }));
      this._sessionClosing = waiting;
      if (this.state === "connected") this._closeSessionFrame();
    }
    return this._sessionClosing.promise;
  }

  /**
   * Answer the requests the app's server makes of this user (SERVER_REQUEST, docs/protocol.md "The server
   * asking a client"): `handler(content, request)` is called once per requestId (a SERVER_REQUEST that comes
   * again is not handled twice); what it returns (or its promise resolves with) is a RESOLVE, with the value
   * as its content (a string as it is, anything else as JSON); what it throws (or its promise rejects with)
   * is a REJECT, with the error's `content` if it has one, else its message. The answer is sent again after
   * every reconnect until the server accepted it, and in ACK mode the SERVER_REQUEST is acknowledged then.
   * Without a handler a SERVER_REQUEST is not acknowledged (it comes again) and an `error` says so.
   * @param {(content: string, request: {requestId: string, content: string, id: string, seq: number}) => unknown} handler
   * @returns {() => void} a function that removes the handler
   */
  onRequest(handler) {
    if (typeof handler !== "function") throw new TypeError("onRequest needs a function");
    this._requestHandler = handler;
    return () => { if (this._requestHandler === handler) this._requestHandler = null; };
  }

  /** Drop the current socket and reconnect now (after a network change, say). */
  reconnect() {
    if (this._closing || this.state === "idle" || this.state === "closed") return;
    const ws = this._ws;
    this._detach();
    if (ws) ws.close(1000, "reconnecting");
    this._emit("disconnected", { code: 1000, reason: "reconnecting", willReconnect: true });
    this._attempt = 0;
    this._open();
  }

  /**
   * Send a message to one user; while disconnected it waits (at most `maxQueued` sends).
   * @param {string} to @param {string} content
   * @param {{reference?: string, feature?: "RELIABLE"|"FAST", clientMessageId?: string, confirmationEnabled?: boolean}} [opts]
   * @returns {Promise<object>} in ACK mode a RELIABLE send resolves with the MESSAGE_ACCEPTED data
   *   {id, clientMessageId, recipients, duplicate} and rejects on a refusal (rate limits and "server
   *   busy" are retried after retryAfterMs); otherwise it resolves {sent: true, clientMessageId} once
   *   written (the protocol answers nothing more), and a later refusal is an `error` event.
   */
  send(to, content, opts = {}) {
    return this._enqueue("MESSAGE", { to, content }, opts);
  }

  /** One message to several users (GROUP_MESSAGE); answers as `send`. Like a send, it carries a
   * clientMessageId: resent after a reconnect, it is stored and delivered once.
   * @param {string[]} to @param {string} content
   * @param {{reference?: string, feature?: string, clientMessageId?: string}} [opts] */
  sendGroup(to, content, opts = {}) {
    return this._enqueue("GROUP_MESSAGE", { to: [...to], content }, opts);
  }

  /**
   * Ask an endpoint of the app's server (docs/protocol.md "Requests") and wait for its answer, however
   * long it takes: the REQUEST is resent with the same clientMessageId after every reconnect until the
   * server has stored it (stored and asked once either way), then the outcome comes pushed or with the
   * fetch after a reconnect. In ACK mode the outcome is acknowledged once the promise is settled.
   * @param {string} endpoint @param {string} content
   * @param {{timeoutMs?: number, clientMessageId?: string}} [opts] clientMessageId: made up when left
   *   out; the same one again (after a page reload, say) gets the first request's outcome
   * @returns {Promise<{content: string, requestId: string, id: string, clientMessageId: string, duplicate: boolean}>}
   *   resolves on RESOLVE; rejects on REJECT with an Error carrying {type: "REJECT", content, reason?
   *   ("timeout" | "endpoint_failed"), requestId, id}, and at once on a refusal (INVALID_MESSAGE) with its
   *   {reason, code, limit?} (rate limits and "server busy" are retried after retryAfterMs)
   */
  request(endpoint, content, opts = {}) {
    if (this.state === "closed") return Promise.reject(new Error("the client is closed"));
    if (this._outbox.length >= this.options.maxQueued) {
      return Promise.reject(new Error(`send queue full (${this.options.maxQueued})`));
    }
    const cmid = opts.clientMessageId || newId();
    if (this._requests.has(cmid)) return Promise.reject(new Error(`request ${cmid} is waiting already`));
    const data = { endpoint, content, clientMessageId: cmid };
    if (opts.timeoutMs !== undefined) data.timeoutMs = opts.timeoutMs;
    return new Promise((resolve, reject) => {
      const pending = { requestId: null, duplicate: false, resolve, reject };
      this._requests.set(cmid, pending);
      this._outbox.push({ frame: { type: "REQUEST", data }, cmid, request: true, awaits: true, state: "queued",
        tries: 0, resolve: () => {}, reject: (error) => { this._requests.delete(cmid); reject(error); } });
      this._pump();
    });
  }

  /**
   * Read a channel: with `since`, what came after that offset first; else from now on (or from the
   * last offset seen). After a reconnect it resumes from its last offset by itself.
   * @param {string} channel @param {{since?: number, token?: string | Function}} [opts] token: a grant
   *   for a non-public channel (a callback is asked again at every reconnect)
   * @returns {Promise<{channel: string, offset: number}>}
   */
  subscribe(channel, opts = {}) {
    if (this.state === "closed") return Promise.reject(new Error("the client is closed"));
    let entry = this._channels.get(channel);
    if (!entry) {
      entry = { offset: null, token: undefined, server: false, waiters: [] };
      this._channels.set(channel, entry);
    }
    entry.server = false;
    if (opts.token !== undefined) entry.token = opts.token;
    if (opts.since !== undefined) entry.offset = opts.since;
    const promise = new Promise((resolve, reject) => entry.waiters.push({ resolve, reject }));
    if (this.state === "connected") this._subscribeFrame(channel, entry);
    return promise;
  }

  /** Stop reading a channel. @param {string} channel @returns {Promise<void>} */
  unsubscribe(channel) {
    const entry = this._channels.get(channel);
    this._channels.delete(channel);
    if (entry) this._rejectAll(entry.waiters, new Error(`unsubscribed from ${channel}`));
    if (this.state !== "connected") return Promise.resolve();
    return new Promise((resolve, reject) => {
      if (!this._unsubscribing.has(channel)) this._unsubscribing.set(channel, []);
      this._unsubscribing.get(channel).push({ resolve, reject });
      this._work({ type: "UNSUBSCRIBE", data: { channel } });
    });
  }

  /** The last offset seen on each channel (to keep across page loads, and pass back as `since`). */
  offsets() {
    const out = {};
    for (const [name, entry] of this._channels) if (entry.offset !== null) out[name] = entry.offset;
    return out;
  }

  /** Ask for missed messages now (it happens by itself after every authentication). */
  fetchMissing(count = this.options.fetchCount) {
    if (this.state !== "connected") return;
    this._flushAcks();
    this._fetchGot = 0;
    this._work({ type: "FETCH_MISSING_MESSAGES_REQUEST", data: { count } });
  }

  /** Send a PING (it happens by itself while the connection is idle). */
  ping() {
    if (this.state === "connected") this._write({ type: "PING", data: {} });
  }

  /** The app's master user only: close a user's connections everywhere. */
  disconnectUser(userId) {
    if (this.state === "connected") this._work({ type: "CLOSE_CONNECTION", data: { userId } });
  }

  // --- the socket ------------------------------------------------------------------------------

  async _open() {
    const gen = ++this._gen;
    this._presented = null;
    this._clear("reconnect"); // reconnect() may come while a retry is waiting
    this._setState("connecting");
    let token;
    try {
      token = typeof this.options.token === "function" ? await this.options.token() : this.options.token;
    } catch (err) {
      if (gen !== this._gen || this._closing) return;
      this._emit("error", failure("the token callback failed", { cause: err }));
      this._ended(1006, "no token");
      return;
    }
    if (gen !== this._gen || this._closing) return;
    let ws;
    try {
      ws = new this.WebSocket(this.options.url);
    } catch (err) { // a malformed URL, or ws: from an https: page: retrying cannot help
      this._emit("error", failure(`cannot open ${this.options.url}`, { cause: err }));
      return this._terminal(1006, "cannot open the WebSocket");
    }
    this._ws = ws;
    this._opened = false;
    this._arm(this.options.connectTimeoutMs, "no answer to AUTH_CLIENT");
    ws.onopen = () => {
      if (ws !== this._ws) return;
      this._opened = true;
      this._setState("authenticating");
      const data = { appId: this.options.appId, userId: this.options.userId };
      if (token) data.token = token;
      if (this.options.acks) data.acks = true;
      if (this._sessionId) data.sessionId = this._sessionId;
      this._presented = this._sessionId;
      this._write({ type: "AUTH_CLIENT", data });
    };
    ws.onmessage = (event) => { if (ws === this._ws) this._receive(event.data); };
    ws.onclose = (event) => {
      if (ws !== this._ws) return;
      this._detach();
      this._ended(event.code || 1006, event.reason || "");
    };
    ws.onerror = () => {}; // a close event follows
  }

  /** Forget the current socket: nothing it does reaches the client any more. */
  _detach() {
    const ws = this._ws;
    if (ws) ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
    this._ws = null;
    this._gen++;
    for (const name of ["deadline", "ping", "acks", "fetch", "stable"]) this._clear(name);
    this._ackIds = []; // unacknowledged messages come again on the next connection
    this._recent = [];
    for (const entry of this._outbox) entry.state = "queued"; // never accepted: resent
    // A new connection reads only what is subscribed again: an unsubscribe in flight is done.
    for (const waiters of this._unsubscribing.values()) waiters.forEach((w) => w.resolve());
    this._unsubscribing.clear();
  }

  /** The socket is gone (its handlers detached): reconnect or stop. */
  _ended(code, reason) {
    if (this._closing) return;
    if (code === 1008 && reason.startsWith(WRONG_USER) && this._presented) return this._sessionRefused(code, reason);
    if (NO_RECONNECT.has(code)) return this._terminal(code, reason);
    if (!this._opened) this._fallBack();
    const delayMs = reconnectDelay(this._attempt, code, this.options, this.random);
    this._attempt += 1;
    this._setState("reconnecting");
    this._emit("disconnected", { code, reason, willReconnect: true });
    this._emit("reconnecting", { delayMs, attempt: this._attempt });
    this._timer("reconnect", delayMs, () => this._open());
  }

  /** The sessionId presented is not this user's (another user's, or from another app): forget it and
   * log in afresh at once (without a sessionId this cannot happen again). */
  _sessionRefused(code, reason) {
    const refused = this._presented;
    this._sessionId = this._presented = null;
    this._emit("error", failure(`the session ${refused} was refused (${reason}); logging in with a new one`,
      { reason: WRONG_USER, code, sessionId: refused }));
    this._setState("reconnecting");
    this._emit("disconnected", { code, reason, willReconnect: true });
    return this._open();
  }

  /** Stop for good, closing the socket. */
  _stop(reason) {
    this._closing = true;
    const ws = this._ws;
    this._detach();
    if (ws) ws.close(1000, reason);
    this._terminal(1000, reason);
  }

  /** The current URL could not be reached: the next attempt goes to the next of `url` and
   * `fallbackUrls`, in turn (each redirects the user where it is served). */
  _fallBack() {
    const urls = [this._firstUrl, ...(this.options.fallbackUrls || [])];
    if (urls.length < 2) return;
    const from = this.options.url;
    const to = urls[(urls.indexOf(from) + 1) % urls.length]; // a redirect's URL is not listed: back to the first
    this.options.url = to;
    this._emit("fallback", { from, to });
  }

  /** Stopped for good: whatever waits is rejected. */
  _terminal(code, reason) {
    for (const name of Object.keys(this._timers)) this._clear(name);
    const quiet = this.state === "closed" || this.state === "idle";
    this._setState("closed");
    const error = failure(`connection closed (${code}${reason ? ` ${reason}` : ""})`, { code, reason });
    this._rejectAll(this._outbox.splice(0), error);
    this._rejectAll([...this._requests.values()], error);
    this._requests.clear();
    for (const entry of this._channels.values()) this._rejectAll(entry.waiters.splice(0), error);
    this._rejectAll(this._waiting.splice(0), error);
    if (this._sessionClosing) this._rejectAll([this._sessionClosing], error);
    this._sessionClosing = null;
    if (!quiet) this._emit("disconnected", { code, reason, willReconnect: false });
  }

  _write(frame) {
    if (this._ws?.readyState !== OPEN) return false;
    const text = JSON.stringify(frame);
    this._ws.send(text);
    this.options.debug?.("out", text);
    return true;
  }

  /** A work frame (it draws on the pace the outbox keeps too). */
  _work(frame) {
    this._take(true);
    return this._write(frame);
  }

  _receive(text) {
    this.options.debug?.("in", text);
    this._lastIn = Date.now();
    this._clear("deadline");
    let frame;
    try { frame = JSON.parse(text); } catch { return this._emit("error", new Error("a frame that is not JSON")); }
    const data = frame.data || {};
    switch (frame.type) {
      case "AUTH_CLIENT_REPLY": return this._authenticated(data);
      case "MESSAGE": case "MESSAGE_CONFIRMATION": return this._message(frame.type, data, frame.reference);
      case "FETCH_MISSING_MESSAGES_COMPLETE": return this._fetched(data.leftMissingCount);
      case "MESSAGE_ACCEPTED": return this._accepted(data);
      case "REQUEST_ACCEPTED": return this._requestAccepted(data);
      case "RESOLVE": case "REJECT": return this._outcome(frame.type, data);
      case "SERVER_REQUEST": return this._serverRequest(data);
      case "ANSWER_ACCEPTED": return this._answerAccepted(data);
      case "SESSION_CLOSED": return this._sessionClosed(data);
      case "CHANNEL_MESSAGE": return this._channelMessage(data);
      case "SUBSCRIBED": return this._subscribed(data);
      case "UNSUBSCRIBED": {
        const waiters = this._unsubscribing.get(data.channel) || [];
        this._unsubscribing.delete(data.channel);
        waiters.forEach((w) => w.resolve());
        return this._emit("unsubscribed", { channel: data.channel });
      }
      case "USER_CONNECTED": return this._emit("userConnected", { userId: data.userId });
      case "USER_DISCONNECTED": return this._emit("userDisconnected", { userId: data.userId });
      case "ONLINE_USERS":
        return this._emit("onlineUsers", { users: data.users, page: data.page, pages: data.pages, count: data.count });
      case "INVALID_MESSAGE": case "GENERAL_ERROR": return this._refused(frame.type, data);
      case "PING": this._write({ type: "PONG", data: {} }); return undefined;
      default: return undefined; // PONG, AUTH_REQUIRED, and whatever a newer server adds
    }
  }

  _authenticated(data) {
    if (!data.isAuthenticated) {
      if (typeof data.redirect === "string" && data.redirect) return this._redirect(data.redirect);
      this._emit("error", failure("authentication refused", { reason: "authentication refused" }));
      return; // the server closes with the reason
    }
    this._redirects = 0;
    const resumed = Boolean(this._presented) && data.sessionId === this._presented;
    if (typeof data.sessionId === "string" && data.sessionId) this._sessionId = data.sessionId;
    this._clear("deadline");
    this._setState("connected");
    this._timer("stable", this.options.stableMs, () => { this._attempt = 0; });
    this._schedulePing();
    this._emit("connected", { appId: this.options.appId, userId: this.options.userId, sessionId: this._sessionId, resumed });
    this._waiting.splice(0).forEach((w) => w.resolve());
    if (this.state !== "connected") return; // a `connected` listener closed the client
    for (const [name, entry] of this._channels) this._subscribeFrame(name, entry);
    this.fetchMissing();
    this._pump();
    if (this._sessionClosing) this._closeSessionFrame();
  }

  _closeSessionFrame() {
    this._flushAcks(); // (what was handled counts before the session ends)
    this._work({ type: "CLOSE_SESSION", data: {} });
  }

  /** SESSION_CLOSED: the session is over, and so is the client (the server closes with 1000). */
  _sessionClosed(data) {
    const waiting = this._sessionClosing;
    this._sessionClosing = null;
    this._sessionId = null;
    this._stop("session closed");
    waiting?.resolve(data.discarded);
  }

  /** The user lives in another domain: go to its WebSocket URL now, with the same credentials (and
   * reconnect there from now on); more than MAX_REDIRECTS in a row end the client. */
  _redirect(url) {
    const from = this.options.url;
    const ws = this._ws;
    this._detach();
    if (ws) ws.close(1000, "redirected");
    this._redirects += 1;
    if (this._redirects > MAX_REDIRECTS) {
      this._emit("error", failure(`too many redirects (${MAX_REDIRECTS} in a row, the last to ${url})`,
        { reason: "too many redirects", redirect: url }));
      return this._terminal(1008, "too many redirects");
    }
    this._emit("redirect", { from, to: url, count: this._redirects });
    this.options.url = url;
    return this._open();
  }

  /** PING once the server has been quiet for `pingIntervalMs`; no answer in time ends the socket. */
  _schedulePing(ms = this.options.pingIntervalMs) {
    this._timer("ping", ms, () => {
      const idle = Date.now() - this._lastIn;
      if (idle < this.options.pingIntervalMs) {
        this._schedulePing(this.options.pingIntervalMs - idle);
        return;
      }
      this.ping();
      this._arm(this.options.answerTimeoutMs, "no answer to PING");
      this._schedulePing();
    });
  }

  /** Give up on the socket unless a frame arrives within `ms`. */
  _arm(ms, reason) {
    this._timer("deadline", ms, () => {
      const ws = this._ws;
      this._detach();
      if (ws) ws.close(4000, reason);
      this._ended(1006, reason);
    });
  }

  // --- receiving -------------------------------------------------------------------------------

  /** A stored message's id, counted for the fetch: false when it was shown before (then only the
   * server needs to hear about it again). */
  _firstTime(id) {
    this._fetchGot = (this._fetchGot || 0) + 1;
    if (this._seen.has(id)) {
      if (this.options.acks) this._ack(id);
      return false;
    }
    this._seen.add(id);
    if (this._seen.size > this.options.seenIds) this._seen.delete(this._seen.values().next().value);
    return true;
  }

  _message(type, data, reference) {
    const id = data.id;
    if (id !== undefined && !this._firstTime(id)) return;
    const event = type === "MESSAGE"
      ? { from: data.from, content: data.content, id, seq: data.seq, reference }
      : { reference: data.reference, id, seq: data.seq };
    this._handled(id, this._emit(type === "MESSAGE" ? "message" : "confirmation", event, true), "message");
  }

  /** ACK mode: acknowledge once the listeners' `results` are done; one that failed leaves it unacknowledged. */
  _handled(id, results, what) {
    if (!this.options.acks || id === undefined) return;
    const failed = (error) => {
      this._seen.delete(id); // not handled: when it comes again, it is shown again
      this._emit("error", failure(`a ${what} handler failed; the ${what} is not acknowledged`, { cause: error, id }));
    };
    if (results.failed) failed(results.error);
    else if (results.some(isThenable)) Promise.all(results).then(() => this._ack(id), failed);
    else this._ack(id);
  }

  /** REQUEST_ACCEPTED: the request is stored; from now on only its outcome is awaited. */
  _requestAccepted(data) {
    const entry = this._outbox.find((e) => e.request && e.cmid === data.clientMessageId);
    if (entry) this._outbox.splice(this._outbox.indexOf(entry), 1);
    const pending = this._requests.get(data.clientMessageId);
    if (pending) Object.assign(pending, { requestId: data.id, duplicate: data.duplicate === true });
  }

  /** RESOLVE or REJECT: settles the request waiting for it (matched by its clientMessageId), or is
   * an `outcome` event. Either way each outcome id once. */
  _outcome(type, data) {
    const id = data.id;
    if (!this._firstTime(id)) return;
    const outcome = { content: data.content, requestId: data.requestId, clientMessageId: data.clientMessageId, id };
    const pending = this._requests.get(data.clientMessageId);
    if (!pending) {
      const event = { type: type === "RESOLVE" ? "resolve" : "reject", ...outcome };
      if (data.reason !== undefined) event.reason = data.reason;
      if (!this._listeners.get("outcome")?.size) {
        this._seen.delete(id); // not handled: it comes again
        const fate = this.options.acks ? ": it is not acknowledged, and comes again" : "";
        this._emit("error", failure(`the outcome of request ${data.requestId} came, and nobody listens to 'outcome'`
          + ` events${fate}`, { reason: "unhandled outcome", id, data }));
        return;
      }
      this._handled(id, this._emit("outcome", event, true), "outcome");
      return;
    }
    this._requests.delete(data.clientMessageId);
    const entry = this._outbox.find((e) => e.request && e.cmid === data.clientMessageId);
    if (entry) this._outbox.splice(this._outbox.indexOf(entry), 1); // (fetched before its resend was accepted)
    if (type === "RESOLVE") pending.resolve({ ...outcome, duplicate: pending.duplicate });
    else {
      const why = data.reason ? ` (${data.reason})` : "";
      pending.reject(failure(`request ${data.requestId} rejected${why}${data.content ? `: ${data.content}` : ""}`,
        { type: "REJECT", ...outcome, reason: data.reason }));
    }
    if (this.options.acks) this._ack(id);
  }

  // --- the server asking the client ------------------------------------------------------------

  /** SERVER_REQUEST: handed to the `onRequest` handler, each requestId once. */
  _serverRequest(data) {
    this._fetchGot = (this._fetchGot || 0) + 1;
    const { id, requestId } = data;
    const known = this._answers.get(requestId);
    if (known) { // it came again: its answer is on its way, or was accepted (then only the server needs to hear)
      if (known.state === "done" && this.options.acks) this._ack(id);
      return;
    }
    const handler = this._requestHandler;
    if (!handler) {
      const fate = this.options.acks ? ": it is not acknowledged, and comes again" : "";
      this._emit("error", failure(`server request ${requestId} came, and no onRequest handler is registered${fate}`,
        { reason: "unhandled server request", requestId, id, data }));
      return;
    }
    const answer = { id, state: "handling" };
    this._answers.set(requestId, answer);
    if (this._answers.size > this.options.seenIds) {
      for (const [key, old] of this._answers) {
        if (this._answers.size <= this.options.seenIds) break;
        if (old.state === "done") this._answers.delete(key);
      }
    }
    const request = { requestId, content: data.content, id, seq: data.seq };
    new Promise((resolve) => { resolve(handler(data.content, request)); })
      .then((value) => ["RESOLVE", answerText(value)], (error) => ["REJECT", rejectionText(error)])
      .catch((error) => ["REJECT", rejectionText(error)]) // (a value that is no JSON)
      .then(([type, content]) => this._answer(requestId, answer, type, content));
  }

  /** The handler is done: its answer goes out, and again after every reconnect until accepted. */
  _answer(requestId, answer, type, content) {
    if (this._answers.get(requestId) !== answer) return;
    if (this.state === "closed") { // unacknowledged: it comes again when the client connects again
      this._answers.delete(requestId);
      return;
    }
    answer.state = "answering";
    this._outbox.push({ frame: { type, data: { requestId, content } }, cmid: requestId, answer: true, awaits: true,
      state: "queued", tries: 0, resolve: () => {}, reject: (error) => this._answerRefused(requestId, answer, error) });
    this._pump();
  }

  _answerAccepted(data) {
    const entry = this._outbox.find((e) => e.answer && e.cmid === data.requestId);
    if (entry) this._outbox.splice(this._outbox.indexOf(entry), 1);
    const answer = this._answers.get(data.requestId);
    if (!answer || answer.state === "done") return;
    answer.state = "done";
    if (this.options.acks) this._ack(answer.id);
    if (entry) {
      this._emit("answered", { requestId: data.requestId, type: entry.frame.type === "RESOLVE" ? "resolve" : "reject",
        content: entry.frame.data.content, replay: data.replay === true });
    }
  }

  /** The server refused the answer for good (request_closed: answered already, or timed out; not_found):
   * it is not sent again, and the SERVER_REQUEST is acknowledged: nothing more can come of it. */
  _answerRefused(requestId, answer, error) {
    if (this.state === "closed") { // the client stopped: unacknowledged, it comes again on the next connect
      if (this._answers.get(requestId) === answer) this._answers.delete(requestId);
      return;
    }
    answer.state = "done";
    if (this.options.acks) this._ack(answer.id);
    this._emit("error", failure(`the answer to server request ${requestId} was refused${error.code ? ` (${error.code})` : ""}:`
      + ` ${error.reason}`, { reason: error.reason, code: error.code, type: error.type, data: error.data, requestId }));
  }

  _ack(id) {
    this._ackIds.push(id);
    if (this._ackIds.length >= ACK_MAX) this._flushAcks();
    else if (!this._timers.acks) this._timer("acks", this.options.ackDelayMs, () => this._flushAcks());
  }

  _flushAcks() {
    this._clear("acks");
    while (this._ackIds.length && this.state === "connected") {
      this._write({ type: "ACK", data: { ids: this._ackIds.splice(0, ACK_MAX) } });
    }
  }

  _fetched(left) {
    if (!(left > 0)) return this._emit("synced", {});
    // Nothing came (an ACK window full of messages our handlers still hold): ask again shortly.
    if (!this._fetchGot) return this._timer("fetch", 1000, () => this.fetchMissing());
    return this.fetchMissing();
  }

  _channelMessage(data) {
    let entry = this._channels.get(data.channel);
    if (!entry) { // a server-managed subscription: remembered so it resumes too
      entry = { offset: null, token: undefined, server: true, waiters: [] };
      this._channels.set(data.channel, entry);
    }
    if (entry.offset !== null && data.offset <= entry.offset) return; // seen at the seam already
    entry.offset = data.offset;
    this._emit("channelMessage", { channel: data.channel, content: data.content, offset: data.offset });
  }

  async _subscribeFrame(name, entry) {
    const gen = this._gen;
    const data = { channel: name };
    if (entry.offset !== null) data.since = entry.offset;
    try {
      const token = typeof entry.token === "function" ? await entry.token() : entry.token;
      if (token) data.token = token;
    } catch (err) {
      this._rejectAll(entry.waiters.splice(0), failure("the channel token callback failed", { cause: err }));
      return;
    }
    if (gen === this._gen && this._channels.get(name) === entry) this._work({ type: "SUBSCRIBE", data });
  }

  _subscribed(data) {
    const entry = this._channels.get(data.channel);
    if (!entry) return;
    entry.offset = data.offset; // the server wrote (or skipped, past retention) everything up to it
    entry.waiters.splice(0).forEach((w) => w.resolve({ channel: data.channel, offset: data.offset }));
    this._emit("subscribed", { channel: data.channel, offset: data.offset });
  }

  // --- sending ---------------------------------------------------------------------------------

  _enqueue(type, data, opts) {
    if (this.state === "closed") return Promise.reject(new Error("the client is closed"));
    if (this._outbox.length >= this.options.maxQueued) {
      return Promise.reject(new Error(`send queue full (${this.options.maxQueued})`));
    }
    const fast = opts.feature === "FAST";
    const frame = { type, data };
    data.clientMessageId = opts.clientMessageId || newId(); // MESSAGE and GROUP_MESSAGE alike
    if (opts.reference !== undefined && opts.reference !== "") frame.reference = opts.reference;
    if (fast) frame.feature = "FAST";
    if (opts.confirmationEnabled === false) frame.confirmationEnabled = false;
    return new Promise((resolve, reject) => {
      this._outbox.push({ frame, cmid: data.clientMessageId, group: type === "GROUP_MESSAGE",
        awaits: this.options.acks && !fast, state: "queued", tries: 0, resolve, reject });
      this._pump();
    });
  }

  /** Draw one token of the work pace; returns the milliseconds until one is there (0: taken). */
  _take(force = false) {
    const now = Date.now();
    const { sendsPerSecond: rate, sendBurst: burst } = this.options;
    this._tokens = Math.min(burst, this._tokens + ((now - this._tokensAt) / 1000) * rate);
    this._tokensAt = now;
    if (this._tokens < 1 && !force) return Math.ceil(((1 - this._tokens) / rate) * 1000);
    this._tokens -= 1;
    return 0;
  }

  /** Write queued sends, in order, at the client's pace and after any pause the server asked for. */
  _pump() {
    if (this.state !== "connected" || this._timers.pump) return;
    for (const entry of this._outbox.filter((e) => e.state === "queued")) {
      const wait = Math.max(this._pausedUntil - Date.now(), 0) || this._take();
      if (wait > 0) {
        this._timer("pump", wait, () => this._pump());
        return;
      }
      if (!this._write(entry.frame)) return;
      if (entry.awaits) {
        entry.state = "sent";
        continue;
      }
      this._outbox.splice(this._outbox.indexOf(entry), 1);
      this._recent.push(entry);
      if (this._recent.length > 256) this._recent.shift();
      entry.resolve({ sent: true, clientMessageId: entry.cmid });
      entry.resolve = () => {}; // settled: a later refusal is an `error` event
      entry.reject = (error) => this._emit("error", error);
    }
  }

  _accepted(data) {
    const entry = this._outbox.find((e) => e.state === "sent" && !e.request && !e.answer
      && (data.clientMessageId ? e.cmid === data.clientMessageId : e.group));
    const accepted = { id: data.id, clientMessageId: data.clientMessageId, recipients: data.recipients,
      duplicate: data.duplicate === true };
    if (entry) {
      this._outbox.splice(this._outbox.indexOf(entry), 1);
      entry.resolve(accepted);
    }
    this._emit("accepted", accepted);
  }

  _refused(type, payload) {
    const general = type === "GENERAL_ERROR";
    const echo = general ? payload : payload.data;
    const reason = general ? "the server failed while handling the frame; it may be sent again" : payload.reason;
    const error = failure(reason, { reason, data: echo, limit: payload.limit, type,
      retryAfterMs: general ? undefined : payload.retryAfterMs, code: general ? undefined : payload.code });
    const retryAfter = error.retryAfterMs;
    const isObject = echo && typeof echo === "object" && !Array.isArray(echo);
    if (isObject && ("to" in echo || "endpoint" in echo || "requestId" in echo)) { // a send, a request or an answer
      return this._sendRefused(this._sendOf(echo), error, retryAfter, general);
    }
    if (isObject && typeof echo.channel === "string") return this._channelRefused(echo, error, retryAfter);
    if (isObject && "count" in echo) {
      if (retryAfter !== undefined || general) this._timer("fetch", retryAfter || 2000, () => this.fetchMissing());
      else this._emit("error", error);
      return undefined;
    }
    if (isObject && Array.isArray(echo.ids) && retryAfter !== undefined) {
      this._timer("ackRetry", retryAfter, () => { echo.ids.forEach((id) => this._ack(id)); });
      return undefined;
    }
    if (echo === undefined && !general) { // refused without an echo (content too large): the oldest waiting send
      const entry = this._outbox.find((e) => e.state === "sent");
      if (entry) return this._sendRefused(entry, error, retryAfter, false);
    }
    this._emit("error", error);
    return undefined;
  }

  _sendOf(echo) {
    if (!("to" in echo) && !("endpoint" in echo)) { // an answer to a server request
      return this._outbox.find((e) => e.answer && e.state === "sent" && e.cmid === String(echo.requestId));
    }
    const all = [...this._outbox.filter((e) => e.state === "sent"), ...this._recent];
    const request = "endpoint" in echo;
    if (typeof echo.clientMessageId === "string") {
      return all.find((e) => e.cmid === echo.clientMessageId && Boolean(e.request) === request);
    }
    const text = JSON.stringify(echo);
    return all.find((e) => e.group && JSON.stringify(e.frame.data) === text) || all.find((e) => e.group && e.awaits);
  }

  _sendRefused(entry, error, retryAfter, general) {
    if (!entry) return this._emit("error", error);
    const again = retryAfter !== undefined || (general && entry.tries < GENERAL_ERROR_TRIES);
    if (again) {
      entry.tries += 1;
      entry.state = "queued";
      if (!this._outbox.includes(entry)) { // a linker-mode send already settled: back to the front
        this._recent.splice(this._recent.indexOf(entry), 1);
        this._outbox.unshift(entry);
      }
      this._pausedUntil = Date.now() + (retryAfter !== undefined ? retryAfter : 1000 * 2 ** (entry.tries - 1));
      this._clear("pump");
      return this._pump();
    }
    const i = this._outbox.indexOf(entry);
    if (i >= 0) this._outbox.splice(i, 1);
    entry.reject(error);
  }

  _channelRefused(echo, error, retryAfter) {
    const entry = this._channels.get(echo.channel);
    if (!entry && this._unsubscribing.has(echo.channel)) { // an UNSUBSCRIBE refused
      const waiters = this._unsubscribing.get(echo.channel);
      this._unsubscribing.delete(echo.channel);
      if (retryAfter !== undefined) {
        this._timer(`unsub:${echo.channel}`, retryAfter, () => {
          const again = this.unsubscribe(echo.channel);
          waiters.forEach((w) => w.resolve(again));
        });
      } else {
        this._rejectAll(waiters, error);
      }
      return;
    }
    if (retryAfter !== undefined && entry) {
      this._timer(`sub:${echo.channel}`, retryAfter, () => {
        if (this._channels.get(echo.channel) === entry && this.state === "connected") this._subscribeFrame(echo.channel, entry);
      });
      return;
    }
    if (entry) this._channels.delete(echo.channel);
    if (entry?.waiters.length) return this._rejectAll(entry.waiters.splice(0), error);
    if (!entry?.server) this._emit("error", error); // (a server-managed subscription that ended: no news)
    return undefined;
  }

  // --- plumbing --------------------------------------------------------------------------------

  _setState(state) {
    if (this.state !== state) this._emit("state", (this.state = state));
  }

  /** Call the listeners; returns their results (and whether one threw, when `collect`). */
  _emit(name, payload, collect = false) {
    const results = [];
    for (const fn of [...(this._listeners.get(name) || [])]) {
      try {
        results.push(fn(payload));
      } catch (error) {
        if (collect) Object.assign(results, { failed: true, error });
        else if (name !== "error") this._emit("error", failure(`a '${name}' handler failed`, { cause: error }));
      }
    }
    if (name === "error" && results.length === 0 && typeof console !== "undefined") console.warn("switchboard:", payload);
    return results;
  }

  _rejectAll(list, error) {
    list.forEach((item) => item.reject(error));
  }

  /** One timer per name: setting it again replaces it. */
  _timer(name, ms, fn) {
    this._clear(name);
    this._timers[name] = setTimeout(() => { delete this._timers[name]; fn(); }, ms);
  }

  _clear(name) {
    clearTimeout(this._timers[name]);
    delete this._timers[name];
  }
}

export default Switchboard;
