/**
 * The rewindfs service (`ctx.rewindfs`): every operation the commands and other
 * plugins use, each returning `{ok: true, value}` or `{ok: false, refusal: {code, message}}`
 * and never throwing for an expected refusal.
 *
 * Ordering: socket calls for one session run one after another on a per-session
 * queue, so a `turn.end` sent from the `turn/end` event always reaches the daemon
 * before the next `turn.begin` or a rewind of that session.  A session's flush
 * waits for its queue (`drainSession`) and plugin teardown for all of them
 * (`drain`), so a one-shot run does not exit with a turn left open.
 *
 * Remote (config `remote`): after each `turn.end` a `push {remote, wait: false}` is
 * queued behind it (fire and forget: the daemon only queues the push; a refusal is
 * told once per code and never fails the turn), and `/rewind N` of a point this
 * workspace does not know learns the history pushed there first (`remote.learn`,
 * docs/remote.md "On a new machine"), then rewinds.
 *
 * Errors: socket failures arrive as RewindfsCallError (`code` = the daemon's code
 * or `not-mounted`, `daemon-unreachable`, `timeout`, ...) and leave here as refusals.
 * @module rewindfs-dsh/service
 */
import { randomUUID } from 'node:crypto';
import { call } from './client.js';
import { callError, codeOf, refusal } from './errors.js';
import { landedNotice } from './commands.js';
import { forkCut, turnsOf } from './fork.js';
import { stopWorkOfTurns, TURN_ENV, turnTag } from './jobs.js';
import { checkFreshFork, markedTitle, REWOUND_PREFIX, unmarkedTitle } from './lineage.js';
import { defaultStorePath, findSocket, isInside, realpathLoose } from './paths.js';

// REWINDFS_DSH_DEBUG=1 traces every socket call on stderr (for bug reports).
const debug = process.env.REWINDFS_DSH_DEBUG ? (text) => process.stderr.write(`rewindfs-dsh: ${text}\n`) : () => {};
const refuse = (code, message) => ({ ok: false, refusal: refusal(code, message) });
// A caught error becomes a refusal with its own code (the daemon's codes pass through)
// and its structured data, when the daemon sent some (redo-stale names the changes).
const refuseWith = (error, message = error.message) => ({
  ok: false, refusal: { code: codeOf(error), message, ...(error?.data === undefined ? {} : { data: error.data }) },
});
const ok = (value) => ({ ok: true, value });
/** The entries of a harness registry (`list()` in rc.8; a Map's `values()` in tests). */
const listed = (registry) => [...(registry?.list?.() ?? registry?.values?.() ?? [])];
const SESSION_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
/** The daemon's own-files state of a session with no turn of its own (or none it could say). */
const NO_OWN = Object.freeze({ state: 'none', turn: null, left: null, holder: null });
export class RewindfsService {
  /**
   * @param {object} ctx - the plugin's Cordis context.
   * @param {object} config - validated config (lib/config.js).
   * @param {{warn: (text: string) => void}} notify - where user-facing notices go.
   */
  constructor(ctx, config, notify) {
    this.ctx = ctx;
    this.config = config;
    this.notify = notify;
    this.queues = new Map();     // session id -> tail promise
    this.sessions = new Map();   // session id -> {begun: Map<turn, state>, ended, open, warned, unprotected}
    this.outside = new Set();    // tool writes outside the workspace (not protected)
    this.landedIn = new Map();   // child session -> {rewind, turn, stopped, notice}: its rewind
    this.pushRefused = new Set(); // push refusal codes already told (once each)
  }

  /** The daemon serving `cwd`: {socket, workspace} or undefined. */
  locate(cwd) {
    if (this.config.socket) return { socket: this.config.socket, workspace: realpathLoose(cwd) };
    return findSocket(cwd, this.config.store ?? defaultStorePath());
  }

  cwdOf(agent) {
    return agent?.session?.header?.cwd ?? process.cwd();
  }

  state(id) {
    let s = this.sessions.get(id);
    if (s === undefined) this.sessions.set(id, s = { begun: new Map(), ended: new Set(), warned: false, open: undefined, unprotected: [] });
    return s;
  }

  /** Run `job` after every earlier job of session `id`; a failure does not stop the queue. */
  enqueue(id, job) {
    const run = (this.queues.get(id) ?? Promise.resolve()).then(job, job);
    const tail = run.catch(() => {});
    this.queues.set(id, tail);
    tail.then(() => { if (this.queues.get(id) === tail) this.queues.delete(id); });
    return run;
  }

  /** Wait until every queued socket call has settled (plugin teardown). */
  async drain() {
    while (this.queues.size > 0) await Promise.allSettled([...this.queues.values()]);
  }

  /**
   * Wait until session `id`'s queued calls have settled (its flush checkpoint: a
   * one-shot run must not exit before the turn.end of its last turn).  Only that
   * session's queue: a job of another session may itself flush (the fork flushes
   * the child from inside the parent's queue), and waiting for it would deadlock.
   */
  async drainSession(id) {
    while (this.queues.has(id)) await this.queues.get(id);
  }

  async rpc(cwd, method, params, options = {}) {
    const where = this.locate(cwd);
    if (where === undefined) {
      throw callError('not-mounted', `${cwd} is not inside a workspace served by rewindfs (run: rewindfs mount <dir>)`);
    }
    const timeoutMs = options.timeoutMs ?? this.config.callTimeoutMs;
    debug(`-> ${method} ${JSON.stringify(params)} (${where.socket})`);
    try {
      const result = await call(where.socket, method, params, { ...options, timeoutMs });
      debug(`<- ${method} ${JSON.stringify(result).slice(0, 500)}`);
      return { where, result };
    } catch (error) {
      debug(`<- ${method} failed: ${error.code} ${error.message}`);
      if (error.socketError === 'ECONNREFUSED') {
        // a socket nobody listens on: its daemon died (kill -9, OOM) and left the mount stale
        error.message += ` (the daemon serving ${where.workspace} is gone: \`rewindfs mount --recover ${where.workspace}\` brings the workspace back)`;
      }
      throw error;
    }
  }

  // ---- turns (hooks) --------------------------------------------------------

  /**
   * Mark turn `turn` of `agent`'s session once; never throws.  Waits at most
   * turnTimeoutMs (queue included); past that the turn runs unprotected and the
   * user is told once per session.  A begin that lands late still gets its end:
   * the `turn/end` event may arrive first, and then the end is sent on landing.
   */
  async beginTurn(agent, turn, label) {
    const s = this.state(agent.id);
    if (s.begun.has(turn)) return;
    s.begun.set(turn, 'pending');
    const cwd = this.cwdOf(agent);
    const limit = this.config.turnTimeoutMs;
    // The call itself may take longer than the hook waits: a daemon that applies the
    // begin after we stopped listening must still see the matching end.
    const params = { session: agent.id, turn, label };
    const begin = this.enqueue(agent.id, () => this.rpc(cwd, 'turn.begin', params, { timeoutMs: Math.max(limit, 30_000) }));
    begin.then(() => {
      s.begun.set(turn, 'open');
      s.open = turn;
      if (s.ended.has(turn)) this.endTurn(agent.id, turn);
    }, () => s.begun.set(turn, 'failed'));
    try {
      await withTimeout(begin, limit, `no reply to turn.begin within ${limit} ms`);
      s.warned = false;
    } catch (error) {
      s.unprotected.push(turn);
      s.unprotectedWhy = `${codeOf(error)}: ${error.message}`;
      if (!s.warned) {
        s.warned = true;
        this.notify.warn(`rewindfs: turn ${turn} of session ${agent.id} is NOT protected (files it changes cannot be rewound): ${error.message}`);
      }
    }
  }

  /** The turn/end event: close the daemon's open turn (queued; never throws). */
  endTurn(sessionId, turn) {
    const s = this.sessions.get(sessionId);
    if (s === undefined) return;
    s.ended.add(turn);
    if (s.open !== turn) return; // not begun, failed, or still pending (sent on landing)
    s.open = undefined;
    const cwd = this.cwdOfSession(sessionId);
    const job = () => this.rpc(cwd, 'turn.end', { session: sessionId }, { timeoutMs: Math.max(this.config.turnTimeoutMs, 10_000) });
    this.enqueue(sessionId, job).then(() => this.pushAfterTurn(sessionId, cwd), (error) => {
      this.notify.warn(`rewindfs: could not end turn ${turn} of session ${sessionId}: ${error.message}`);
    });
  }

  /**
   * With a remote configured: ask the daemon to push the ended turn (queued behind
   * the turn.end, `wait: false`: the daemon answers at once).  Never throws; a
   * refusal is told once per code (an older daemon without `push`: unknown-method).
   */
  pushAfterTurn(sessionId, cwd) {
    const remote = this.config.remote;
    if (remote === undefined) return;
    const job = () => this.rpc(cwd, 'push', { remote, wait: false }, { timeoutMs: Math.max(this.config.turnTimeoutMs, 10_000) });
    this.enqueue(sessionId, job).catch((error) => {
      const code = codeOf(error);
      if (this.pushRefused.has(code)) return;
      this.pushRefused.add(code);
      const why = code === 'unknown-method' ? 'this rewindfs daemon cannot push in the background (run `rewindfs push` by hand)' : error.message;
      this.notify.warn(`rewindfs: turns are not pushed to remote ${remote} (${code}): ${why}`);
    });
  }

  cwdOfSession(id) {
    return this.ctx.get('sessions')?.get(id)?.header?.cwd ?? process.cwd();
  }

  /** A tool is about to write `target`; remember it if it lies outside the workspace. */
  noteWrite(target) {
    const path = target?.displayPath;
    if (typeof path !== 'string' || !path.startsWith('/')) return;
    const where = this.locate(process.cwd());
    if (where !== undefined && !isInside(path, where.workspace)) this.outside.add(path);
  }

  // ---- operations (commands and other plugins) -------------------------------

  async status(agent) {
    const cwd = this.cwdOf(agent);
    try {
      const { where, result } = await this.enqueue(agent?.id ?? '', () => this.rpc(cwd, 'status', {}));
      return ok({ ...result, socket: result.socket ?? where.socket, workspace: result.workspace ?? where.workspace, outside: [...this.outside], unprotected: agent ? this.state(agent.id).unprotected : [], remote: this.config.remote ?? null, pushRefused: [...this.pushRefused] });
    } catch (error) {
      return refuseWith(error);
    }
  }

  async points(agent) {
    try {
      const { result } = await this.enqueue(agent.id, () => this.rpc(this.cwdOf(agent), 'points', { session: agent.id }));
      const points = (result.points ?? []).filter((p) => p.kind === 'turn');
      return ok({ session: agent.id, points });
    } catch (error) {
      return refuseWith(error);
    }
  }

  /**
   * Rewind the workspace to the start of `turn` of `agent`'s session: fork the
   * conversation at that turn's boundary into a child session first (or take the
   * fresh fork `--into` names, see lib/lineage.js) after stopping what turns >= `turn`
   * left running (`stopTurnWork`), tell the store the child's parent, then rewind the
   * files with `undo_for` = the child (so `/redo` in the child undoes it), and mark the
   * parent's title.  Refused while the agent runs.
   * @param {object} agent - the live agent the command was typed in.
   * @param {number | string} turn - absolute turn number, or a point id "e<epoch>".
   * @param {{into?: string}} options - the child's session id (default: a fresh one).
   */
  async rewind(agent, turn, options = {}) {
    if (agent.status === 'running') return refuse('busy', 'the agent is running; wait for the turn to finish (or cancel it), then rewind');
    if (typeof turn === 'string') {
      const resolved = await this.turnOfPoint(agent, turn);
      if (!resolved.ok) return resolved;
      turn = resolved.value;
    }
    if (!Number.isSafeInteger(turn) || turn < 1) return refuse('bad-turn', `${JSON.stringify(turn)} is not a turn number (turns count from 1)`);
    const into = options.into;
    if (into !== undefined && !SESSION_ID.test(into)) return refuse('bad-session', `"${into}" is not a usable session id (letters, digits, ".", "_", "-")`);
    const existing = into === undefined ? undefined : await this.existingSession(into);
    if (existing !== undefined) {
      const verdict = intoVerdict(existing, agent.id, into, turn);
      if (!verdict.ok) return verdict;
    }
    return this.enqueue(agent.id, () => this.rewindNow(agent, turn, into ?? `session-${randomUUID()}`, existing !== undefined));
  }

  /** The turn of point id `text` ("e<epoch>") in `agent`'s session and its ancestry. */
  async turnOfPoint(agent, text) {
    const epoch = Number(text.slice(1));
    const listed = await this.points(agent);
    if (!listed.ok) return listed;
    const point = listed.value.points.find((p) => p.epoch === epoch);
    if (point === undefined) return refuse('unknown-point', `session ${agent.id} has no turn point ${text} (see /rewind)`);
    return ok(point.turn);
  }

  /**
   * @param {object} agent - the parent.
   * @param {number} turn - absolute turn number.
   * @param {string} childId - the child's session id.
   * @param {boolean} forked - the child exists already (a fresh fork, checked); do not fork again.
   */
  async rewindNow(agent, turn, childId, forked = false) {
    const cwd = this.cwdOf(agent);
    const events = agent.session.events;
    const cut = forkCut(events, turn);
    if (cut.missing) return refuse('unknown-point', `session ${agent.id} has no turn ${turn} (turns: ${cut.turns.join(', ') || 'none yet'})`);
    let epoch;
    let learned;
    try {
      const found = await this.findPoint(cwd, agent.id, turn);
      epoch = found.point?.epoch;
      learned = found.learned;
      if (epoch === undefined) return refuse('unknown-point', `rewindfs has no point for turn ${turn} of session ${agent.id} (that turn ran unprotected, or before the workspace was mounted)${found.note ?? ''}`);
      // A dry run first: a refusal (turn open, bad point) must come before the fork.
      // "e<id>" names the epoch: a bare number with a session means a turn number.
      await this.rpc(cwd, 'rewind', { to: `e${epoch}`, session: agent.id, dry_run: true });
    } catch (error) {
      return refuseWith(error);
    }
    // Before the fork and the files: nothing of a removed turn may write into the
    // restored tree, and a writer that cannot be stopped refuses with nothing forked.
    const work = await this.stopTurnWork(agent, turn);
    if (!work.ok) return work;
    let handle;
    if (!forked) {
      try {
        handle = await this.forkChild(agent, childId, events, cut.cut);
      } catch (error) {
        return refuse('fork-failed', `could not fork session ${agent.id} at turn ${turn}: ${error.message}${stoppedNote(work.value.stopped)}`);
      }
    }
    let sent = false;
    try {
      await this.rpc(cwd, 'fork', { child: childId, parent: agent.id, boundary_turn: turn });
      sent = true;
      const { result } = await this.rpc(cwd, 'rewind', { to: `e${epoch}`, session: agent.id, undo_for: childId });
      if (handle !== undefined) {
        await this.ctx.get('sessions')?.flush(handle.agent.session);
        await this.attachToParentWorkspace(agent.id, childId);
      }
      this.markRewound(agent.session);
      this.noteLanded(childId, { ...result, turn, stopped: work.value.stopped });
      return ok({ ...result, turn, target: result.target ?? epoch, parent: agent.id, child: childId, seedLength: cut.cut, forked: !forked, stopped: work.value.stopped, ...(learned === undefined ? {} : { learned }) });
    } catch (error) {
      if (handle !== undefined) await handle.dispose().catch(() => {});
      const discarded = handle === undefined ? '' : `; the forked session ${childId} was discarded`;
      if (sent && outcomeUnknown(error)) {
        // it may land yet (its intent is in the store); it is filed under the child
        return refuseWith(error, `${error.message}${unknownNote(cwd)}${discarded}; \`rewindfs redo --session ${childId}\` undoes the rewind${stoppedNote(work.value.stopped)}`);
      }
      return refuseWith(error, `${error.message} (the files were not rewound${discarded})${stoppedNote(work.value.stopped)}`);
    }
  }

  /**
   * The point of `turn` in session `sessionId` (its own, else inherited); when there
   * is none and a remote is configured, learn the history pushed there
   * (`remote.learn`: the workspace must have no history here; no file changes) and
   * look again.  A learning the daemon refuses leaves the point unknown, with `note`
   * saying why.  Socket failures of `points` throw.
   * @returns {Promise<{point?: object, learned?: object, note?: string}>}
   */
  async findPoint(cwd, sessionId, turn) {
    const look = async () => pickPoint((await this.rpc(cwd, 'points', { session: sessionId })).result.points ?? [], sessionId, turn);
    const point = await look();
    const remote = this.config.remote;
    if (point !== undefined || remote === undefined) return { point };
    let learned;
    try {
      ({ result: learned } = await this.rpc(cwd, 'remote.learn', { remote, session: sessionId }));
    } catch (error) {
      return { note: `; not learned from remote ${remote}: ${error.message} (${codeOf(error)})` };
    }
    return { point: await look(), learned };
  }

  // ---- background work of removed turns (lib/jobs.js) --------------------------

  /**
   * Stop what turns >= `turn` of `agent`'s session left running (background jobs,
   * `cmd &` leftovers), before the files are restored.  A writer that cannot be
   * stopped is a `job-unstoppable` refusal: restoring under it would lose the restore.
   * @returns {Promise<{ok: true, value: {stopped: object[]}} | {ok: false, refusal: object}>}
   */
  async stopTurnWork(agent, turn) {
    const { stopped, problems } = await stopWorkOfTurns({ jobs: this.ctx.get('jobs'), agent, fromTurn: turn });
    for (const s of stopped) debug(`stopped ${s.job ?? `process group ${s.pgid}`} of turn ${s.turn}: ${s.command}`);
    if (problems.length === 0) return ok({ stopped });
    const already = stopped.length > 0 ? ` (stopped meanwhile: ${stopped.map((s) => s.job ?? `process group ${s.pgid}`).join(', ')})` : '';
    return refuse('job-unstoppable', `${problems.join('; ')}; the files were not rewound${already}`);
  }

  /**
   * Remember the rewind that landed in `child`: what it stopped (`/redo` there says it
   * is not restarted) and the notice its header shows (the reply stays in the parent's
   * transcript, which the web UI's control leaves).
   * @param {string} child - the session the rewind landed in.
   * @param {{epoch: number, turn: number, foreign?: object[], failed?: object[], stopped?: object[]}} result
   */
  noteLanded(child, result) {
    this.landedIn.set(child, { rewind: result.epoch, turn: result.turn, stopped: result.stopped ?? [], notice: landedNotice(result) });
  }

  /**
   * The `DSH_REWINDFS_TURN` contributor for `ctx.shellEnv`: every model shell carries
   * `<session>:<turn>` of the turn that started it (lib/jobs.js reads it back).
   */
  turnEnvContributor() {
    return {
      name: 'rewindfs-turn',
      variables: { [TURN_ENV]: { description: 'rewindfs: <session>:<turn> of the turn that started this shell (lets /rewind stop what a removed turn left running).' } },
      resolve: (execution) => {
        const session = execution.agent?.session;
        const tag = session === undefined ? undefined : turnTag(session.header?.id ?? execution.agent.id, session.events ?? []);
        return tag === undefined ? {} : { [TURN_ENV]: tag };
      },
    };
  }

  /** Fork `agent`'s conversation into `childId` with the first `cut` events (the host's own fork). */
  async forkChild(agent, childId, events, cut) {
    debug(`forking ${agent.id} into ${childId} at event ${cut}`);
    return this.ctx.agents.create({
      sessionId: childId,
      seed: events.slice(0, cut),
      meta: {
        ...(agent.session.header?.cwd === undefined ? {} : { cwd: agent.session.header.cwd }),
        parentSession: agent.id,
        seedLength: cut,
        ...(agent.session.header?.agentPreset === undefined ? {} : { agentPreset: agent.session.header.agentPreset }),
      },
      agentOptions: agent.options,
    });
  }

  /**
   * Attach a fork the plugin made itself to its parent's workspace, as the
   * deployment's own fork does (the web UI lists it there, not under "Ungrouped").
   * Nothing happens without a workspace registry (headless) or when the parent
   * belongs to no workspace; a failure is only traced (the rewind has landed).
   */
  async attachToParentWorkspace(parentId, childId) {
    const registry = this.ctx.get('workspaceRegistry');
    const workspace = registry?.list?.().find((w) => w.sessionIds?.includes(parentId));
    if (workspace === undefined) return;
    try {
      await workspace.attachSession(childId);
    } catch (error) {
      debug(`could not attach ${childId} to workspace ${workspace.id}: ${error.message}`);
    }
  }

  /**
   * A live or persisted session: `{header, events}`, or undefined when there is none.
   * @param {string} id - session id.
   */
  async existingSession(id) {
    const live = this.ctx.get('sessions')?.get(id) ?? this.ctx.get('agents')?.get(id)?.session;
    if (live !== undefined) return { header: live.header ?? {}, events: [...(live.events ?? [])] };
    const persistence = this.ctx.get('sessionPersistence');
    const stored = await persistence?.list().catch(() => []) ?? [];
    if (!stored.some((header) => header.id === id)) return undefined;
    const inspected = await persistence.inspect(id).catch(() => undefined);
    return { header: inspected?.meta ?? stored.find((h) => h.id === id), events: inspected?.events ?? [] };
  }

  /**
   * Undo the newest rewind that landed in `agent`'s session, and take the rewound
   * mark off its parent's title.  Refused while it runs.  In a session a rewind
   * left, the refusal names the child to /redo in instead of "nothing to redo".
   */
  async redo(agent) {
    if (agent.status === 'running') return refuse('busy', 'the agent is running; wait for the turn to finish (or cancel it), then redo');
    try {
      const { result } = await this.enqueue(agent.id, () => this.rpc(this.cwdOf(agent), 'redo', { session: agent.id }));
      await this.remark(agent);
      const landed = this.landedIn.get(agent.id);
      const notRestarted = landed?.stopped.length > 0 ? { turn: landed.turn, stopped: landed.stopped } : undefined;
      return ok({ ...result, session: agent.id, ...(notRestarted === undefined ? {} : { notRestarted }) });
    } catch (error) {
      if (codeOf(error) === 'nothing-to-redo') {
        const child = await this.rewoundInto(agent.id);
        if (child !== undefined) {
          return refuse('rewound-elsewhere', `this session was rewound into ${child}; open it and /redo there, or /rewind own here`);
        }
        if ((await this.ownFilesOf(agent.id)).left != null) {
          return refuseWith(error, `${error.message}; this session's own files were rewound away: /rewind own puts them back`);
        }
      }
      return refuseWith(error);
    }
  }

  /**
   * The ↩ marks after a rewind or redo in `agent`'s session, from where each session's
   * own files now are (the daemon's `own.state`): a marked session of this workspace
   * whose files are back loses its mark; `agent`'s session, and the sessions in
   * `others`, gain one when theirs are away.  Where the daemon cannot say, `unknown()`
   * runs instead: after a redo, the fork's parent is unmarked (a redo of a rewind into
   * a fork brought its files back).  Never throws.
   */
  async remark(agent, others = [], unknown = () => this.unmarkParent(agent.session)) {
    const cwd = this.cwdOf(agent);
    const marked = this.attached().filter(([id, session]) => id !== agent.id && this.isMarked(id) && this.cwdOf({ session }) === cwd);
    const mayMark = new Map([[agent.id, agent.session], ...others.map((id) => [id, this.sessionNamed(id)])]);
    let states;
    try {
      states = await this.ownStates(cwd, [...new Set([...mayMark.keys(), ...marked.map(([id]) => id)])]);
    } catch (error) {
      debug(`no own-files state for the ↩ marks: ${error.message}`);
      unknown();
      return;
    }
    for (const [id, session] of marked) if (states[id]?.state === 'here') this.retitle(session, unmarkedTitle);
    for (const [id, session] of mayMark) {
      if (states[id]?.state === 'away') this.markRewound(session);
      else if (states[id]?.state === 'here') this.retitle(session, unmarkedTitle);
    }
  }

  /** `[id, session]` of every attached session (live, or an agent's), once each. */
  attached() {
    const out = new Map();
    for (const session of listed(this.ctx.get('sessions'))) {
      const id = session?.id ?? session?.header?.id;
      if (id) out.set(id, session);
    }
    for (const agent of listed(this.ctx.get('agents'))) if (agent?.id && agent.session && !out.has(agent.id)) out.set(agent.id, agent.session);
    return [...out];
  }

  /**
   * `/rewind own`: put this session's own files back after a rewind moved the workspace
   * to another session's (the web UI's "↻ back to this session's files" in a session
   * marked ↩).  A rewind to the point the newest rewind that left them found, owned by
   * this session: `/redo` here undoes it (the other session's files back).  What it
   * undoes beyond this session — the other session's turns, edits between — is named
   * (`foreign`), as for any rewind; nothing is forked and no conversation changes.
   */
  async rewindOwn(agent) {
    if (agent.status === 'running') return refuse('busy', 'the agent is running; wait for the turn to finish (or cancel it), then rewind');
    const cwd = this.cwdOf(agent);
    return this.enqueue(agent.id, async () => {
      let where;
      try {
        where = (await this.ownStates(cwd, [agent.id]))[agent.id] ?? NO_OWN;
      } catch (error) {
        return refuseWith(error);
      }
      if (where.state === 'none') return refuse('no-own-files', `session ${agent.id} ran no turn of its own in this workspace: it has no files of its own to go back to`);
      if (where.state === 'here') return refuse('files-here', `the workspace holds this session's files already (turn ${where.turn} and what came after it)`);
      if (where.left == null) return refuse('no-own-files', `no point holds the files of this session's turn ${where.turn} any more (rewindfs gc dropped the rewind that left them)`);
      // as a ↺ rewind does: nothing the undone turns left running may write into the
      // files put back, and a writer that cannot be stopped refuses with nothing changed
      const work = await this.stopUndoneWork(where.undoes ?? [], agent.id);
      if (!work.ok) return work;
      const stopped = work.value.stopped;
      try {
        const { result } = await this.rpc(cwd, 'rewind', { to: `e${where.left}`, session: agent.id, undo_for: agent.id });
        // its own files are back whatever the daemon can say next: its mark goes
        await this.remark(agent, where.holder == null || where.holder === agent.id ? [] : [where.holder],
          () => this.retitle(agent.session, unmarkedTitle));
        this.noteLanded(agent.id, { ...result, turn: where.turn, stopped });
        return ok({ ...result, session: agent.id, left: where.left, turn: where.turn, stopped, ...(where.holder == null ? {} : { from: where.holder }) });
      } catch (error) {
        const what = outcomeUnknown(error) ? unknownNote(cwd) : ' (the files were not rewound)';
        return refuseWith(error, `${error.message}${what}${stoppedNote(stopped)}`);
      }
    });
  }

  /**
   * Stop what the turns `undoes` (`[{session, turn}]`, the daemon's `own.state`) left
   * running, for each session but `self`: its work from its oldest undone turn on, as
   * `stopTurnWork` does for a ↺ rewind.  A session that is not attached here is
   * reached by its processes' turn tags alone.  Each stopped entry names its session.
   * @returns {Promise<{ok: true, value: {stopped: object[]}} | {ok: false, refusal: object}>}
   */
  async stopUndoneWork(undoes, self) {
    const oldest = new Map();
    for (const { session, turn } of undoes) {
      if (session == null || session === self || !Number.isInteger(turn)) continue;
      oldest.set(session, Math.min(turn, oldest.get(session) ?? turn));
    }
    const stopped = [];
    const problems = [];
    for (const [id, fromTurn] of oldest) {
      const agent = this.ctx.get('agents')?.get(id) ?? { id, session: this.sessionNamed(id) };
      const reason = `rewindfs: /rewind own in session ${self} undoes turn ${fromTurn} of session ${id}, which started this job`;
      const found = await stopWorkOfTurns({ jobs: this.ctx.get('jobs'), agent, fromTurn, reason });
      stopped.push(...found.stopped.map((s) => ({ ...s, session: id })));
      problems.push(...found.problems);
    }
    for (const s of stopped) debug(`stopped ${s.job ?? `process group ${s.pgid}`} of turn ${s.turn} of ${s.session}: ${s.command}`);
    if (problems.length === 0) return ok({ stopped });
    const already = stopped.length > 0 ? ` (stopped meanwhile: ${stopped.map((s) => s.job ?? `process group ${s.pgid}`).join(', ')})` : '';
    return refuse('job-unstoppable', `${problems.join('; ')}; the files were not rewound${already}`);
  }

  /**
   * Where the own files of each session in `ids` are, in the workspace of `cwd` (the
   * daemon's `own.state`: id → `{state: 'none'|'here'|'away', turn, left, holder}`;
   * away, `left` is the point that puts them back and `holder` whose files are here).
   * Throws what the daemon refused.
   */
  async ownStates(cwd, ids) {
    return (await this.rpc(cwd, 'own.state', { sessions: ids })).result.sessions ?? {};
  }

  /** The daemon's own-files state of session `id`, or `none` when it cannot say. */
  async ownFilesOf(id) {
    try {
      return (await this.ownStates(this.cwdOfSession(id), [id]))[id] ?? NO_OWN;
    } catch (error) {
      debug(`own files of ${id}: ${error.message}`);
      return NO_OWN;
    }
  }

  /** The attached session (live, or an agent's) with id `id`, or undefined. */
  sessionNamed(id) {
    return this.ctx.get('sessions')?.get(id) ?? this.ctx.get('agents')?.get(id)?.session;
  }

  /**
   * Whether `/redo` in session `id` would undo a rewind now (the web UI's header
   * control asks): the daemon's `redo.state` — the store's redo stack of that owner
   * and whether the tree changed since its top rewind (a stale redo is refused, so
   * the control is not offered then).  Where none is possible and a rewind took this
   * session's own files away, `own` says so (the control runs `/rewind own` then).
   * Never throws.
   * @param {string} id - session id.
   * @returns {Promise<{ok: true, value: {session: string, canRedo: boolean, rewind?: number, reason?: string, landed?: object, own?: {left: number, from?: string}}}>} verdict.
   */
  async redoState(id) {
    try {
      const { result } = await this.enqueue(id, () => this.rpc(this.cwdOfSession(id), 'redo.state', { session: id }));
      const canRedo = result.can_redo === true;
      // the notice of the rewind on top of the redo stack only: once undone (or
      // buried under a newer rewind) what it undid is no longer the news
      const landed = this.landedIn.get(id);
      const notice = canRedo && landed?.rewind === result.rewind ? landed.notice : undefined;
      // where a rewind took this session's own files away and no /redo here brings
      // them back, the header offers /rewind own instead.  Asked of every session: the
      // store keeps the workspace's epochs between questions (docs/store.md; 20,000
      // turns: ~10 ms in the daemon), and the header asks on every new transcript row.
      const own = await this.ownFilesOf(id);
      // the ↩ mark follows: one this process could not move when the files went or
      // came back (the session was not attached then, the files went by another
      // session's /rewind own, a `rewindfs rewind`, or the server was stopped in the
      // middle of the command) moves when the session is looked at
      if (own.state === 'here') this.retitle(this.sessionNamed(id), unmarkedTitle);
      else if (own.state === 'away') this.markRewound(this.sessionNamed(id));
      const back = canRedo || own.left == null ? undefined : { left: own.left, ...(own.holder == null ? {} : { from: own.holder }) };
      return ok({ session: id, canRedo, ...(result.rewind == null ? {} : { rewind: result.rewind }), ...(result.reason == null ? {} : { reason: result.reason }), ...(notice === undefined ? {} : { landed: notice }), ...(back === undefined ? {} : { own: back }) });
    } catch (error) {
      return ok({ session: id, canRedo: false, reason: `${codeOf(error)}: ${error.message}` });
    }
  }

  /**
   * The turns of session `id` that ran unprotected in this process (their begin
   * failed or timed out: what they changed cannot be rewound) and the last reason —
   * what the web UI's header says, since the stderr notice never reaches the browser.
   * Never throws; asks no daemon.
   * @param {string} id - session id.
   * @returns {{ok: true, value: {session: string, unprotected: number[], reason?: string}}} the turns.
   */
  protection(id) {
    const s = this.sessions.get(id);
    const why = s?.unprotectedWhy;
    return ok({ session: id, unprotected: [...(s?.unprotected ?? [])], ...(why === undefined ? {} : { reason: why }) });
  }

  /**
   * The newest fork of session `parentId` that a rewind landed in and that can
   * still be redone, or undefined.  Asked only on the refusal path of `/redo`.
   */
  async rewoundInto(parentId) {
    for (const child of await this.forksOf(parentId)) {
      if ((await this.redoState(child)).value.canRedo) return child;
    }
    return undefined;
  }

  /** Ids of the live or persisted sessions whose header names `parentId` as parent. */
  async forksOf(parentId) {
    const stored = await this.ctx.get('sessionPersistence')?.list().catch(() => []) ?? [];
    const live = listed(this.ctx.get('sessions')).map((s) => s?.header ?? {});
    const ids = new Set();
    for (const header of [...live, ...stored]) if (header?.parentSession === parentId && header.id) ids.add(header.id);
    return [...ids];
  }

  /** Whether session `id` is attached and its title carries the rewound mark. */
  isMarked(id) {
    const session = this.sessionNamed(id);
    try {
      return session !== undefined && (this.ctx.get('sessionTitle')?.get(session)?.title ?? '').startsWith(REWOUND_PREFIX);
    } catch (error) {
      debug(`title of ${id}: ${error.message}`);
      return false;
    }
  }

  /** Put the rewound mark on `session`'s title (nothing without a title service). */
  markRewound(session) {
    this.retitle(session, markedTitle);
  }

  /** Take the rewound mark off the title of `session`'s parent, if that is attached. */
  unmarkParent(session) {
    const parentId = session?.header?.parentSession;
    if (parentId === undefined) return;
    const parent = this.sessionNamed(parentId);
    if (parent === undefined) {
      debug(`redo: parent ${parentId} is not attached; its title keeps the rewound mark`);
      return;
    }
    this.retitle(parent, unmarkedTitle);
  }

  /** Rename `session` to `change(its title)` when that differs; a failure is only traced. */
  retitle(session, change) {
    const titles = this.ctx.get('sessionTitle');
    if (titles === undefined || session === undefined) return;
    try {
      const current = titles.get(session)?.title ?? '';
      const next = change(current);
      if (next !== current && next.trim() !== '') titles.rename(session, next);
    } catch (error) {
      debug(`retitle ${session.id} failed: ${error.message}`);
    }
  }

  /** Turns of the session log (for messages). */
  turns(agent) {
    return turnsOf(agent.session.events);
  }
}

/** `promise`, or a RewindfsCallError('timeout') after `ms` (the work itself goes on). */
function withTimeout(promise, ms, message) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(callError('timeout', message)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/**
 * Whether a rewind call's failure leaves its outcome open: the daemon stopped answering
 * (it died, or is slow) after the request went out.  A rewind writes its intent before
 * it lands, so it may have landed in part, and the next mount finishes it.
 */
function outcomeUnknown(error) {
  return ['connection-lost', 'timeout'].includes(codeOf(error));
}

/** What to say of a rewind whose outcome is open (`outcomeUnknown`). */
function unknownNote(cwd) {
  return ` (the daemon did not answer the rewind: the files may be rewound in part, or still landing; if the daemon died, \`rewindfs mount --recover ${cwd}\` finishes the rewind)`;
}

/** For a refusal after the work of the removed turns was stopped: what was stopped. */
function stoppedNote(stopped) {
  return stopped.length === 0 ? '' : `; stopped before that: ${stopped.map((s) => s.job ?? `process group ${s.pgid}`).join(', ')}`;
}

/** The turn point for `turn`: the session's own first, else an inherited one. */
function pickPoint(points, session, turn) {
  const matching = points.filter((p) => p.kind === 'turn' && p.turn === turn);
  return matching.find((p) => p.session === session) ?? matching[0];
}

/**
 * Whether the existing session `into` may take a rewind of `parentId` to `turn`:
 * `{ok: true}` or a refusal.  A session that is no fork of this one keeps the
 * `session-exists` refusal; a fork that is not fresh says why.
 */
function intoVerdict(existing, parentId, into, turn) {
  if (existing.header?.parentSession !== parentId) {
    return refuse('session-exists', `session ${into} already exists; pick another name for --into`);
  }
  const verdict = checkFreshFork(existing, parentId, turn);
  if (verdict.ok) return verdict;
  return refuse('fork-not-fresh', `session ${into} cannot take this rewind: ${verdict.reason}; fork this session before turn ${turn}, or leave out --into`);
}

