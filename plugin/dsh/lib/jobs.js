/**
 * Background work started by turns that a rewind removes, and stopping it.
 *
 * A rewind to the start of turn N undoes turns N, N+1, … of the session; anything
 * those turns left running (a `run_in_background` bash job, a `cmd &` that outlived
 * its foreground call) would go on writing into the restored tree, and a job's
 * completion notice would wake the session into a turn nobody asked for.  So before
 * the files are restored the plugin stops that work, through two handles:
 *
 * - the harness's job registry (`ctx.jobs`): the session log records which turn
 *   started which job (the bash tool's result text `started background job <id>`
 *   in a `tool/result` of that turn).  `jobs.kill(id, owner)` sends SIGTERM to the
 *   job's process group and SIGKILL after the executor's grace, and marks the job
 *   reported, which suppresses its completion notice (no wake);
 * - the turn tag: every shell the bash tool starts carries `DSH_REWINDFS_TURN=
 *   <session>:<turn>` in its environment (a `ctx.shellEnv` contributor, see
 *   {@link TURN_ENV}); it is inherited by everything the shell starts, so
 *   `/proc/<pid>/environ` names the turn of any process still running — also of a
 *   `cmd &` whose foreground call returned long ago, which the harness keeps no
 *   public handle for.  Those process groups get SIGTERM, then SIGKILL after
 *   {@link GRACE_MS}.
 *
 * A process of the session that cannot be attributed to a turn (no tag, started
 * after turn N began) or that is still alive after SIGKILL is a refusal, not a
 * restore under a running writer.  Linux only (/proc); elsewhere nothing is found
 * by the tag and only the registry's jobs are stopped.
 * @module rewindfs-dsh/jobs
 */
import { readdirSync, readFileSync, statSync } from 'node:fs';

/** The environment variable that tags every model shell with its session and turn. */
export const TURN_ENV = 'DSH_REWINDFS_TURN';
/** The harness's session variable (a built-in of `ctx.shellEnv`). */
export const SESSION_ENV = 'DSH_SESSION_ID';
/** SIGTERM → SIGKILL grace for tagged process groups, and the wait after SIGKILL. */
export const GRACE_MS = 2000;
const BACKGROUND_RESULT = /^started background job (\S+)$/;

/**
 * The turn tag of a shell started now by `session`: `<session>:<turn>` of its open
 * turn, or undefined between turns.
 * @param {string} session - session id (never contains ':').
 * @param {readonly {type: string, data?: any}[]} events - the session log.
 * @returns {string | undefined} the tag.
 */
export function turnTag(session, events) {
  for (let i = events.length - 1; i >= 0; i--) {
    const e = events[i];
    if (e.type === 'turn/end') return undefined;
    if (e.type === 'turn/start' && Number.isInteger(e.data?.turn)) return `${session}:${e.data.turn}`;
  }
  return undefined;
}

/**
 * Parse a tag back: `{session, turn}`, or undefined for anything else.
 * @param {string | undefined} tag - the variable's value.
 */
export function parseTag(tag) {
  const m = /^(.+):([0-9]+)$/.exec(tag ?? '');
  return m ? { session: m[1], turn: Number(m[2]) } : undefined;
}

/**
 * The background jobs the session log says turns >= `fromTurn` started.
 * @param {readonly {type: string, data?: any}[]} events - the session log.
 * @param {number} fromTurn - the first removed turn.
 * @returns {{id: string, turn: number, command: string}[]} in log order.
 */
export function jobsOfTurns(events, fromTurn) {
  const commands = new Map();
  const jobs = [];
  for (const e of events) {
    const turn = e.data?.turn;
    if (!Number.isInteger(turn) || turn < fromTurn) continue;
    if (e.type === 'tool/call') commands.set(e.data.callId, commandOf(e.data));
    if (e.type !== 'tool/result') continue;
    for (const block of e.data.message?.content ?? []) {
      if (block?.type !== 'tool-result') continue;
      const text = (block.content ?? []).filter((b) => b?.type === 'text').map((b) => b.text).join('');
      const m = BACKGROUND_RESULT.exec(text.trim());
      if (m) jobs.push({ id: m[1], turn, command: commands.get(block.toolCallId) ?? '' });
    }
  }
  return jobs;
}

function commandOf(call) {
  try {
    const args = typeof call.arguments === 'string' ? JSON.parse(call.arguments) : call.arguments;
    return typeof args?.command === 'string' ? args.command : (args?.description ?? call.name ?? '');
  } catch {
    return call.name ?? '';
  }
}

/** The time (epoch ms) turn `turn` started in the log, or undefined. */
export function turnStartedAt(events, turn) {
  return events.find((e) => e.type === 'turn/start' && e.data?.turn === turn)?.time;
}

// ---- /proc -------------------------------------------------------------------

/**
 * One process as /proc shows it, or undefined when it is gone or unreadable.
 * @param {number} pid - process id.
 * @param {string} proc - the proc root (tests may point elsewhere).
 * @returns {{pid, ppid, pgid, state, comm, startTicks} | undefined}
 */
export function readStat(pid, proc = '/proc') {
  let text;
  try {
    text = readFileSync(`${proc}/${pid}/stat`, 'utf8');
  } catch {
    return undefined;
  }
  // comm is in parentheses and may itself hold spaces and ')': split at the last ')'.
  const close = text.lastIndexOf(')');
  const comm = text.slice(text.indexOf('(') + 1, close);
  const f = text.slice(close + 2).split(' ');
  return { pid, state: f[0], ppid: Number(f[1]), pgid: Number(f[2]), comm, startTicks: Number(f[19]) };
}

function readEnviron(pid, proc) {
  try {
    const env = new Map();
    for (const entry of readFileSync(`${proc}/${pid}/environ`, 'latin1').split('\0')) {
      const eq = entry.indexOf('=');
      if (eq > 0) env.set(entry.slice(0, eq), entry.slice(eq + 1));
    }
    return env;
  } catch {
    return undefined;
  }
}

function cmdline(pid, proc) {
  try {
    return readFileSync(`${proc}/${pid}/cmdline`, 'utf8').split('\0').filter((s) => s !== '').join(' ');
  } catch {
    return '';
  }
}

function pids(proc) {
  try {
    return readdirSync(proc).filter((n) => /^[0-9]+$/.test(n)).map(Number);
  } catch {
    return [];
  }
}

/** The boot time (epoch ms, whole seconds) from /proc/stat, or undefined. */
function bootMs(proc) {
  try {
    return Number(/^btime ([0-9]+)$/m.exec(readFileSync(`${proc}/stat`, 'utf8'))[1]) * 1000;
  } catch {
    return undefined;
  }
}

/** Whether the process is ours: same uid as this one (a root harness: any). */
function ours(pid, proc) {
  if (process.getuid?.() === 0) return true;
  try {
    return statSync(`${proc}/${pid}`).uid === process.getuid?.();
  } catch {
    return false;
  }
}

/**
 * The live processes of `session` (its model shells and everything they started),
 * with the turn their tag names (undefined: untagged).  Zombies, this process and
 * its own process group are left out, and so is any process of another user (the
 * variables are only a claim; a root harness trusts them, as it runs the shells).
 * @param {string} session - session id.
 * @param {{proc?: string}} options - the proc root.
 * @returns {{pid, pgid, turn, comm, command, startedMs}[]}
 */
export function processesOfSession(session, { proc = '/proc' } = {}) {
  const own = readStat(process.pid, proc)?.pgid;
  const boot = bootMs(proc);
  const found = [];
  for (const pid of pids(proc)) {
    if (pid === process.pid || !ours(pid, proc)) continue;
    const env = readEnviron(pid, proc);
    if (env === undefined || env.get(SESSION_ENV) !== session) continue;
    const stat = readStat(pid, proc);
    if (stat === undefined || stat.state === 'Z' || stat.pgid === own) continue;
    const tag = parseTag(env.get(TURN_ENV));
    found.push({
      pid, pgid: stat.pgid, turn: tag?.session === session ? tag.turn : undefined,
      // start ticks are USER_HZ (100 on Linux) since boot
      comm: stat.comm, command: cmdline(pid, proc), startedMs: boot === undefined ? undefined : boot + stat.startTicks * 10,
    });
  }
  return found;
}

/** Whether any non-zombie process is still in process group `pgid`. */
export function groupAlive(pgid, proc = '/proc') {
  for (const pid of pids(proc)) {
    const stat = readStat(pid, proc);
    if (stat !== undefined && stat.pgid === pgid && stat.state !== 'Z') return true;
  }
  return false;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function waitGone(groups, ms, proc) {
  const until = Date.now() + ms;
  let alive = groups.filter((g) => groupAlive(g, proc));
  while (alive.length > 0 && Date.now() < until) {
    await sleep(25);
    alive = alive.filter((g) => groupAlive(g, proc));
  }
  return alive;
}

function signalGroup(pgid, signal) {
  try {
    process.kill(-pgid, signal);
    return undefined;
  } catch (error) {
    return error.code === 'ESRCH' ? undefined : error.code;
  }
}

/**
 * Stop process groups: SIGTERM, SIGKILL to those alive after `graceMs`, then wait
 * `graceMs` more.  Returns the groups still alive and why (a signal refused).
 * @param {number[]} groups - process group ids.
 * @param {{graceMs?: number, proc?: string}} options
 * @returns {Promise<{pgid: number, reason: string}[]>} survivors.
 */
export async function stopGroups(groups, { graceMs = GRACE_MS, proc = '/proc' } = {}) {
  const refused = new Map();
  for (const g of groups) {
    const code = signalGroup(g, 'SIGTERM');
    if (code) refused.set(g, `SIGTERM refused (${code})`);
  }
  let alive = await waitGone(groups, graceMs, proc);
  for (const g of alive) {
    const code = signalGroup(g, 'SIGKILL');
    if (code) refused.set(g, `SIGKILL refused (${code})`);
  }
  alive = await waitGone(alive, graceMs, proc);
  return alive.map((g) => ({ pgid: g, reason: refused.get(g) ?? 'still alive after SIGKILL' }));
}

/**
 * Short text for a command in replies: its first line, at most 60 characters.
 * @param {string} command - the command as the tool got it.
 */
export function shortCommand(command) {
  const line = String(command ?? '').split('\n')[0].trim();
  return line.length > 60 || String(command ?? '').includes('\n') ? `${line.slice(0, 59)}…` : line;
}

// ---- stopping the work of removed turns -----------------------------------------

/** How long a killed registry job may take to settle (TERM grace + pipe drain + slack). */
export const JOB_SETTLE_MS = 15_000;

/**
 * Stop everything turns >= `fromTurn` of `agent`'s session left running: the
 * harness's jobs first (their kill also suppresses the completion notice), then
 * every process group tagged with such a turn.  Never throws.
 * @param {{jobs?: object, agent: object, fromTurn: number, proc?: string, graceMs?: number, settleMs?: number, reason?: string}} options
 * @returns {Promise<{stopped: {turn?: number, command: string, job?: string, pgid?: number}[],
 *   problems: string[]}>} what was stopped, and why anything could not be (empty: all clear).
 */
export async function stopWorkOfTurns({ jobs, agent, fromTurn, proc = '/proc', graceMs = GRACE_MS, settleMs = JOB_SETTLE_MS,
  reason = `rewindfs: /rewind ${fromTurn} removes the turn that started this job` }) {
  const events = agent.session?.events ?? [];
  const fromJobs = await stopRegistryJobs(jobs, agent, events, fromTurn, reason, settleMs);
  const fromTags = await stopTaggedGroups(agent.id, events, fromTurn, proc, graceMs);
  return { stopped: [...fromJobs.stopped, ...fromTags.stopped], problems: [...fromJobs.problems, ...fromTags.problems] };
}

/** The turn whose window holds `timeMs` (the newest turn that started at or before it). */
function turnAt(events, timeMs) {
  let turn;
  for (const e of events) if (e.type === 'turn/start' && e.time <= timeMs) turn = e.data?.turn;
  return turn;
}

function listJobs(jobs, agent) {
  try {
    return jobs?.list(agent) ?? [];
  } catch {
    return [];
  }
}

const LIVE = new Set(['running', 'stopping']);

async function stopRegistryJobs(jobs, agent, events, fromTurn, reason, settleMs) {
  const stopped = [];
  const problems = [];
  const live = listJobs(jobs, agent).filter((snap) => LIVE.has(snap.status));
  const recorded = new Map(jobsOfTurns(events, fromTurn).map((j) => [j.id, j]));
  const since = turnStartedAt(events, fromTurn);
  for (const snap of live) {
    const job = recorded.get(snap.id) ?? (since !== undefined && snap.startedAt >= since
      ? { id: snap.id, turn: turnAt(events, snap.startedAt), command: snap.label } : undefined);
    if (job === undefined) continue;   // started by a turn the rewind keeps
    const what = `background job ${job.id} of turn ${job.turn ?? '?'} (${shortCommand(job.command)})`;
    try {
      jobs.kill(job.id, agent, reason);
      const end = await jobs.wait(job.id, settleMs, agent);
      if (LIVE.has(end.status)) problems.push(`${what} is still ${end.status} ${settleMs / 1000} s after it was killed`);
      else stopped.push({ turn: job.turn, command: job.command, job: job.id });
    } catch (error) {
      problems.push(`${what} could not be stopped: ${error?.message ?? error}`);
    }
  }
  return { stopped, problems };
}

async function stopTaggedGroups(session, events, fromTurn, proc, graceMs) {
  const problems = [];
  const since = turnStartedAt(events, fromTurn);
  const groups = new Map();   // pgid -> {turn, command}
  const untagged = new Map(); // pgid -> its first process
  for (const p of processesOfSession(session, { proc })) {
    if (p.turn === undefined) {
      // Not started through a tagged shell; if it began after the first removed turn,
      // it may be that turn's writer and nothing tells us which turn it belongs to.
      const late = since !== undefined && p.startedMs !== undefined && p.startedMs >= since - 1000;
      if (late && (!untagged.has(p.pgid) || p.pid === p.pgid)) untagged.set(p.pgid, p);
      continue;
    }
    if (p.turn < fromTurn) continue;
    const group = groups.get(p.pgid);
    const leader = p.pid === p.pgid;
    if (group === undefined || leader) groups.set(p.pgid, { turn: Math.min(p.turn, group?.turn ?? p.turn), command: p.command });
  }
  for (const p of untagged.values()) {
    problems.push(`process ${p.pid} (${p.comm}) of session ${session} started after turn ${fromTurn} began and carries no turn tag; stop it, then rewind`);
  }
  if (groups.size === 0) return { stopped: [], problems };
  const survivors = await stopGroups([...groups.keys()], { graceMs, proc });
  for (const s of survivors) {
    const g = groups.get(s.pgid);
    problems.push(`process group ${s.pgid} of turn ${g.turn} (${shortCommand(g.command)}): ${s.reason}`);
  }
  const dead = new Set(survivors.map((s) => s.pgid));
  const stopped = [...groups].filter(([pgid]) => !dead.has(pgid)).map(([pgid, g]) => ({ turn: g.turn, command: g.command, pgid }));
  return { stopped, problems };
}
