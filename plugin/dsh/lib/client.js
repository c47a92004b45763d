/**
 * Control-socket client (protocol v1, newline-delimited JSON).
 *
 * One connection per call: a call connects, sends one request, relays progress
 * events to `onEvent`, and resolves with the final reply's result -- or rejects
 * with a {@link RewindfsCallError} whose `code` is the daemon's error code or one
 * of ours (`daemon-unreachable`, `connection-lost`, `timeout`, `bad-response`).
 * A call never retries: a rewind is not idempotent from the caller's side.
 * @module rewindfs-dsh/client
 */
import { createConnection } from 'node:net';

const MAX_LINE = 1 << 20;

/** An error with a protocol `code` (kebab-case); callers match the code, not the text. */
export class RewindfsCallError extends Error {
  /**
   * @param {string} code - protocol or client error code.
   * @param {string} message - human text.
   */
  constructor(code, message) {
    super(message);
    this.name = 'RewindfsCallError';
    this.code = code;
  }
}

let nextId = 1;

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
  return new Promise((resolvePromise, rejectPromise) => {
    let buffer = '';
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
    const timer = setTimeout(() => finish(new RewindfsCallError('timeout', `no reply to ${method} within ${timeoutMs} ms`)), timeoutMs);
    const onAbort = () => finish(new RewindfsCallError('aborted', `${method} was cancelled`));
    signal?.addEventListener('abort', onAbort, { once: true });
    conn.setEncoding('utf8');
    conn.on('connect', () => conn.write(line));
    conn.on('error', (error) => {
      const unreachable = ['ENOENT', 'ECONNREFUSED', 'EACCES', 'ENOTSOCK'].includes(error.code);
      finish(new RewindfsCallError(unreachable ? 'daemon-unreachable' : 'connection-lost',
        unreachable ? `no rewindfs daemon answers on ${socket}: ${error.code}` : `connection to the rewindfs daemon failed: ${error.message}`));
    });
    conn.on('close', () => finish(new RewindfsCallError('connection-lost', 'the rewindfs daemon closed the connection before replying')));
    conn.on('data', (chunk) => {
      buffer += chunk;
      if (buffer.length > MAX_LINE && !buffer.includes('\n')) return finish(new RewindfsCallError('bad-response', 'reply line over 1 MiB'));
      let nl;
      while ((nl = buffer.indexOf('\n')) >= 0) {
        const text = buffer.slice(0, nl);
        buffer = buffer.slice(nl + 1);
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
    return { error: new RewindfsCallError('bad-response', `not JSON: ${text.slice(0, 80)}`) };
  }
  if (msg === null || typeof msg !== 'object' || msg.v !== 1) return { error: new RewindfsCallError('bad-response', `not a v1 message: ${text.slice(0, 80)}`) };
  if (msg.id !== undefined && msg.id !== null && msg.id !== id) return { error: new RewindfsCallError('bad-response', `reply for id ${msg.id}, expected ${id}`) };
  if (msg.event !== undefined) return { event: msg.event };
  if (msg.ok === true) return { result: msg.result && typeof msg.result === 'object' ? msg.result : {} };
  if (msg.ok === false && msg.error && typeof msg.error === 'object') {
    return { error: new RewindfsCallError(String(msg.error.code ?? 'error'), String(msg.error.message ?? 'error')) };
  }
  return { error: new RewindfsCallError('bad-response', `neither result nor error: ${text.slice(0, 80)}`) };
}

function clean(params) {
  return Object.fromEntries(Object.entries(params ?? {}).filter(([, v]) => v !== undefined && v !== null));
}
