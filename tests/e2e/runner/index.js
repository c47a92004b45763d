/**
 * Headless test runner for the rewindfs end-to-end test: a harness plugin that
 * replaces the stock `headless-startup`/`headless-runner` rows (which always
 * start a fresh session and send `/cmd` text to the model).
 *
 * Driven by $REWINDFS_E2E_ACTION, a JSON object:
 *
 *   {"session": "<id>"?,          resume this persisted session (else create one;
 *    "new_session": "<id>"?,      with this id, else session-<uuid>)
 *    "steps": [
 *      {"prompt": "text"},                         one user turn, run to quiescence
 *      {"command": "/rewind 2"},                   one slash command, no model turn
 *      {"service": "points"},                      ctx.rewindfs.points(agent) (or status)
 *      {"prompt": "text", "during": "/rewind 1",   the command is dispatched while the
 *       "gate": "/abs/file"}                       turn runs: after its first tool call
 *                                                  starts; then the gate file is created
 *                                                  (the scripted tool waits for it)
 *      {"touch": "/abs/file"}                      create a file (opens a scripted gate)
 *      {"wait_exit": "/abs/pidfile"}               wait (at most 60 s) until the pid in the
 *                                                  file is gone, then until the agent is idle;
 *                                                  records `exited` and the session's turns
 *      {"alive": "/abs/pidfile"}                   whether that pid still runs
 *    ]}
 *
 * Prints one line per step on stdout: `RWE2E {"session", "kind", ...}` -- the
 * session id, the turn's end reason and final text, or the command's result kind
 * and text.  Exit code 0 unless the runner itself failed.
 */
import { randomUUID } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';

export const name = 'rewindfs-e2e-runner';
export const inject = ['agentDefaultModel', 'agents', 'sessions', 'commands'];

function emit(record) {
  process.stdout.write(`RWE2E ${JSON.stringify(record)}\n`);
}

function lastTurn(events, firstSeq) {
  let text = '';
  let reason;
  for (const e of events) {
    if (e.seq < firstSeq) continue;
    if (e.type === 'assistant/message') {
      const t = e.data.message.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
      if (t !== '') text = t;
    }
    if (e.type === 'turn/end') reason = e.data.reason;
  }
  return { text, reason };
}

function userMessage(text) {
  return { role: 'user', id: randomUUID(), content: [{ type: 'text', text }], source: { kind: 'user' } };
}

async function open(ctx, action) {
  const selection = ctx.agentDefaultModel.currentSelection();
  const agentOptions = { provider: selection.provider, model: selection.model };
  if (action.session) return ctx.agents.resume({ resumeSessionId: action.session, agentOptions });
  return ctx.agents.create({
    sessionId: action.new_session ?? `session-${randomUUID()}`,
    meta: { cwd: process.cwd() },
    agentOptions,
  });
}

async function command(ctx, agent, line) {
  const done = await ctx.commands.execute(agent, line, [], new AbortController().signal);
  return done === undefined ? { result: 'unknown-command', text: '' } : { result: done.result.kind, text: done.result.text ?? '' };
}

async function prompt(ctx, agent, step) {
  await agent.whenIdle();
  const firstSeq = agent.session.seq;
  let during;
  if (step.during) {
    during = new Promise((resolve, reject) => {
      const off = ctx.on('session/event', (session, event) => {
        if (session.id !== agent.id || event.type !== 'tool/call') return;
        off();
        setImmediate(() => {
          const status = agent.status;
          command(ctx, agent, step.during).then((result) => {
            writeFileSync(step.gate, 'go');
            resolve({ ...result, status_at_dispatch: status });
          }, reject);
        });
      });
    });
  }
  agent.followup(userMessage(step.prompt));
  await agent.whenIdle();
  const duringResult = during ? await during : undefined;
  await agent.whenIdle();
  const outcome = lastTurn(agent.session.events, firstSeq);
  return { kind: 'turn', reason: outcome.reason?.kind, text: outcome.text, during: duringResult };
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Whether `pid` is a live (not zombie) process. */
function alive(pid) {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z';
  } catch {
    return false;
  }
}

const pidIn = (file) => Number(readFileSync(file, 'utf8').trim());
const turnsOf = (agent) => agent.session.events.filter((e) => e.type === 'turn/start').map((e) => e.data.turn);

/**
 * Wait until the process in `file` is gone (60 s at most), then give a completion
 * notice the chance to wake the agent (a tick, then until idle), and report the turns.
 */
async function waitExit(agent, file) {
  const pid = pidIn(file);
  const until = Date.now() + 60_000;
  while (alive(pid) && Date.now() < until) await sleep(50);
  const exited = !alive(pid);
  await sleep(500);
  await agent.whenIdle();
  return { kind: 'wait', pid, exited, turns: turnsOf(agent) };
}

async function step(ctx, agent, s) {
  if (s.command) return { kind: 'command', line: s.command, ...(await command(ctx, agent, s.command)) };
  if (s.service) return { kind: 'service', call: s.service, ...(await ctx.get('rewindfs')[s.service](agent)) };
  if (s.touch) {
    writeFileSync(s.touch, 'go');
    return { kind: 'touch', path: s.touch };
  }
  if (s.wait_exit) return waitExit(agent, s.wait_exit);
  if (s.alive) return { kind: 'alive', pid: pidIn(s.alive), alive: alive(pidIn(s.alive)) };
  return prompt(ctx, agent, s);
}

async function run(ctx, exit) {
  await ctx.get('loader')?.await();
  const action = JSON.parse(process.env.REWINDFS_E2E_ACTION ?? '{}');
  const { agent } = await open(ctx, action);
  await agent.whenIdle();
  let failed = false;
  for (const s of action.steps ?? []) {
    process.stderr.write(`rwe2e: ${agent.id}: ${JSON.stringify(s)}\n`);
    const record = await step(ctx, agent, s);
    emit({ session: agent.id, ...record });
    if (record.kind === 'turn' && record.reason !== 'completed') failed = true;
  }
  for (const session of ctx.sessions.list()) await ctx.sessions.flush(session);
  exit(failed ? 1 : 0);
}

export function apply(ctx) {
  const exit = ctx.get('appExit');
  if (exit === undefined) throw new Error('rewindfs-e2e-runner: the launcher must provide ctx.appExit');
  run(ctx, exit).catch((error) => {
    process.stderr.write(`rewindfs-e2e-runner: ${error?.stack ?? error}\n`);
    exit(1);
  });
}
