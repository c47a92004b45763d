/**
 * Every error and refusal code the plugin makes itself, in one table.
 *
 * A code is what scripts and other plugins match (never the text): it travels as
 * `RewindfsCallError.code` (a socket call failed) or as `refusal.code` in a service
 * result `{ok: false, refusal: {code, message}}`.  Codes the daemon sends are passed on
 * unchanged and are not listed here (docs/errors.md lists those).
 *
 * The modules make codes only through {@link callError} and {@link refusal}, which
 * throw on a code missing from {@link CODES}, and test/errors.test.js checks every code
 * literal in lib/ and index.js against the table, so a typo cannot reach a script.
 *
 * The table literal is strict JSON (double quotes, no trailing comma, no comment
 * inside): scripts/gen_errors_doc.py reads it from this file to write docs/errors.md.
 * @module rewindfs-dsh/errors
 */

/** code -> one line saying when the plugin uses it. */
export const CODES = Object.freeze({
  "aborted": "the caller's AbortSignal cancelled the call; nothing more is read",
  "bad-response": "the daemon sent something that is not protocol v1 (not JSON, wrong id, a reply line over 1 MiB)",
  "bad-session": "`/rewind N --into ID`: ID is not a usable session id (letters, digits, '.', '_', '-')",
  "bad-turn": "the turn argument is not a turn number (turns count from 1)",
  "busy": "the agent is running; /rewind and /redo wait for the turn to finish",
  "connection-lost": "the daemon closed the connection, or the connection failed, before replying",
  "daemon-unreachable": "the socket exists but nobody answers on it (a dead daemon)",
  "error": "a failure that carried no code of its own (a daemon error without one, an exception in the harness)",
  "fork-failed": "the harness could not fork the conversation at that turn; the files were not rewound",
  "fork-not-fresh": "`/rewind N --into ID`: ID is a fork of this session, but not a fresh one at or before turn N's boundary (a turn ran in it, or it holds turn N)",
  "files-here": "`/rewind own`: the workspace holds this session's own files already (its newest turn is in the state it is in)",
  "job-unstoppable": "a background job or process started by a turn the rewind removes is still running (it survived SIGKILL, refused the signal, or cannot be told apart from work of a kept turn); nothing was rewound",
  "no-own-files": "`/rewind own`: the session ran no turn of its own in this workspace (so it has no files of its own), or no point holds them any more (gc dropped it)",
  "not-mounted": "no daemon serves the session's directory (no control socket found)",
  "relative-point": "a relative point (-1, ~1, HEAD~1, prev, last, ...): name an absolute turn number",
  "rewound-elsewhere": "`/redo` in the session a rewind left: the rewind landed in a fork of it; /redo there (or /rewind own here)",
  "session-exists": "`/rewind N --into ID`: a session ID already exists",
  "timeout": "no reply within the call's timeout (the daemon may still apply the request)",
  "unknown-point": "the session has no such turn, or that turn has no point (it ran unprotected)",
  "unsafe-socket": "the socket is not a socket owned by us or root (a squatted runtime directory); nothing was sent",
  "usage": "the command's words do not parse (see the usage line)"
});

/** An error with a protocol `code` (kebab-case); callers match the code, not the text. */
export class RewindfsCallError extends Error {
  /**
   * @param {string} code - the daemon's code, or one of {@link CODES}.
   * @param {string} message - human text.
   * @param {object} [data] - the protocol error's structured `data` (e.g. `redo-stale`'s changes).
   */
  constructor(code, message, data) {
    super(message);
    this.name = 'RewindfsCallError';
    this.code = code;
    if (data !== undefined && data !== null) this.data = data;
  }
}

/**
 * `code` itself, after checking it is in {@link CODES}.
 * @param {string} code - a code the plugin makes.
 * @returns {string} the same code.
 * @throws {TypeError} for a code missing from the table (a bug in the plugin).
 */
export function checkCode(code) {
  if (!Object.hasOwn(CODES, code)) throw new TypeError(`rewindfs-dsh: error code ${JSON.stringify(code)} is not in lib/errors.js`);
  return code;
}

/** A {@link RewindfsCallError} with one of our codes. */
export function callError(code, message) {
  return new RewindfsCallError(checkCode(code), message);
}

/** A refusal `{code, message}` with one of our codes. */
export function refusal(code, message) {
  return { code: checkCode(code), message };
}

/**
 * The code a caught error is reported with: its own (the daemon's, or ours), else
 * `error`.  Not checked against the table: daemon codes pass through.
 * @param {unknown} error - what was caught.
 * @returns {string} the code.
 */
export function codeOf(error) {
  const code = error?.code;
  return code === undefined || code === null ? 'error' : String(code);
}
