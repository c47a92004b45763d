// `/rewind own`: a session a rewind took away from gets its own files back.  Where its
// files are comes from the workspace's state tree (the daemon's `history` nodes: each
// epoch under the state it started from); the service rewinds to the point the
// newest rewind that left them found, owned by the session, and moves the ↩ marks.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { parseRewind, renderOwn } from '../lib/commands.js';
import { DEFAULTS } from '../lib/config.js';
import { filesOwnerUndoneTo, ownFiles } from '../lib/lineage.js';
import { RewindfsService } from '../lib/service.js';
import { scripted } from './scripted.js';

const turn = (epoch, session, n, parent) => ({ epoch, kind: 'turn', session, turn: n, parent, target: null });
const rewind = (epoch, owner, target, parent) => ({ epoch, kind: 'rewind', session: owner, turn: null, parent, target });
const current = (nodes) => nodes.map((n, i) => ({ ...n, current: i === nodes.length - 1 }));

// p ran turns 1 and 2; ↺ on turn 2 landed in fork c (e4, to the start of e3), which ran
// its own turn 2 (e5, a sibling of p's turn 2)
const FORKED = [
  { epoch: 1, kind: 'idle', session: null, turn: null, parent: null, target: null },
  turn(2, 'p', 1, 1), turn(3, 'p', 2, 2), rewind(4, 'c', 3, 3), turn(5, 'c', 2, 2),
];

test("a session's own files: left by the rewind that started from them, or here", () => {
  assert.deepEqual(ownFiles(current(FORKED), 'p'), { left: 4, turn: 2, from: 'c' });
  assert.deepEqual(ownFiles(current(FORKED), 'c'), { current: true, turn: 2 });
  assert.deepEqual(ownFiles(current(FORKED), 'nobody'), { none: true });
  // right after the rewind (c ran nothing yet): p's files are away, c's state is p's turn 1
  assert.deepEqual(ownFiles(current(FORKED.slice(0, 4)), 'p'), { left: 4, turn: 2, from: 'p' });
  // p went back (e6: to the point e4 found); now c's are away, left by e6
  const back = current([...FORKED, rewind(6, 'p', 4, 5)]);
  assert.deepEqual(ownFiles(back, 'p'), { current: true, turn: 2 });
  assert.deepEqual(ownFiles(back, 'c'), { left: 6, turn: 2, from: 'p' });
  // a redo of e6 (c's files again) is c's state once more
  const redone = current([...back, { ...rewind(7, 'p', 6, 3), kind: 'redo' }]);
  assert.deepEqual(ownFiles(redone, 'c'), { current: true, turn: 2 });
  assert.deepEqual(ownFiles(redone, 'p'), { left: 7, turn: 2, from: 'c' });
});

test("another session's turns built on this one's files: they are still here", () => {
  const shared = current([...FORKED.slice(0, 3), turn(4, 'q', 1, 3), { ...FORKED[0], epoch: 5, parent: 4 }]);
  assert.deepEqual(ownFiles(shared, 'p'), { current: true, turn: 2 });
});

test('a redo of a /rewind own gives the files back to the session that one left', () => {
  const nodes = current([...FORKED, rewind(6, 'p', 4, 5)]);
  assert.equal(filesOwnerUndoneTo(nodes, 6), 'c');
  assert.equal(filesOwnerUndoneTo(nodes, 4), undefined);   // a rewind to a turn: the fork's parent
  assert.equal(filesOwnerUndoneTo(nodes, 99), undefined);
});

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
  let nodes = current(FORKED);
  const calls = [];
  const daemon = async (req) => {
    calls.push([req.method, req.params]);
    if (req.method === 'history') return { nodes };
    if (req.method === 'rewind') {
      nodes = current([...nodes, rewind(6, 'p', 4, 5)]);
      return { epoch: 6, written: 1, created: 1, deleted: 1, foreign: [] };
    }
    if (req.method === 'redo') {
      nodes = current([...nodes, { ...rewind(7, 'p', 6, 3), kind: 'redo' }]);
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
    assert.deepEqual([titles.get('p'), titles.get('c')], ['work', '↩ work']);
    assert.equal((await service.rewindOwn(agent)).refusal.code, 'files-here');
    // /redo in p undoes it: c's files back, the marks change places again
    const redo = await service.redo(agent);
    assert.ok(redo.ok, JSON.stringify(redo));
    assert.deepEqual([titles.get('p'), titles.get('c')], ['↩ work', 'work']);
    assert.equal((await service.rewindOwn({ id: 'q', session: { header: {} } })).refusal.code, 'no-own-files');
  });
});

test('/redo with nothing to redo in a session rewound away points at /rewind own', async () => {
  const daemon = async (req) => {
    if (req.method === 'history') return { nodes: current(FORKED) };
    if (req.method === 'redo') return { error: { code: 'nothing-to-redo', message: 'nothing to redo of session p' } };
    if (req.method === 'redo.state') return { can_redo: false, rewind: null, reason: 'nothing to redo' };
    return {};
  };
  await scripted(daemon, async (path, seen) => {
    const titles = new Map([['p', 'work']]);
    const service = serviceWith(path, titles);
    const r = await service.redo({ id: 'p', session: service.sessionNamed('p') });
    assert.equal(r.refusal.code, 'nothing-to-redo');
    assert.match(r.refusal.message, /this session's own files were rewound away: \/rewind own puts them back$/);
    // the header asks the history only for a session marked ↩ (it may be megabytes)
    const asked = () => seen.filter((req) => req.method === 'history').length;
    const before = asked();
    assert.equal((await service.redoState('p')).value.own, undefined);
    assert.equal(asked(), before);
    titles.set('p', '↩ work');
    assert.deepEqual((await service.redoState('p')).value.own, { left: 4, from: 'c' });
  });
});
