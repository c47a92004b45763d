/**
 * `/rewind` and `/redo`: parsing the typed input and rendering the replies.
 *
 *   /rewind                              list this session's points
 *   /rewind <turn> [--into <session>]    fork the conversation before <turn>, rewind the files
 *   /rewind status                       daemon, workspace, open turn, unprotected writes
 *   /rewind own                          put this session's own files back (after a rewind took them away)
 *   /redo                                undo the newest rewind that landed in this session
 *
 * No model turn is involved; every reply starts with "rewindfs:" and a refusal
 * states its reason (docs/dsh.md lists the texts).
 * @module rewindfs-dsh/commands
 */
import { refusal } from './errors.js';
import { shortCommand } from './jobs.js';

const RELATIVE = /^(?:[-+~^].*|head.*|prev(?:ious)?|last|latest|back)$/i;

/**
 * Parse the turn argument of `/rewind <turn>`: an absolute turn number (`3` or `t3`), or a point
 * id "e<epoch>" as `/rewind` lists and the daemon accepts.
 * @param {string} text - the argument as typed.
 * @returns {{turn: number} | {point: string} | {refusal: {code: string, message: string}}} parsed turn.
 */
export function parseTurn(text) {
  // "t3" is the CLI's spelling of turn 3 (`rewindfs rewind t3`), so a person who uses both types it here too
  if (/^[tT][0-9]+$/.test(text)) text = text.slice(1);
  if (/^[0-9]+$/.test(text) && Number(text) >= 1 && Number.isSafeInteger(Number(text))) return { turn: Number(text) };
  if (/^e[0-9]+$/.test(text) && Number.isSafeInteger(Number(text.slice(1)))) return { point: text };
  if (RELATIVE.test(text)) {
    return { refusal: refusal('relative-point', `"${text}" is a relative point; name an absolute turn number (see /rewind)`) };
  }
  return { refusal: refusal('bad-turn', `"${text}" is not a turn number (turns count from 1; see /rewind)`) };
}

export const USAGE = 'usage: /rewind [<turn> [--into <session>] | status | own]';

/**
 * Parse `/rewind`'s raw input.
 * @param {string} raw - everything after "/rewind".
 * @returns {{op: 'list'} | {op: 'status'} | {op: 'own'} | {op: 'rewind', turn: number | string, into?: string} | {refusal: {code: string, message: string}}}
 *   (`turn` is a number, or a point id "e<epoch>" verbatim)
 */
export function parseRewind(raw) {
  const words = raw.trim().split(/\s+/).filter((w) => w !== '');
  if (words.length === 0) return { op: 'list' };
  if (words[0] === 'status' || words[0] === 'own') {
    return words.length === 1 ? { op: words[0] } : { refusal: refusal('usage', `"/rewind ${words[0]}" takes no arguments; ${USAGE}`) };
  }
  const parsed = parseTurn(words[0]);
  if (parsed.refusal) return parsed;
  const turn = parsed.turn ?? parsed.point;
  const rest = words.slice(1);
  if (rest.length === 0) return { op: 'rewind', turn };
  if (rest[0] === '--into' && rest.length === 2) return { op: 'rewind', turn, into: rest[1] };
  return { refusal: refusal('usage', `unexpected "${rest.join(' ')}"; ${USAGE}`) };
}

const pad = (n) => String(n).padStart(2, '0');

/** Local wall-clock time of a point, "YYYY-MM-DD HH:MM:SS". */
export function formatTime(ns) {
  const d = new Date(Number(BigInt(Math.trunc(Number(ns ?? 0))) / 1_000_000n));
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

const plural = (n, word) => `${n} ${word}${n === 1 ? '' : 's'}`;

/** The reply to `/rewind` (list). */
export function renderPoints({ session, points }) {
  if (points.length === 0) return `rewindfs: no points yet for session ${session} (a point is taken at the start of every protected turn)`;
  const lines = [`rewindfs: points of session ${session} (rewind with /rewind <turn>):`];
  for (const p of points) {
    const inherited = p.session && p.session !== session ? `  (from ${p.session})` : '';
    lines.push(`  turn ${p.turn}  ${formatTime(p.started_ns)}  ${plural(p.paths ?? 0, 'file')} changed  ${p.label ?? ''}${inherited}`.trimEnd());
  }
  return lines.join('\n');
}

/** The reply to `/rewind <turn>`. */
export function renderRewind(v) {
  const lines = [
    ...renderLearned(v.learned),
    `rewindfs: rewound the files to the start of turn ${v.turn}${labelPart(v.target_point)} — e${v.target}: ${counts(v)}.`,
    `rewindfs: conversation forked before turn ${v.turn}: continue in session ${v.child} (session ${v.parent} is unchanged).`,
    `rewindfs: open session ${v.child} to go on there (web UI: the session list, under this workspace); this session's title now starts with "↩ ".`,
    `rewindfs: /redo in session ${v.child} undoes this rewind.`,
  ];
  return lines.concat(renderForeign(v.foreign ?? [], `/redo in session ${v.child}`),
    renderStopped(v.stopped ?? []), renderFailures(v)).join('\n');
}

/**
 * What a rewind undid beyond the session's own turns — the daemon's `foreign` paths, a
 * person's edits between turns or another session's turns since the point — one line
 * per source, then how to get them back.  A person must hear it: a line she wrote
 * herself is gone from the tree, and only a redo brings it back.
 * @param {{path: string, kind: string, session?: string|null, turn?: number|null}[]} foreign
 * @param {string} undo - how to undo the rewind (`/redo in session c`, `↻ undo rewind`).
 */
export function renderForeign(foreign, undo) {
  if (foreign.length === 0) return [];
  const bySource = new Map();
  for (const f of foreign) {
    const source = sourceWords(f);
    bySource.set(source, [...(bySource.get(source) ?? []), f.path]);
  }
  const lines = [...bySource].map(([source, paths]) => `rewindfs: it also undid ${source}: ${someOf(paths, 10)}`);
  return [...lines, `rewindfs: ${undo} brings them back`];
}

/**
 * The header notice of the session a rewind landed in, where its reply is not shown:
 * undefined when there is nothing a person must know (every path restored, only the
 * session's own turns undone, no job stopped), else `{short, full}` (text, tooltip).
 * @param {{foreign?: object[], failed?: object[], stopped?: object[]}} v - the rewind result.
 */
export function landedNotice(v) {
  const foreign = v.foreign ?? [];
  const failed = v.failed ?? [];
  const stopped = v.stopped ?? [];
  const parts = [];
  if (foreign.length > 0) parts.push(`the rewind also undid ${plural(foreign.length, 'change')} made outside this session's turns: ${someOf(foreign.map((f) => f.path), 2)}`);
  if (failed.length > 0) parts.push(`${plural(failed.length, 'path')} NOT restored: ${someOf(failed.map((f) => f.path), 2)}`);
  if (stopped.length > 0) parts.push(`${plural(stopped.length, 'background job')} of the removed turns stopped`);
  if (parts.length === 0) return undefined;
  const full = [...renderForeign(foreign, '↻ undo rewind'), ...renderStopped(stopped), ...renderFailures(v)];
  return { short: `⚠ ${parts.join('; ')}`, full: full.join('\n') };
}

/**
 * An epoch that changed the tree, as a person says it: "edits between turns", "turn 3
 * of session s2", "a rewind", "a redo".
 * @param {{kind: string, turn?: number|null, session?: string|null}} e
 */
function sourceWords(e) {
  if (e.kind === 'idle') return 'edits between turns';
  if (e.kind === 'turn') return `turn ${e.turn ?? '?'} of session ${e.session ?? '?'}`;
  return `a ${e.kind}`;
}

/** "a, b and 3 more": the first `max` of `items`. */
function someOf(items, max) {
  const shown = items.slice(0, max).join(', ');
  return items.length > max ? `${shown} and ${items.length - max} more` : shown;
}

/**
 * The line saying the point came from a remote (`remote.learn`'s result), or none.
 * @param {{remote: string, remote_workspace?: string, epochs?: number, head_epoch?: number, epoch?: number} | undefined} learned
 */
export function renderLearned(learned) {
  if (learned === undefined || learned === null) return [];
  return [`rewindfs: learned the history from remote ${learned.remote} (workspace ${learned.remote_workspace ?? '?'}, ${plural(learned.epochs ?? 0, 'epoch')}); no file changed by that — this directory as it was is point e${learned.epoch ?? '?'}, the pushed tree e${learned.head_epoch ?? '?'}.`];
}

/**
 * What the rewind stopped before restoring: "stopped 1 background job started in
 * turn 2: sleep 4; echo … (job bash-1)", one line per job when there are several.
 * @param {{turn?: number, command: string, job?: string, pgid?: number}[]} stopped
 */
export function renderStopped(stopped) {
  if (stopped.length === 0) return [];
  const turns = [...new Set(stopped.map((s) => s.turn ?? '?'))].sort((a, b) => a - b);
  // `/rewind own` stops another session's work: its entries name that session
  const sessions = [...new Set(stopped.map((s) => s.session))];
  const of = sessions.length === 1 && sessions[0] !== undefined ? ` of session ${sessions[0]}` : '';
  const head = `rewindfs: stopped ${plural(stopped.length, 'background job')} started in ${plural(turns.length, 'turn').replace(/^\d+ /, '')} ${turns.join(', ')}${of}`;
  const lines = stopped.length === 1 ? [`${head}: ${describeJob(stopped[0])}`]
    : [`${head}:`, ...stopped.map((s) => `  turn ${s.turn ?? '?'}${of === '' && s.session !== undefined ? ` of session ${s.session}` : ''}: ${describeJob(s)}`)];
  lines.push(`rewindfs: /redo restores files only; it cannot restart ${stopped.length === 1 ? 'that job' : 'those jobs'}.`);
  return lines;
}

function describeJob(s) {
  const command = shortCommand(String(s.command ?? '').replace(/^(?:\/\S*\/)?bash -c /, ''));
  return `${command} (${s.job ? `job ${s.job}` : `process group ${s.pgid}`})`;
}

/** The reply to `/rewind own`. */
export function renderOwn(v) {
  const lines = [
    `rewindfs: this session's own files are back (as its turn ${v.turn} left them, point e${v.left}): ${counts(v)}.`,
    `rewindfs: /redo here undoes this${v.from === undefined ? '' : `, putting session ${v.from}'s files back`}; no conversation changed.`,
  ];
  return lines.concat(renderForeign(v.foreign ?? [], '/redo here'), renderStopped(v.stopped ?? []), renderFailures(v)).join('\n');
}

/** The reply to `/redo`. */
export function renderRedo(v) {
  const undid = v.undid == null ? `point e${v.target}` : `undid rewind e${v.undid}, back to the state it found`;
  const lines = [`rewindfs: redo done in session ${v.session}: ${undid}: ${counts(v)}.`];
  const gone = v.notRestarted?.stopped ?? [];
  if (gone.length > 0) {
    lines.push(`rewindfs: not restarted: ${plural(gone.length, 'background job')} the rewind to turn ${v.notRestarted.turn} stopped (${gone.map(describeJob).join('; ')}); /redo restores files only.`);
  }
  return lines.concat(renderFailures(v)).join('\n');
}

/** " — make it per-tenant" from the target point's label (its first line), or "". */
function labelPart(point) {
  const label = String(point?.label ?? '').split('\n')[0].trim();
  if (label === '') return '';
  return ` — ${label.length > 60 ? `${label.slice(0, 59)}…` : label}`;
}

/** "3 paths restored (1 re-created, 2 rewritten), 4 deleted" from a rewind result. */
function counts(v) {
  const created = v.created ?? 0;
  const written = v.written ?? 0;
  return `${plural(created + written, 'path')} restored (${created} re-created, ${written} rewritten), ${v.deleted ?? 0} deleted`;
}

function renderFailures(v) {
  const lines = [];
  for (const f of v.failed ?? []) lines.push(`rewindfs: NOT restored: ${f.path}: ${f.message ?? f.code}`);
  if ((v.failed ?? []).length > 0) lines.push(`rewindfs: partial: ${plural(v.failed.length, 'path')} could not be restored (the rest landed)`);
  return lines;
}

/** The reply to `/rewind status`. */
export function renderStatus(v) {
  const open = v.open_turn ? `turn ${v.open_turn.turn ?? '?'} of session ${v.open_turn.session ?? '?'} is open` : 'no turn open';
  const lines = [
    `rewindfs: protecting ${v.workspace} (daemon pid ${v.pid ?? '?'}, store ${v.store ?? '?'})`,
    `rewindfs: epoch ${v.epoch ?? '?'}; ${open}; socket ${v.socket}`,
  ];
  if (v.remote) {
    const refused = (v.pushRefused ?? []).length > 0 ? `; NOT pushed: the daemon refused (${v.pushRefused.join(', ')})` : '';
    lines.push(`rewindfs: remote ${v.remote}: pushed after each turn, points made elsewhere are learned on /rewind${refused}`);
  }
  if ((v.unprotected ?? []).length > 0) lines.push(`rewindfs: turns that ran unprotected in this session: ${v.unprotected.join(', ')}`);
  if ((v.outside ?? []).length > 0) lines.push(`rewindfs: writes outside the workspace (not protected): ${v.outside.join(', ')}`);
  for (const w of v.late_writes ?? []) lines.push(renderLateWrite(w));
  return lines.join('\n');
}

/** One late write (the daemon's `status.late_writes`): a removed turn's process wrote after the rewind. */
export function renderLateWrite(w) {
  const child = w.by !== undefined && w.by !== w.pid ? `, child of pid ${w.by}` : '';
  return `rewindfs: late write: pid ${w.pid} (${w.comm}${child}) changed ${w.path} after a rewind removed turn ${w.turn ?? '?'} of session ${w.session ?? '?'}, which started it`;
}

/** A refusal as command text (a stale redo also names what changed since the rewind). */
export function renderRefusal(refusal, verb) {
  const line = `rewindfs: ${verb} refused (${refusal.code}): ${refusal.message}`;
  if (refusal.code === 'redo-stale' && refusal.data) return [line, ...renderStale(refusal.data)].join('\n');
  return line;
}

/**
 * The lines of a `redo-stale` refusal from its data `{rewind, changes, paths}`:
 * which turns (and other changes) ran after the rewind, and what a redo would overwrite.
 * @param {{rewind?: number, changes?: object[], paths?: number}} data
 */
export function renderStale(data) {
  const changes = data.changes ?? [];
  const turns = changes.filter((c) => c.kind === 'turn');
  const others = changes.filter((c) => c.kind !== 'turn');
  const lines = [];
  for (const t of turns) {
    lines.push(`rewindfs: since the rewind${data.rewind === undefined ? '' : ` (e${data.rewind})`}, turn ${t.turn ?? '?'} ran in session ${t.session ?? '?'}${t.label ? `: ${t.label}` : ''} (${plural(t.paths ?? 0, 'path')} changed)`);
  }
  for (const o of others) {
    lines.push(`rewindfs: since the rewind: ${sourceWords(o)} (e${o.epoch}, ${plural(o.paths ?? 0, 'path')} changed)`);
  }
  const overwrite = data.paths === undefined ? '' : `; a redo would overwrite ${plural(data.paths, 'path')}`;
  lines.push(`rewindfs: those changes stay${overwrite} — rewind to a point instead (see /rewind)`);
  return lines;
}
