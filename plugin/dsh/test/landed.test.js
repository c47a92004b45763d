// What a rewind undid beyond the session's own turns (the daemon's `foreign` paths:
// a person's edits between turns, another session's turns) and what it could not
// restore: said in the /rewind reply, and in the header of the session the web UI's
// rewind control lands in (service.redoState's `landed`), where the reply is not shown.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { landedNotice, renderRewind } from '../lib/commands.js';
import { DEFAULTS } from '../lib/config.js';
import { RewindfsService } from '../lib/service.js';
import { scripted } from './scripted.js';

const between = (path, epoch = 7) => ({ path, epoch, kind: 'idle', session: null, turn: null });
const otherTurn = (path) => ({ path, epoch: 8, kind: 'turn', session: 'other', turn: 3 });

test('the /rewind reply names what it undid outside the session and how to get it back', () => {
  const text = renderRewind({
    turn: 2, target: 4, child: 'c', parent: 'p', written: 2, created: 0, deleted: 0, epoch: 9,
    foreign: [between('notes.txt'), between('b.txt', 5), otherTurn('x.py')],
  });
  const lines = text.split('\n');
  assert.ok(lines.includes('rewindfs: it also undid edits between turns: notes.txt, b.txt'), text);
  assert.ok(lines.includes('rewindfs: it also undid turn 3 of session other: x.py'), text);
  assert.ok(lines.includes('rewindfs: /redo in session c brings them back'), text);
  assert.ok(!renderRewind({ turn: 2, target: 4, child: 'c', parent: 'p', foreign: [] }).includes('also undid'));
});

test('the header notice: nothing for a clean rewind, short text and the full lines otherwise', () => {
  assert.equal(landedNotice({ turn: 2, foreign: [], failed: [], stopped: [] }), undefined);
  const one = landedNotice({ turn: 2, foreign: [between('notes.txt')], failed: [] });
  assert.equal(one.short, "⚠ the rewind also undid 1 change made outside this session's turns: notes.txt");
  assert.deepEqual(one.full.split('\n'), [
    'rewindfs: it also undid edits between turns: notes.txt',
    'rewindfs: ↻ undo rewind brings them back',
  ]);
  const many = landedNotice({
    turn: 2, foreign: ['a', 'b', 'c'].map((p) => between(p)),
    failed: [{ path: 'held.log', code: 'busy', message: 'open for writing by pid 7' }],
  });
  assert.equal(many.short, "⚠ the rewind also undid 3 changes made outside this session's turns: a, b and 1 more; "
    + '1 path NOT restored: held.log');
  assert.ok(many.full.includes('rewindfs: NOT restored: held.log: open for writing by pid 7'), many.full);
});

test('redoState carries the notice of the rewind that landed there, while it can be undone', async () => {
  let top = 9;
  const daemon = async (req) => {
    if (req.method === 'redo.state') return { can_redo: top !== undefined, rewind: top };
    return {};
  };
  await scripted(daemon, async (path) => {
    const service = new RewindfsService({ get: () => undefined }, { ...DEFAULTS, socket: path }, { warn: () => {} });
    service.noteLanded('child', { epoch: 9, turn: 2, foreign: [between('notes.txt')], failed: [] });
    const landed = (await service.redoState('child')).value.landed;
    assert.equal(landed?.short, "⚠ the rewind also undid 1 change made outside this session's turns: notes.txt");
    top = 12;       // another rewind landed on top of it: not this notice any more
    assert.equal((await service.redoState('child')).value.landed, undefined);
    top = undefined;
    assert.equal((await service.redoState('child')).value.landed, undefined);
  });
});

test('a /redo where a rewind landed says which stopped jobs it does not restart', async () => {
  const job = { turn: 2, command: 'sleep 4', job: 'bash-1' };
  await scripted(async () => ({ epoch: 11, written: 1, created: 0, deleted: 0 }), async (path) => {
    const service = new RewindfsService({ get: () => undefined }, { ...DEFAULTS, socket: path }, { warn: () => {} });
    const agent = { id: 'child', session: { header: {} } };
    service.noteLanded('child', { epoch: 9, turn: 2, foreign: [], failed: [], stopped: [job] });
    const redo = await service.redo(agent);
    assert.deepEqual(redo.value.notRestarted, { turn: 2, stopped: [job] });
    service.noteLanded('child', { epoch: 12, turn: 3, foreign: [], failed: [], stopped: [] });
    assert.equal((await service.redo(agent)).value.notRestarted, undefined);
  });
});
