/**
 * Control-socket client (protocol v1, newline-delimited JSON).
 *
 * One connection per call: a call connects, sends one request, relays progress
 * events to `onEvent`, and resolves with the final reply's result -- or rejects
 * with a {@link RewindfsCallError} whose `code` is the daemon's error code or one
 * of ours (`daemon-unreachable`, `connection-lost`, `timeout`, `bad-response`).
 * A call never retries: a rewind is not idempotent from the caller's side.
 *
 * Before connecting, the socket file must be owned by us or by root (`lstat`: a
 * symlink is refused too), else the call rejects with `unsafe-socket` and sends
 * nothing: without $XDG_RUNTIME_DIR the runtime directory is under /tmp, where
 * another user may have squatted it and bound a fake daemon.
 *
 * Replies are split into lines by {@link LineSplitter}, which searches each received
 * byte for a newline once (linear in the reply's size) and holds at most one
 * partial line of at most 1 MiB; large `show` contents arrive as `show.chunk` events.
 * @module rewindfs-dsh/client
 */
import { lstatSync } from 'node:fs';
import { createConnection } from 'node:net';
import { callError, codeOf, RewindfsCallError } from './errors.js';

const MAX_LINE = 1 << 20;

let nextId = 1;

/**
 * Newline framing over Buffers, linear time: each byte is searched once (`searched`
 * counts them), a partial line is kept as a list of chunks and joined once.
 */
export class LineSplitter {
  /** @param {number} limit - the longest line accepted (bytes, without the newline). */
  constructor(limit = MAX_LINE) {
    this.limit = limit;
    this.parts = [];
    this.pending = 0;
    this.searched = 0;
  }

  /**
   * Feed bytes; returns the complete lines (decoded UTF-8) they finish.
   * @param {Buffer} chunk - bytes as received.
   * @returns {string[]} complete lines, in order.
   * @throws {RewindfsCallError} `bad-response` once a line grows past the limit.
   */
  push(chunk) {
    const lines = [];
    let start = 0;
    for (;;) {
      const nl = chunk.indexOf(10, start);
      this.searched += (nl < 0 ? chunk.length : nl + 1) - start;
      if (nl < 0) break;
      const piece = chunk.subarray(start, nl);
      if (this.pending + piece.length > this.limit) throw callError('bad-response', 'reply line over 1 MiB');
      this.parts.push(piece);
      lines.push(Buffer.concat(this.parts).toString('utf8'));
      this.parts = [];
      this.pending = 0;
      start = nl + 1;
    }
    if (start < chunk.length) {
      const rest = chunk.subarray(start);
      this.pending += rest.length;
      if (this.pending > this.limit) throw callError('bad-response', 'reply line over 1 MiB');
      this.parts.push(rest);
    }
    return lines;
  }
}

/**
 * Why the socket at `path` must not be used, or undefined if it may (owned by us or
 * root, a socket, not a symlink); a missing path is left to connect() to report.
 * @param {string} path - socket path.
 * @returns {string|undefined} the reason to refuse.
 */
export function socketOwnerProblem(path) {
  let st;
  try {
    st = lstatSync(path);
  } catch {
    return undefined;
  }
  if (!st.isSocket()) return 'it is not a socket';
  if (st.uid !== process.getuid() && st.uid !== 0) return `it is owned by uid ${st.uid}, not by us or root`;
  return undefined;
}

/**
 * Call one method on the daemon listening at `socket`.
 * @param {string} socket - socket path.
 * @param {string} method - protocol method (`turn.begin`, `points`, `rewind`, ...).
 * @param {object} params - params; undefined values are left out.
 * @param {{timeoutMs?: number, onEvent?: (event: unknown) => void, signal?: AbortSignal}} options
 * @returns {Promise<object>} the result object.
 */
export function call(socket, method, params = {}, options = {}) {
  const { timeoutMs = 60_000, onEvent, signal } = options;
  const id = nextId++;
  const line = `${JSON.stringify({ v: 1, id, method, params: clean(params) })}\n`;
  const problem = socketOwnerProblem(socket);
  if (problem) return Promise.reject(callError('unsafe-socket', `refusing the control socket ${socket}: ${problem}; nothing was sent`));
  return new Promise((resolvePromise, rejectPromise) => {
    const splitter = new LineSplitter();
    let settled = false;
    const conn = createConnection({ path: socket });
    const finish = (error, value) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      conn.destroy();
      if (error) rejectPromise(error);
      else resolvePromise(value);
    };
    const timer = setTimeout(() => finish(callError('timeout', `no reply to ${method} within ${timeoutMs} ms`)), timeoutMs);
    const onAbort = () => finish(callError('aborted', `${method} was cancelled`));
    signal?.addEventListener('abort', onAbort, { once: true });
    conn.on('connect', () => conn.write(line));
    conn.on('error', (error) => {
      const unreachable = ['ENOENT', 'ECONNREFUSED', 'EACCES', 'ENOTSOCK'].includes(error.code);
      const failure = unreachable ? callError('daemon-unreachable', `no rewindfs daemon answers on ${socket}: ${error.code}`)
        : callError('connection-lost', `connection to the rewindfs daemon failed: ${error.message}`);
      failure.socketError = error.code; // ECONNREFUSED: a socket file nobody listens on (its daemon died)
      finish(failure);
    });
    conn.on('close', () => finish(callError('connection-lost', 'the rewindfs daemon closed the connection before replying')));
    conn.on('data', (chunk) => {
      let lines;
      try {
        lines = splitter.push(chunk);
      } catch (error) {
        return finish(error);
      }
      for (const text of lines) {
        if (settled) return undefined;
        const outcome = parseLine(text, id);
        if (outcome.error) return finish(outcome.error);
        if (outcome.event !== undefined) {
          try { onEvent?.(outcome.event); } catch { /* a progress observer never breaks the call */ }
          continue;
        }
        return finish(undefined, outcome.result);
      }
    });
  });
}

/** Decode one reply line into {event} | {result} | {error}. */
function parseLine(text, id) {
  let msg;
  try {
    msg = JSON.parse(text);
  } catch {
    return { error: callError('bad-response', `not JSON: ${text.slice(0, 80)}`) };
  }
  if (msg === null || typeof msg !== 'object' || msg.v !== 1) return { error: callError('bad-response', `not a v1 message: ${text.slice(0, 80)}`) };
  if (msg.id !== undefined && msg.id !== null && msg.id !== id) return { error: callError('bad-response', `reply for id ${msg.id}, expected ${id}`) };
  if (msg.event !== undefined) return { event: msg.event };
  if (msg.ok === true) return { result: msg.result && typeof msg.result === 'object' ? msg.result : {} };
  if (msg.ok === false && msg.error && typeof msg.error === 'object') {
    return { error: new RewindfsCallError(codeOf(msg.error), String(msg.error.message ?? 'error'), msg.error.data) };
  }
  return { error: callError('bad-response', `neither result nor error: ${text.slice(0, 80)}`) };
}

function clean(params) {
  return Object.fromEntries(Object.entries(params ?? {}).filter(([, v]) => v !== undefined && v !== null));
}
