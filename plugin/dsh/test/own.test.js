// `/rewind own`: a session a rewind took away from gets its own files back.  Where its
// files are is the daemon's answer (`own.state`, from the workspace's state tree; its
// rule is tested in tests/unit/test_own_files.py on a real store, the whole path in
// tests/e2e/test_web_ui_own.py in Chromium).  Here: what the service does with the
// answer — the rewind it asks for, the refusals, the ↩ marks it moves.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { parseRewind, renderOwn } from '../lib/commands.js';
import { DEFAULTS } from '../lib/config.js';
import { RewindfsService } from '../lib/service.js';
import { scripted } from './scripted.js';

const here = (turn) => ({ state: 'here', turn, left: null, holder: null });
const away = (turn, left, holder) => ({ state: 'away', turn, left, holder });
const none = { state: 'none', turn: null, left: null, holder: null };

test('/rewind own parses, takes no arguments, and its reply says how to undo it', () => {
  assert.deepEqual(parseRewind(' own '), { op: 'own' });
  assert.equal(parseRewind('own now').refusal.code, 'usage');
  const text = renderOwn({ turn: 2, left: 4, from: 'c', written: 1, created: 1, deleted: 1,
    foreign: [{ path: 'fork.txt', kind: 'turn', session: 'c', turn: 2 }] });
  assert.deepEqual(text.split('\n'), [
    "rewindfs: this session's own files are back (as its turn 2 left them, point e4): 2 paths restored (1 re-created, 1 rewritten), 1 deleted.",
    "rewindfs: /redo here undoes this, putting session c's files back; no conversation changed.",
    'rewindfs: it also undid turn 2 of session c: fork.txt',
    'rewindfs: /redo here brings them back',
  ]);
});

test("/rewind own's reply names the other session's work it stopped", () => {
  const text = renderOwn({ turn: 2, left: 4, from: 'c', written: 1, created: 0, deleted: 0,
    stopped: [{ turn: 2, command: 'npm run dev', pgid: 4242, session: 'c' }] });
  assert.deepEqual(text.split('\n').slice(2), [
    'rewindfs: stopped 1 background job started in turn 2 of session c: npm run dev (process group 4242)',
    'rewindfs: /redo restores files only; it cannot restart that job.',
  ]);
});

function serviceWith(path, titles) {
  const sessions = new Map(['p', 'c'].map((id) => [id, { id, header: { id } }]));
  const ctx = {
    get: (name) => ({
      sessions,
      sessionTitle: { get: (s) => ({ title: titles.get(s.id) }), rename: (s, t) => titles.set(s.id, t) },
    })[name],
  };
  return new RewindfsService(ctx, { ...DEFAULTS, socket: path }, { warn: () => {} });
}

test('/rewind own rewinds to the point, owned by the session, and moves the marks', async () => {
  // p's turn 2 was left by rewind e4 (into fork c, which ran its own turn 2)
  let states = { p: away(2, 4, 'c'), c: here(2) };
  const calls = [];
  const daemon = async (req) => {
    calls.push([req.method, req.params]);
    if (req.method === 'own.state') return { sessions: Object.fromEntries(req.params.sessions.map((s) => [s, states[s] ?? none])) };
    if (req.method === 'rewind') {
      states = { p: here(2), c: away(2, 6, 'p') };
      return { epoch: 6, written: 1, created: 1, deleted: 1, foreign: [] };
    }
    if (req.method === 'redo') {
      states = { p: away(2, 7, 'c'), c: here(2) };
      return { epoch: 7, undid: 6, written: 1, created: 1, deleted: 1 };
    }
    return {};
  };
  await scripted(daemon, async (path) => {
    const titles = new Map([['p', '↩ work'], ['c', 'work']]);
    const service = serviceWith(path, titles);
    const agent = { id: 'p', session: service.sessionNamed('p') };
    const r = await service.rewindOwn(agent);
    assert.ok(r.ok, JSON.stringify(r));
    assert.deepEqual(calls.find(([m]) => m === 'rewind')[1], { to: 'e4', session: 'p', undo_for: 'p' });
    assert.equal(r.value.from, 'c');
    assert.deepEqual([titles.get('p'), titles.get('c')], ['work', '↩ work']);
    assert.equal((await service.rewindOwn(agent)).refusal.code, 'files-here');
    // /redo in p undoes it: c's files back, the marks change places again
    const redo = await service.redo(agent);
    assert.ok(redo.ok, JSON.stringify(redo));
    assert.deepEqual([titles.get('p'), titles.get('c')], ['↩ work', 'work']);
    assert.equal((await service.rewindOwn({ id: 'q', session: { header: {} } })).refusal.code, 'no-own-files');
    // one request per question, the sessions asked together
    assert.ok(calls.filter(([m]) => m === 'own.state').every(([, p]) => p.sessions.length >= 1));
    assert.equal(calls.filter(([m]) => m === 'history').length, 0);
  });
});

test('/rewind own where no point holds the files any more is refused and changes nothing', async () => {
  const calls = [];
  const daemon = async (req) => {
    calls.push(req.method);
    if (req.method === 'own.state') return { sessions: { p: away(2, null, 'c') } };
    return {};
  };
  await scripted(daemon, async (path) => {
    const titles = new Map([['p', '↩ work']]);
    const service = serviceWith(path, titles);
    const r = await service.rewindOwn({ id: 'p', session: service.sessionNamed('p') });
    assert.equal(r.refusal.code, 'no-own-files');
    assert.match(r.refusal.message, /no point holds the files of this session's turn 2/);
    assert.deepEqual(calls, ['own.state']);
    assert.equal(titles.get('p'), '↩ work');
  });
});

test('/redo with nothing to redo in a session rewound away points at /rewind own', async () => {
  const daemon = async (req) => {
    if (req.method === 'own.state') return { sessions: { p: away(2, 4, 'c') } };
    if (req.method === 'redo') return { error: { code: 'nothing-to-redo', message: 'nothing to redo of session p' } };
    if (req.method === 'redo.state') return { can_redo: false, rewind: null, reason: 'nothing to redo' };
    return {};
  };
  await scripted(daemon, async (path) => {
    const titles = new Map([['p', 'work']]);
    const service = serviceWith(path, titles);
    const r = await service.redo({ id: 'p', session: service.sessionNamed('p') });
    assert.equal(r.refusal.code, 'nothing-to-redo');
    assert.match(r.refusal.message, /this session's own files were rewound away: \/rewind own puts them back$/);
    // its header offers the way back
    assert.deepEqual((await service.redoState('p')).value.own, { left: 4, from: 'c' });
  });
});

/** A daemon answering a header's two questions: nothing to redo; `where` for own.state. */
function headerDaemon(where) {
  return async (req) => {
    if (req.method === 'own.state') return { sessions: where };
    if (req.method === 'redo.state') return { can_redo: false, rewind: null, reason: 'nothing to redo' };
    return {};
  };
}

test('a session whose files went away while it was not attached is marked ↩ when it is looked at', async () => {
  // a `rewindfs rewind`, another session's /rewind own, or a server stopped before it
  // marked anything: the daemon says where the files are, the mark follows
  await scripted(headerDaemon({ c: away(2, 6, 'p') }), async (path) => {
    const titles = new Map([['p', 'work'], ['c', 'work']]);
    const service = serviceWith(path, titles);
    const state = (await service.redoState('c')).value;
    assert.deepEqual(state.own, { left: 6, from: 'p' });
    assert.equal(titles.get('c'), '↩ work');
    assert.equal(titles.get('p'), 'work');
  });
});

test('a session without a title whose files went away gets no title of "↩" alone, and its header still offers the way back', async () => {
  await scripted(headerDaemon({ c: away(2, 6, 'p') }), async (path) => {
    const titles = new Map([['p', 'work']]);       // c: no title (its first prompt gave none)
    const service = serviceWith(path, titles);
    assert.deepEqual((await service.redoState('c')).value.own, { left: 6, from: 'p' });
    assert.equal(titles.has('c'), false);
  });
});

test('a ↩ mark left behind while the session was not attached goes when it is looked at', async () => {
  await scripted(headerDaemon({ p: here(2) }), async (path) => {
    const titles = new Map([['p', '↩ work']]);
    const service = serviceWith(path, titles);
    const state = (await service.redoState('p')).value;
    assert.equal(state.own, undefined);
    assert.equal(titles.get('p'), 'work');
  });
});

test('/rewind own takes its own mark off even when the daemon cannot say where files are after it', async () => {
  let asked = 0;
  const daemon = async (req) => {
    if (req.method === 'own.state') {
      asked += 1;
      return asked === 1 ? { sessions: { p: away(2, 4, 'c') } } : { error: { code: 'internal', message: 'gone wrong' } };
    }
    if (req.method === 'rewind') return { epoch: 6, written: 1, created: 0, deleted: 0, foreign: [] };
    return {};
  };
  await scripted(daemon, async (path) => {
    const titles = new Map([['p', '↩ work'], ['c', 'work']]);
    const service = serviceWith(path, titles);
    const r = await service.rewindOwn({ id: 'p', session: service.sessionNamed('p') });
    assert.ok(r.ok, JSON.stringify(r));
    assert.equal(titles.get('p'), 'work');
  });
});
