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
 * ({@link REWOUND_PREFIX}): its own files are away.  Where a session's own files are
 * is the daemon's to say (`own.state`, from the workspace's state tree); the service
 * moves the marks after each rewind and redo by its answer.
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

/**
 * `title` with the rewound prefix (once).  A session without a title stays without:
 * the harness trims a title's end, so `↩ ` alone would be stored as `↩`, which no
 * unmarking recognises — the mark would stay for good (the header still says where
 * the files are).
 */
export function markedTitle(title) {
  const text = title ?? '';
  if (text.trim() === '') return text;
  return text.startsWith(REWOUND_PREFIX) ? text : `${REWOUND_PREFIX}${text}`;
}

/** `title` without the rewound prefix. */
export function unmarkedTitle(title) {
  const text = title ?? '';
  return text.startsWith(REWOUND_PREFIX) ? text.slice(REWOUND_PREFIX.length) : text;
}
