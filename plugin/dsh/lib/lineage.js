/**
 * Which sessions a rewind may land in, and how a rewound-out-of session is marked.
 *
 * The web UI forks the conversation itself (`ctx.sessions.fork`: the deployment's
 * own fork composes the child's preset and attaches it to the workspace) and then
 * asks `/rewind <turn> --into <child>`.  That child is accepted only when it is a
 * *fresh fork of this session at or before turn <turn>'s boundary*: its header names
 * this session as parent, its seed holds no part of turn <turn> or later, and nothing
 * ran in it since (no turn after the seed).  Anything else is refused with the reason,
 * so `--into` can never pour files into an unrelated conversation.
 *
 * The session rewound out of keeps its history and gains a title prefix
 * ({@link REWOUND_PREFIX}); `/redo` in the child takes it off again.
 * @module rewindfs-dsh/lineage
 */

/** Title prefix of a session a rewind left (the files now match one of its forks). */
export const REWOUND_PREFIX = '↩ ';

/**
 * Whether `child` (header + events) is a fresh fork of `parentId` at or before the
 * start of `turn`.
 * @param {{header?: object, events?: readonly {type: string, data?: any}[]}} child - the existing session.
 * @param {string} parentId - the session the rewind is typed in.
 * @param {number} turn - the turn whose start the files go back to.
 * @returns {{ok: true} | {ok: false, reason: string}} verdict with the reason for a refusal.
 */
export function checkFreshFork(child, parentId, turn) {
  const header = child.header ?? {};
  const events = child.events ?? [];
  if (header.parentSession !== parentId) {
    return { ok: false, reason: `it is not a fork of this session (its parent is ${header.parentSession ?? 'none'})` };
  }
  const seedLength = header.seedLength;
  if (!Number.isInteger(seedLength) || seedLength < 0 || seedLength > events.length) {
    return { ok: false, reason: 'its header carries no usable seedLength (not made by a fork)' };
  }
  const late = events.slice(0, seedLength).find((e) => e.type === 'turn/start' && e.data?.turn >= turn);
  if (late !== undefined) {
    return { ok: false, reason: `it was forked after the start of turn ${turn} (its history holds turn ${late.data.turn})` };
  }
  const ran = events.slice(seedLength).find((e) => e.type === 'turn/start');
  if (ran !== undefined) {
    return { ok: false, reason: `it is not fresh: turn ${ran.data?.turn ?? '?'} already ran in it` };
  }
  return { ok: true };
}

/** `title` with the rewound prefix (once). */
export function markedTitle(title) {
  const text = title ?? '';
  return text.startsWith(REWOUND_PREFIX) ? text : `${REWOUND_PREFIX}${text}`;
}

/** `title` without the rewound prefix. */
export function unmarkedTitle(title) {
  const text = title ?? '';
  return text.startsWith(REWOUND_PREFIX) ? text.slice(REWOUND_PREFIX.length) : text;
}

// -- where a session's files are, from the workspace's state tree ---------------------
// The daemon's `history` nodes (store/_tree.py): every epoch hangs under the state it
// started from (`parent`, a turn or idle epoch, null = the root); the newest is
// `current`.  A session's files are the state its newest turn of its own left; they
// were rewound away when that state is no longer below the state the workspace is in.

/**
 * Where session `sessionId`'s own files are: `{current: true}` while the workspace
 * holds them (its newest own turn is at or below the state now: later turns of other
 * sessions built on them), else `{left}`: the newest rewind or redo that started from
 * them — point `e<left>` is that tree (a person's edits after the turn included).
 * `{none}` when there is nothing of its own: no turn of its own ran here.
 * @param {readonly {epoch: number, kind: string, session?: string|null, turn?: number|null, parent?: number|null, target?: number|null, current?: boolean}[]} nodes
 * @param {string} sessionId
 * @returns {{none: true} | {current: true, turn: number} | {left: number, turn: number, from?: string}}
 */
export function ownFiles(nodes, sessionId) {
  const byId = new Map(nodes.map((n) => [n.epoch, n]));
  const own = nodes.filter((n) => n.kind === 'turn' && n.session === sessionId);
  if (own.length === 0) return { none: true };
  const last = own[own.length - 1];
  const now = stateNow(nodes, byId);
  if (below(byId, now, last.epoch)) return { current: true, turn: last.turn };
  const leaving = nodes.filter((n) => (n.kind === 'rewind' || n.kind === 'redo') && n.epoch > last.epoch
    && below(byId, n.parent, last.epoch));
  if (leaving.length === 0) return { none: true };
  const from = turnAt(byId, now)?.session ?? undefined;
  return { left: leaving[leaving.length - 1].epoch, turn: last.turn, ...(from ? { from } : {}) };
}

/**
 * The session whose files a redo of rewind `undone` brings back when that rewind went
 * to the point another rewind left (`/rewind own`: its target is a rewind or redo):
 * the session that one had landed in.  Undefined for a rewind to a turn's start (its
 * session is the fork's parent, as before).
 */
export function filesOwnerUndoneTo(nodes, undone) {
  const rewind = nodes.find((n) => n.epoch === undone);
  const target = rewind === undefined ? undefined : nodes.find((n) => n.epoch === rewind.target);
  if (target === undefined || (target.kind !== 'rewind' && target.kind !== 'redo')) return undefined;
  return target.session ?? undefined;
}

/** Whether session `sessionId` ran a turn of its own here (has files of its own). */
export function ranOwnTurn(nodes, sessionId) {
  return nodes.some((n) => n.kind === 'turn' && n.session === sessionId);
}

/** The state the workspace is in: the current epoch's own (a turn, idle), or the state a
 * rewind or redo went to (its target's parent); null = the root. */
function stateNow(nodes, byId) {
  const cur = nodes.find((n) => n.current) ?? nodes[nodes.length - 1];
  if (cur === undefined) return null;
  if (cur.kind === 'turn' || cur.kind === 'idle') return cur.epoch;
  return byId.get(cur.target)?.parent ?? null;
}

/** State `id` is `ancestor` or below it. */
function below(byId, id, ancestor) {
  for (let n = byId.get(id); n !== undefined; n = byId.get(n.parent)) {
    if (n.epoch === ancestor) return true;
  }
  return false;
}

/** The nearest turn at or above state `id`. */
function turnAt(byId, id) {
  for (let n = byId.get(id); n !== undefined; n = byId.get(n.parent)) {
    if (n.kind === 'turn') return n;
  }
  return undefined;
}
