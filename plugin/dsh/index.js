/**
 * rewindfs for the DeepSeek Harness: rewind and redo of files *and* conversation.
 *
 * The workspace is served by the rewindfs daemon (a FUSE passthrough that keeps a
 * pre-image of every path before its first change in a turn).  This plugin only
 * talks to the daemon's control socket (found from the session's cwd):
 *
 * - `agent/pre-step`: after `next()` enters a turn's first step, `turn.begin`
 *   (awaited, bounded by turnTimeoutMs; without a daemon the turn still runs and the
 *   user is told once that it is unprotected);
 * - the `turn/end` session event: `turn.end` (queued after the begin);
 * - `fs/write-intent` / `fs/edit-intent`, prepended because the built-in file policy
 *   takes the single slot and never calls `next()`: decide nothing, call `next()`,
 *   note writes outside the mount (shown by `/rewind status`);
 * - a `ctx.shellEnv` contributor: every model shell carries `DSH_REWINDFS_TURN=<session>:<turn>`,
 *   so `/rewind N` can stop what turns >= N left running (lib/jobs.js);
 * - commands `/rewind`, `/rewind <turn> [--into <session>]`, `/rewind status`, `/rewind own`, `/redo`;
 * - the service `ctx.rewindfs` (lib/service.js) for other plugins;
 * - where the harness runs its web server (`--profile web`): two read-only routes
 *   for the web UI's client module (lib/web.js; the module itself is client.js,
 *   served by the web shell from package.json's `exports["./client"]`).
 *
 * It writes no session events of its own (an unknown event type makes the harness
 * refuse to open the log); its state lives in the rewindfs store.
 * @module rewindfs-dsh
 */
import { parseRewind, renderOwn, renderPoints, renderRedo, renderRefusal, renderRewind, renderStatus } from './lib/commands.js';
import { Config } from './lib/config.js';
import { refusal } from './lib/errors.js';
import { labelOf } from './lib/fork.js';
import { RewindfsService } from './lib/service.js';
import { registerWebRoutes } from './lib/web.js';

export const name = 'rewindfs';
export const inject = ['agents', 'sessions', 'commands'];
export { Config };

/** Subagents work inside their parent's turn; only top-level agents mark turns. */
function marksTurns(agent) {
  const header = agent?.session?.header;
  return header?.origin !== 'subagent' && !(header?.delegationDepth > 0);
}

function userNotice(ctx) {
  return {
    warn(text) {
      process.stderr.write(`${text}\n`);
      ctx.logger?.warn?.(text);
    },
  };
}

/**
 * Mount the plugin.
 * @param {object} ctx - Cordis context.
 * @param {object} config - validated by {@link Config}.
 */
export function apply(ctx, config) {
  const service = new RewindfsService(ctx, config, userNotice(ctx));
  ctx.provide('rewindfs', service);

  if (config.enabled) {
    ctx.on('agent/pre-step', async (payload, next) => {
      const decision = await next();
      if (decision?.kind === 'enter' && marksTurns(payload.agent)) {
        await service.beginTurn(payload.agent, payload.turn, labelOf(payload.messages));
      }
      return decision;
    });
    ctx.on('session/event', (session, event) => {
      if (event?.type === 'turn/end') service.endTurn(session.id, event.data?.turn);
    });
    ctx.on('session/flush', (session) => service.drainSession(session.id));
  }
  // Tag every model shell with its turn, so /rewind can find what a removed turn left
  // running (lib/jobs.js).  Optional: without ctx.shellEnv only ctx.jobs is used.
  ctx.inject(['shellEnv'], (sub) => {
    sub.shellEnv.register(service.turnEnvContributor());
  });
  for (const hook of ['fs/write-intent', 'fs/edit-intent']) {
    ctx.on(hook, (target, _actor, next) => {
      service.noteWrite(target);
      return next();
    }, { prepend: true });
  }

  // Optional: only the web profile mounts a web server; without it nothing is registered.
  ctx.inject(['webServer'], (web) => {
    web.effect(() => registerWebRoutes(web.webServer, service), 'rewindfs web routes');
  });

  ctx.effect(function* () {
    yield () => service.drain();
    yield ctx.commands.register({
      name: 'rewind',
      description: 'List rewind points, or rewind files and conversation to the start of a turn',
      input: { hint: '[<turn> [--into <session>] | status | own]' },
      handler: (inv) => rewindCommand(service, inv),
    });
    yield ctx.commands.register({
      name: 'redo',
      description: 'Undo the newest rewind in this session',
      handler: (inv) => redoCommand(service, inv),
    });
  }, 'rewindfs commands');
}

async function rewindCommand(service, { agent, rawInput }) {
  const parsed = parseRewind(rawInput ?? '');
  if (parsed.refusal) return { kind: 'error', text: renderRefusal(parsed.refusal, '/rewind') };
  if (parsed.op === 'list') {
    const r = await service.points(agent);
    return r.ok ? { kind: 'success', text: renderPoints(r.value) } : { kind: 'error', text: renderRefusal(r.refusal, '/rewind') };
  }
  if (parsed.op === 'status') {
    const r = await service.status(agent);
    return r.ok ? { kind: 'success', text: renderStatus(r.value) } : { kind: 'error', text: `rewindfs: not protected: ${r.refusal.message}` };
  }
  if (parsed.op === 'own') {
    const r = await service.rewindOwn(agent);
    return r.ok ? { kind: 'success', text: renderOwn(r.value) } : { kind: 'error', text: renderRefusal(r.refusal, '/rewind own') };
  }
  const r = await service.rewind(agent, parsed.turn, { into: parsed.into });
  return r.ok ? { kind: 'success', text: renderRewind(r.value) } : { kind: 'error', text: renderRefusal(r.refusal, `/rewind ${parsed.turn}`) };
}

async function redoCommand(service, { agent, rawInput }) {
  if ((rawInput ?? '').trim() !== '') return { kind: 'error', text: renderRefusal(refusal('usage', '/redo takes no arguments'), '/redo') };
  const r = await service.redo(agent);
  return r.ok ? { kind: 'success', text: renderRedo(r.value) } : { kind: 'error', text: renderRefusal(r.refusal, '/redo') };
}

