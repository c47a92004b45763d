// The web half: the browser module's logic (client.js, loaded as the web shell loads
// it, with a stub module loader and a stub React), the host's read-only routes, which
// sessions `--into` accepts, the ↩ title mark and the redo verdict.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import vm from 'node:vm';
import { parseRewind } from '../lib/commands.js';
import { DEFAULTS } from '../lib/config.js';
import { checkFreshFork, markedTitle, REWOUND_PREFIX, unmarkedTitle } from '../lib/lineage.js';
import { parseTurn } from '../lib/commands.js';
import { RewindfsService } from '../lib/service.js';
import { registerWebRoutes } from '../lib/web.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');

/** client.js's exports, loaded the way the web shell loads it (a classic script). */
function loadClient() {
  let registration;
  const react = { createElement: (type, props, ...children) => ({ type, props, children }) };
  const window = { __ModuleLoader__: { load: (r) => { registration = r; } } };
  // A classic script with `window` as its only global of note; run in this realm so
  // the objects it returns compare as plain objects.
  const source = readFileSync(join(ROOT, 'client.js'), 'utf8');
  vm.runInThisContext(`(function (window) {\n${source}\n})`, { filename: 'client.js' })(window);
  assert.equal(registration.id, 'rewindfs-dsh');
  const required = [];
  const exports = registration.factory((name) => { required.push(name); return react; });
  assert.deepEqual(required, ['react']);
  return exports;
}

const { logic, apply, inject } = loadClient();

test('package.json declares the client module the web shell serves', () => {
  const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8'));
  assert.equal(pkg.exports['./client'], './client.js');
  assert.equal(pkg.dsh.client.platform, 'web');
  assert.ok(pkg.files.includes('client.js'));
  assert.deepEqual(inject, ['slots', 'sessions']);
});

test('apply registers the turn control, three header controls and two command views', () => {
  const registered = [];
  const ctx = {
    sessions: {},
    slots: { inject: (name, make) => { make(); }, register: (entry, component) => { registered.push([entry.name, entry.id ?? entry.key, typeof component]); return () => {}; } },
  };
  apply(ctx);
  assert.deepEqual(registered, [
    ['conversation.chat.assistant-actions', 'rewindfs-rewind', 'function'],
    ['conversation.chat.commandview', 'rewind', 'function'],
    ['conversation.chat.commandview', 'redo', 'function'],
    ['conversation.session.header.actions', 'rewindfs-unprotected', 'function'],
    ['conversation.session.header.actions', 'rewindfs-undo', 'function'],
    ['conversation.session.header.actions', 'rewindfs-status', 'function'],
  ]);
});

test('the header notice names the unprotected turns in a few words, the reason in full', () => {
  assert.equal(logic.unprotectedText({ session: 's', unprotected: [] }), undefined);
  assert.equal(logic.unprotectedText(undefined), undefined);
  assert.deepEqual(logic.unprotectedText({ session: 's', unprotected: [1], reason: 'not-mounted: /w is not inside a workspace served by rewindfs (run: rewindfs mount <dir>)' }), {
    short: '⚠ rewindfs: turn 1 NOT protected',
    full: 'rewindfs: turn 1 ran NOT protected (its changes cannot be rewound): not-mounted: /w is not inside a workspace served by rewindfs (run: rewindfs mount <dir>)',
  });
  assert.deepEqual(logic.unprotectedText({ session: 's', unprotected: [1, 3] }), {
    short: '⚠ rewindfs: turns 1, 3 NOT protected',
    full: 'rewindfs: turns 1, 3 ran NOT protected (their changes cannot be rewound)',
  });
});

const NODES = [
  { kind: 'user', seq: 3, turn: 1 },
  { kind: 'assistant', seq: 6, turn: 1, messageId: 'm1a' },
  { kind: 'tool-result', seq: 8 },
  { kind: 'assistant', seq: 9, turn: 1, messageId: 'm1b' },
  { kind: 'user', seq: 14, turn: 2 },
  { kind: 'assistant', seq: 17, turn: 2, messageId: 'm2' },
];
const SNAPSHOT = { nodes: NODES, turnEnds: new Map([[1, 11], [2, 19]]) };
const at = (h, m, s) => BigInt(new Date(2026, 11, 2, h, m, s).getTime()) * 1_000_000n;
const POINTS = [
  { epoch: 2, turn: 1, session: 'p', paths: 1, label: 'first', started_ns: Number(at(9, 18, 1)) },
  { epoch: 4, turn: 2, session: 'p', paths: 4, label: 'make it per-tenant', started_ns: Number(at(9, 18, 41)) },
];

test('a message maps to its turn; the fork anchor is the previous turn\'s end', () => {
  assert.deepEqual(logic.turnOfMessage(NODES, 'm2'), { turn: 2, seq: 17, time: undefined });
  assert.equal(logic.turnOfMessage(NODES, 'nope'), undefined);
  assert.equal(logic.forkAnchor(SNAPSHOT, 2), 11);
  // without turnEnds (turn 1's end not in the window): any seq inside turn 1 does
  assert.equal(logic.forkAnchor({ nodes: NODES, turnEnds: new Map() }, 2), 3);
  assert.equal(logic.forkAnchor(SNAPSHOT, 1), undefined);
});

test('the control: tooltip of the point, or disabled with the reason', () => {
  const state = (messageId, extra = {}) => logic.controlState({ snapshot: SNAPSHOT, sessionId: 'p', messageId, points: POINTS, ...extra });
  assert.deepEqual(state('m2'), { turn: 2, enabled: true, atSeq: 11, tooltip: 'rewind to before this turn: turn 2 · 4 files changed · 09:18:41 · make it per-tenant' });
  assert.deepEqual(state('m1b'), { turn: 1, enabled: true, atSeq: undefined,   // the host forks
    tooltip: state('m1b').tooltip });
  assert.match(state('m1b').tooltip, /^rewind to before this turn: turn 1 · /);
  assert.match(state('m2', { points: POINTS.slice(0, 1) }).tooltip, /^turn 2: no rewind point \(this turn ran unprotected/);
  assert.match(state('m2', { points: undefined }).tooltip, /loading/);
  assert.match(state('m2', { pointsError: 'not-mounted: /x is not inside' }).tooltip, /cannot rewind here: not-mounted/);
  assert.equal(state('nope'), null);
  assert.equal(logic.describePoint({ turn: 3, paths: 1, started_ns: Number(at(0, 0, 5)) }), 'turn 3 · 1 file changed · 00:00:05');
});

/** A stub of ctx.sessions whose command replies land in the snapshot, as the host's do. */
function fakeSessions({ running = false, reply = { kind: 'success', text: 'rewindfs: rewound' }, forkError } = {}) {
  const calls = [];
  const listeners = new Set();
  let snapshot = { running, nodes: [{ kind: 'assistant', seq: 20, turn: 2, messageId: 'm2' }] };
  const session = {
    getSnapshot: () => snapshot,
    subscribe: (l) => { listeners.add(l); return () => listeners.delete(l); },
    command: async (line) => {
      calls.push(`command ${line}`);
      const [, name, args] = /^\/(\S+)(.*)$/.exec(line);
      setTimeout(() => {
        snapshot = { ...snapshot, nodes: [...snapshot.nodes, { kind: 'command', seq: 21, name, args, outcome: reply }] };
        for (const l of listeners) l();
      }, 1);
      return { ok: true, value: { matched: true } };
    },
  };
  return {
    calls,
    binding: (id) => (id === 'p' ? { session } : undefined),
    fork: async (opts) => {
      calls.push(`fork ${JSON.stringify(opts)}`);
      if (forkError) throw new Error(forkError);
      return 'child-1';
    },
    open: (id) => calls.push(`open ${id}`),
  };
}

test('picking a turn: fork, then /rewind --into the child in the parent, then open the child', async () => {
  const sessions = fakeSessions();
  const result = await logic.rewindToTurn(sessions, { sessionId: 'p', turn: 2, atSeq: 11 });
  assert.deepEqual(result, { ok: true, child: 'child-1', text: 'rewindfs: rewound' });
  assert.deepEqual(sessions.calls, ['fork {"sessionId":"p","atSeq":11}', 'command /rewind 2 --into child-1', 'open child-1']);
});

test('turn 1: /rewind 1 lets the host fork once, and the child its reply names is opened', async () => {
  const reply = { kind: 'success', text: 'rewindfs: rewound the files to the start of turn 1 — e2: …\nrewindfs: conversation forked before turn 1: continue in session session-7f (session p is unchanged).' };
  const sessions = fakeSessions({ reply });
  const result = await logic.rewindToTurn(sessions, { sessionId: 'p', turn: 1, atSeq: undefined });
  assert.deepEqual(result, { ok: true, child: 'session-7f', text: reply.text });
  assert.deepEqual(sessions.calls, ['command /rewind 1', 'open session-7f'], 'no web fork, one host fork');
  const refused = fakeSessions({ reply: { kind: 'error', text: 'rewindfs: /rewind 1 refused (busy): …' } });
  assert.deepEqual(await logic.rewindToTurn(refused, { sessionId: 'p', turn: 1 }),
    { ok: false, text: 'rewindfs: /rewind 1 refused (busy): …' });
  assert.equal(refused.calls.some((c) => c.startsWith('open')), false);
  assert.equal(logic.childOfReply('no child here'), undefined);
});

test('refusals are shown, and nothing is opened', async () => {
  const busy = fakeSessions({ running: true });
  assert.deepEqual(await logic.rewindToTurn(busy, { sessionId: 'p', turn: 2, atSeq: 11 }), {
    ok: false, text: 'rewindfs: /rewind 2 refused (busy): the agent is running; wait for the turn to finish (or cancel it), then rewind' });
  assert.deepEqual(busy.calls, [], 'a busy agent: not even the fork runs');

  const host = fakeSessions({ reply: { kind: 'error', text: 'rewindfs: /rewind 2 refused (turn-open): turn 3 is open' } });
  const archived = [];
  const refused = await logic.rewindToTurn(host, { sessionId: 'p', turn: 2, atSeq: 11 }, async (id) => { archived.push(id); });
  assert.deepEqual(refused, { ok: false, child: 'child-1', text: 'rewindfs: /rewind 2 refused (turn-open): turn 3 is open\nrewindfs: the fork child-1 made for this rewind was archived' });
  assert.equal(host.calls.some((c) => c.startsWith('open')), false);
  assert.deepEqual(archived, ['child-1'], 'the fork nobody asked for is archived');
  const kept = await logic.rewindToTurn(fakeSessions({ reply: { kind: 'error', text: 'no' } }), { sessionId: 'p', turn: 2, atSeq: 11 },
    async () => { throw new Error('archive-unavailable'); });
  assert.equal(kept.text, 'no\nrewindfs: the fork child-1 made for this rewind is left in the session list (archiving it failed: archive-unavailable)');

  const fork = fakeSessions({ forkError: 'fork-unavailable' });
  const failed = await logic.rewindToTurn(fork, { sessionId: 'p', turn: 2, atSeq: 11 });
  assert.match(failed.text, /^rewindfs: \/rewind 2 refused \(fork-failed\): could not fork session p before turn 2: fork-unavailable$/);
  assert.deepEqual(fork.calls, ['fork {"sessionId":"p","atSeq":11}']);
});

test('a command outcome is the newest matching one after the anchor', () => {
  const nodes = [
    { kind: 'command', seq: 5, name: 'rewind', args: ' status', outcome: { kind: 'success', text: 'old' } },
    { kind: 'command', seq: 9, name: 'rewind', args: ' status', outcome: null },
  ];
  assert.equal(logic.commandOutcome(nodes, 'rewind', 'status', 6), undefined, 'still running');
  assert.deepEqual(logic.commandOutcome(nodes, 'rewind', 'status', 0), undefined, 'the newest one counts');
  assert.deepEqual(logic.commandOutcome(nodes.slice(0, 1), 'rewind', 'status', 0), { kind: 'success', text: 'old' });
});

const ev = (type, data = {}) => ({ type, data });
const SEED = [ev('turn/start', { turn: 1 }), ev('turn/end', { turn: 1 }), ev('session/title')];

test('--into takes only a fresh fork of this session at or before the turn', () => {
  const fork = (header, events) => ({ header: { parentSession: 'p', seedLength: 3, ...header }, events });
  assert.deepEqual(checkFreshFork(fork({}, SEED), 'p', 2), { ok: true });
  assert.deepEqual(checkFreshFork(fork({}, SEED), 'p', 5), { ok: true }, 'earlier than the boundary is fine');
  assert.match(checkFreshFork(fork({ parentSession: 'q' }, SEED), 'p', 2).reason, /not a fork of this session \(its parent is q\)/);
  assert.match(checkFreshFork(fork({}, SEED), 'p', 1).reason, /forked after the start of turn 1/);
  assert.match(checkFreshFork(fork({}, [...SEED, ev('turn/start', { turn: 2 })]), 'p', 2).reason, /not fresh: turn 2 already ran in it/);
  assert.match(checkFreshFork(fork({ seedLength: undefined }, SEED), 'p', 2).reason, /no usable seedLength/);
});

test('the rewound mark goes on once and comes off', () => {
  assert.equal(REWOUND_PREFIX, '↩ ');
  assert.equal(markedTitle('fix auth'), '↩ fix auth');
  assert.equal(markedTitle('↩ fix auth'), '↩ fix auth');
  // no title, nothing to mark: the harness would store "↩ " trimmed, as "↩", for good
  assert.equal(markedTitle(''), '');
  assert.equal(markedTitle(undefined), '');
  assert.equal(unmarkedTitle('↩ fix auth'), 'fix auth');
  assert.equal(unmarkedTitle('fix auth'), 'fix auth');
});

test('point ids are taken verbatim where a turn number is', () => {
  assert.deepEqual(parseTurn('e4'), { point: 'e4' });
  assert.deepEqual(parseRewind('e4 --into b'), { op: 'rewind', turn: 'e4', into: 'b' });
  assert.equal(parseTurn('e').refusal.code, 'bad-turn');
});

test('an existing --into session that is not a fresh fork is refused before any socket call', async () => {
  const logs = {
    other: { header: { id: 'other' }, events: [] },
    stale: { header: { id: 'stale', parentSession: 'p', seedLength: 3 }, events: [...SEED, ev('turn/start', { turn: 2 })] },
  };
  const ctx = { get: (name) => (name === 'sessions' ? { get: (id) => logs[id] } : undefined) };
  const service = new RewindfsService(ctx, { ...DEFAULTS, socket: '/nonexistent/rewindfs.sock' }, { warn() {} });
  const agent = { id: 'p', status: 'idle', session: { header: { cwd: '/' }, events: SEED } };
  assert.deepEqual(await service.rewind(agent, 2, { into: 'other' }), {
    ok: false, refusal: { code: 'session-exists', message: 'session other already exists; pick another name for --into' } });
  assert.deepEqual(await service.rewind(agent, 2, { into: 'stale' }), {
    ok: false, refusal: { code: 'fork-not-fresh', message: 'session stale cannot take this rewind: it is not fresh: turn 2 already ran in it; fork this session before turn 2, or leave out --into' } });
});

test('the host routes answer the service\'s result as JSON; a bad id is a 400', async () => {
  const routes = new Map();
  const web = { register: (route) => { routes.set(route.path, route); return () => routes.delete(route.path); } };
  const asked = [];
  const service = {
    cwdOfSession: () => '/ws',
    points: async (agent) => { asked.push(['points', agent.id, agent.session.header.cwd]); return { ok: true, value: { session: agent.id, points: POINTS } }; },
    redoState: async (id) => { asked.push(['redoState', id]); return { ok: true, value: { session: id, canRedo: true } }; },
    protection: (id) => { asked.push(['protection', id]); return { ok: true, value: { session: id, unprotected: [2] } }; },
  };
  const dispose = registerWebRoutes(web, service);
  const server = createServer((req, res) => routes.get(new URL(req.url, 'http://x').pathname).handler(req, res));
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  const base = `http://127.0.0.1:${server.address().port}`;
  try {
    const points = await (await fetch(`${base}/rewindfs/api/points?session=p`)).json();
    assert.equal(points.value.points.length, 2);
    assert.deepEqual(await (await fetch(`${base}/rewindfs/api/redo-state?session=c`)).json(), { ok: true, value: { session: 'c', canRedo: true } });
    const bad = await fetch(`${base}/rewindfs/api/points?session=..%2Fx`);
    assert.equal(bad.status, 400);
    assert.equal((await bad.json()).refusal.code, 'bad-session');
    assert.deepEqual(await (await fetch(`${base}/rewindfs/api/protection?session=c`)).json(), { ok: true, value: { session: 'c', unprotected: [2] } });
    assert.deepEqual(asked, [['points', 'p', '/ws'], ['redoState', 'c'], ['protection', 'c']]);
  } finally {
    server.close();
  }
  dispose();
  assert.equal(routes.size, 0);
});
