// Type declarations of switchboard.js (the package switchboard-client), written by hand: the
// comment at the top of switchboard.js and docs/protocol.md are the reference.

/** What a client is doing now (the `state` event). */
export type State = "idle" | "connecting" | "authenticating" | "connected" | "reconnecting" | "closed";

/** RELIABLE (default) is stored and delivered at least once; FAST is pushed to live connections only. */
export type Feature = "RELIABLE" | "FAST";

/** A token, or a callback asked before every connection (to refresh it). */
export type TokenSource = string | (() => string | Promise<string>);

/** The constructor of a WebSocket (the browser's, Node 22's global one, or the `ws` package's). */
export type WebSocketConstructor = new (url: string) => {
  readyState: number;
  send(data: string): void;
  close(code?: number, reason?: string): void;
  onopen: ((event: unknown) => void) | null;
  onmessage: ((event: { data: unknown }) => void) | null;
  onclose: ((event: { code: number; reason: string }) => void) | null;
  onerror: ((event: unknown) => void) | null;
};

/** Everything but `url`, `appId` and `userId` has a default. */
export interface SwitchboardOptions {
  /** The WebSocket URL, `wss://host/ws`. */
  url: string;
  appId: string;
  /** `<appName>-<number>`, e.g. `ANZ-1001`. */
  userId: string;
  token?: TokenSource;
  /** ACK mode: a message counts as delivered once every `message` handler is done. Default false. */
  acks?: boolean;
  /** A session to resume (an earlier client's `sessionId`, kept across a page reload, say). */
  sessionId?: string;
  /** Other domains' WebSocket URLs, tried in turn while the current one cannot be reached at all. */
  fallbackUrls?: string[];
  /** The WebSocket to use; default `globalThis.WebSocket`. */
  WebSocket?: WebSocketConstructor;
  /** A source of random numbers in [0, 1) for the reconnect jitter; default Math.random. */
  random?: () => number;
  /** Messages per FETCH_MISSING_MESSAGES_REQUEST (the server caps it at 2000). Default 100. */
  fetchCount?: number;
  /** Every reconnect waits at least this. Default 500. */
  minDelayMs?: number;
  /** The first wait is random in [minDelayMs, firstMaxDelayMs], then its ceiling doubles. Default 2000. */
  firstMaxDelayMs?: number;
  /** Default 60000. */
  maxDelayMs?: number;
  /** A connection authenticated this long resets the backoff. Default 10000. */
  stableMs?: number;
  /** PING after this long without a frame from the server. Default 25000. */
  pingIntervalMs?: number;
  /** No frame this long after a PING: the link is dead. Default 10000. */
  answerTimeoutMs?: number;
  /** From opening the socket to AUTH_CLIENT_REPLY. Default 15000. */
  connectTimeoutMs?: number;
  /** Sends waiting for a connection or an acceptance. Default 1000. */
  maxQueued?: number;
  /** Message ids remembered to drop redeliveries. Default 10000. */
  seenIds?: number;
  /** ACKs wait this long to go out together. Default 20. */
  ackDelayMs?: number;
  /** Pace of work frames, below the server's default budget (50/s, burst 100). Default 20. */
  sendsPerSecond?: number;
  /** Default 40. */
  sendBurst?: number;
  /** Called with every frame, for debugging. Default null. */
  debug?: ((direction: "in" | "out", text: string) => void) | null;
}

export interface SendOptions {
  reference?: string;
  feature?: Feature;
  /** Made up when left out; a resend with the same id is stored once. */
  clientMessageId?: string;
  confirmationEnabled?: boolean;
}

export type GroupSendOptions = Omit<SendOptions, "confirmationEnabled">;

/** In ACK mode a RELIABLE send resolves with the server's MESSAGE_ACCEPTED. */
export interface Accepted {
  /** The stored message's id (a string of digits). */
  id: string;
  clientMessageId: string;
  recipients: number;
  /** True when the clientMessageId was stored before (`id` is the first send's). */
  duplicate: boolean;
}

/** Outside ACK mode (or FAST), a send resolves once written: the protocol answers nothing more. */
export interface Sent {
  sent: true;
  clientMessageId: string;
}

export type SendResult = Accepted | Sent;

export interface Message {
  from: string;
  content: string;
  /** FAST messages have no id or seq. */
  id?: string;
  seq?: number;
  reference?: string;
}

export interface Confirmation {
  reference: string;
  id?: string;
  seq?: number;
}

export interface ChannelMessage {
  channel: string;
  content: string;
  offset: number;
}

export interface Subscribed {
  channel: string;
  offset: number;
}

export interface SubscribeOptions {
  /** Read what came after this offset first. */
  since?: number;
  /** A grant for a non-public channel (a callback is asked again at every reconnect). */
  token?: TokenSource;
}

export interface RequestOptions {
  /** At most the endpoint's maximum; default the endpoint's timeout. */
  timeoutMs?: number;
  /** Made up when left out. The same id again (after a page reload, say) is the same request: its outcome comes again. */
  clientMessageId?: string;
}

/** A request's RESOLVE: what `request()` resolves with. */
export interface Outcome {
  /** The server's answer. */
  content: string;
  requestId: string;
  /** The outcome message's own id (acknowledged by the client in ACK mode). */
  id: string;
  clientMessageId: string;
  /** True when the server had the request already (a resend after a doubt, or the same clientMessageId again). */
  duplicate: boolean;
}

/** The `outcome` event: the outcome of a request this client is not waiting for (made before a page reload, say). */
export interface UnclaimedOutcome {
  type: "resolve" | "reject";
  content: string;
  requestId: string;
  clientMessageId: string;
  id: string;
  /** Only when the platform rejected. */
  reason?: "timeout" | "endpoint_failed";
}

/** A request the app's server makes of the user (SERVER_REQUEST), as the `onRequest` handler gets it. */
export interface ServerRequest {
  requestId: string;
  content: string;
  /** The SERVER_REQUEST message's own id (acknowledged in ACK mode once the answer is accepted). */
  id: string;
  seq: number;
}

/**
 * Answers a server request: what it returns (or its promise resolves with) is a RESOLVE with that content
 * (a string as it is, anything else as JSON); what it throws is a REJECT with the error's `content` if it
 * has one, else its message.
 */
export type RequestHandler = (content: string, request: ServerRequest) => unknown;

/** The `answered` event: the server accepted an answer of the `onRequest` handler. */
export interface Answered {
  requestId: string;
  type: "resolve" | "reject";
  content: string;
  /** The server had this answer already (a resend after a reconnect). */
  replay: boolean;
}

/** Errors carry what the server said, when it said something. */
export interface SwitchboardError extends Error {
  /** The refusal's reason; for a REJECT, "timeout" or "endpoint_failed" when the platform rejected (else absent). */
  reason?: string;
  /** The refused frame's data, as the server echoed it. */
  data?: unknown;
  limit?: number;
  /** REJECT: a request's outcome was a rejection (`content`, `requestId` and `id` say which). */
  type?: "INVALID_MESSAGE" | "GENERAL_ERROR" | "REJECT";
  retryAfterMs?: number;
  /** The close code (a number) when the connection ended for good; a refused request's code (a string:
   * "unknown_endpoint", "too_many_requests", "timeout_too_long", "content_too_large", ...), or a refused
   * answer's ("request_closed", "not_found"). */
  code?: number | string;
  /** REJECT: the server's content. */
  content?: string;
  requestId?: string;
  clientMessageId?: string;
  id?: string;
  redirect?: string;
  /** The session id refused (`reason` "wrong_user"): the client logs in afresh without it. */
  sessionId?: string;
  cause?: unknown;
}

/** The events and what their listeners get. */
export interface SwitchboardEvents {
  state: State;
  /** `resumed`: the session presented was taken back (else `sessionId` is a new one). */
  connected: { appId: string; userId: string; sessionId: string | null; resumed: boolean };
  disconnected: { code: number; reason: string; willReconnect: boolean };
  reconnecting: { delayMs: number; attempt: number };
  message: Message;
  confirmation: Confirmation;
  accepted: Accepted;
  channelMessage: ChannelMessage;
  subscribed: Subscribed;
  unsubscribed: { channel: string };
  userConnected: { userId: string };
  userDisconnected: { userId: string };
  onlineUsers: { users: string[]; page: number; pages: number; count: number };
  synced: Record<string, never>;
  error: SwitchboardError;
  redirect: { from: string; to: string; count: number };
  fallback: { from: string; to: string };
  outcome: UnclaimedOutcome;
  answered: Answered;
}

export type EventName = keyof SwitchboardEvents;

/**
 * Milliseconds to wait before reconnect `attempt` (0: the first after a stable connection): random
 * between `minDelayMs` and a ceiling that starts at `firstMaxDelayMs` and doubles up to `maxDelayMs`.
 * A close asking to come back (1012, 4002) always waits like a first attempt.
 */
export function reconnectDelay(
  attempt: number,
  code: number,
  opts?: Pick<SwitchboardOptions, "minDelayMs" | "firstMaxDelayMs" | "maxDelayMs">,
  random?: () => number,
): number;

export class Switchboard {
  constructor(options: SwitchboardOptions);

  /** The options in force (defaults filled in; `url` follows redirects and fallbacks). */
  readonly options: Required<Omit<SwitchboardOptions, "fallbackUrls" | "WebSocket" | "random" | "debug">> &
    Pick<SwitchboardOptions, "fallbackUrls" | "WebSocket" | "random" | "debug">;
  readonly state: State;
  /** The session this client belongs to: issued at the first authentication, presented again at every
   * reconnect (outcomes of its requests are pushed to it wherever it reconnects); null before that and
   * after `closeSession()`. */
  readonly sessionId: string | null;

  /**
   * Listen to an event. In ACK mode a message is acknowledged once every `message` listener
   * returned (or its promise resolved); one that throws leaves it unacknowledged, and it comes again.
   * @returns a function that stops listening
   */
  on<E extends EventName>(name: E, listener: (payload: SwitchboardEvents[E]) => unknown): () => void;
  off<E extends EventName>(name: E, listener: (payload: SwitchboardEvents[E]) => unknown): void;

  /** Open the connection and keep it open until `close()`: resolves once authenticated, rejects if
   * the server refuses for good (1000, 1008). */
  connect(): Promise<void>;
  /** Close for good: no reconnect; unsettled sends and subscriptions are rejected. */
  close(): void;
  /** Drop the current socket and reconnect now. */
  reconnect(): void;
  /** End the session (CLOSE_SESSION) and then the client, for good; resolves with how many outcomes that
   * waited for the session were discarded. */
  closeSession(): Promise<number>;

  /** One user. While disconnected it waits (at most `maxQueued` sends). */
  send(to: string, content: string, opts?: SendOptions): Promise<SendResult>;
  /** Several users (GROUP_MESSAGE); answers as `send`. */
  sendGroup(to: string[], content: string, opts?: GroupSendOptions): Promise<SendResult>;

  /**
   * Ask an endpoint of the app's server and wait for the outcome, however long it takes: resent with the
   * same clientMessageId after every reconnect until stored, then the outcome comes pushed or fetched.
   * Resolves on RESOLVE; rejects on REJECT (`type: "REJECT"`, `content`, `reason`?, `requestId`) and at
   * once on a refusal (`type: "INVALID_MESSAGE"`, `code`).
   */
  request(endpoint: string, content: string, opts?: RequestOptions): Promise<Outcome>;

  /**
   * Answer the requests the app's server makes of this user, each requestId once; the answer is resent
   * after every reconnect until accepted (then, in ACK mode, the SERVER_REQUEST is acknowledged). Without
   * a handler a SERVER_REQUEST is not acknowledged, and an `error` says so.
   * @returns a function that removes the handler
   */
  onRequest(handler: RequestHandler): () => void;

  subscribe(channel: string, opts?: SubscribeOptions): Promise<Subscribed>;
  unsubscribe(channel: string): Promise<void>;
  /** The last offset seen on each channel (pass back as `since`). */
  offsets(): Record<string, number>;

  /** Ask for missed messages now (it happens by itself after every authentication). */
  fetchMissing(count?: number): void;
  /** Send a PING (it happens by itself while the connection is idle). */
  ping(): void;
  /** The app's master user only: close a user's connections everywhere. */
  disconnectUser(userId: string): void;
}

export default Switchboard;
