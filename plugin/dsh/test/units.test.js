// Config validation, argument parsing, fork cut and reply texts.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { parseRewind, renderPoints, renderRefusal } from '../lib/commands.js';
import { Config, DEFAULTS, validateConfig } from '../lib/config.js';
import { forkCut, labelOf, turnsOf } from '../lib/fork.js';
import { parseTurn } from '../lib/commands.js';

test('config: defaults, accepted values, refusals that name the key', () => {
  assert.deepEqual(validateConfig(undefined).value, { ...DEFAULTS });
  assert.equal(validateConfig({ turnTimeoutMs: 500 }).value.turnTimeoutMs, 500);
  const bad = Config['~standard'].validate({ turnTimout: 5 });
  assert.equal(bad.issues.length, 1);
  assert.match(bad.issues[0].message, /unknown config key "turnTimout" \(known: store, socket, turnTimeoutMs, callTimeoutMs, enabled, remote\)/);
  assert.match(validateConfig({ turnTimeoutMs: 0 }).issues[0].message, /turnTimeoutMs=0 must be an integer from 1 to 60000/);
  assert.match(validateConfig({ enabled: 'yes' }).issues[0].message, /enabled="yes" must be true or false/);
  assert.match(validateConfig({ socket: 'rel.sock' }).issues[0].message, /absolute socket path/);
  assert.match(validateConfig([1]).issues[0].message, /must be a mapping/);
  assert.equal(validateConfig({ remote: 'origin' }).value.remote, 'origin');
  for (const bad of ['', 'a b', '-x', 7, 'x'.repeat(65)]) {
    assert.match(validateConfig({ remote: bad }).issues[0].message, /^rewindfs: config remote=.* must be a remote's name/, String(bad));
  }
});

test('turn arguments: absolute numbers only', () => {
  assert.deepEqual(parseTurn('3'), { turn: 3 });
  // the CLI's spelling of a turn (`rewindfs rewind t3`, `rewindfs log` prints it)
  assert.deepEqual(parseTurn('t3'), { turn: 3 });
  assert.deepEqual(parseTurn('T3'), { turn: 3 });
  for (const rel of ['-1', '~1', 'HEAD~1', 'head', 'prev', 'previous', 'last', '+2', '^']) {
    assert.equal(parseTurn(rel).refusal.code, 'relative-point', rel);
  }
  for (const bad of ['0', 'two', '1.5', '1e3', '99999999999999999999', 't', 't0', 't-1', 'tt3', 't3x']) {
    assert.equal(parseTurn(bad).refusal.code, 'bad-turn', bad);
  }
});

test('/rewind input forms', () => {
  assert.deepEqual(parseRewind(''), { op: 'list' });
  assert.deepEqual(parseRewind('  status '), { op: 'status' });
  assert.deepEqual(parseRewind(' 2'), { op: 'rewind', turn: 2 });
  assert.deepEqual(parseRewind('2 --into my-branch'), { op: 'rewind', turn: 2, into: 'my-branch' });
  assert.equal(parseRewind('2 --into').refusal.code, 'usage');
  assert.equal(parseRewind('status now').refusal.code, 'usage');
  assert.equal(parseRewind('-1').refusal.code, 'relative-point');
});

const ev = (type, data = {}) => ({ type, data });
const LOG = [
  ev('permission/preset'), ev('agent/inbox/spliced'), ev('turn/start', { turn: 1 }), ev('step/start'),
  ev('user/message'), ev('step/end'), ev('turn/end', { turn: 1 }), ev('session/title'), ev('command/run'),
  ev('command/done'), ev('agent/inbox/spliced'), ev('turn/start', { turn: 2 }), ev('turn/end', { turn: 2 }),
];

test('fork cut: history before the turn\'s prompt, between-turn events kept', () => {
  assert.deepEqual(forkCut(LOG, 2), { cut: 10 });
  assert.deepEqual(forkCut(LOG, 1), { cut: 1 });
  assert.deepEqual(forkCut(LOG, 3), { missing: true, turns: [1, 2] });
  assert.deepEqual(turnsOf(LOG), [1, 2]);
});

test('label: first non-empty line of the first user message', () => {
  const msg = (text, kind = 'user') => ({ role: 'user', source: { kind }, content: [{ type: 'text', text }] });
  assert.equal(labelOf([msg('context', 'runtime'), msg('\nfix the bug\nplease')]), 'fix the bug');
  assert.equal(labelOf([]), '');
});

test('texts', () => {
  assert.match(renderPoints({ session: 's', points: [] }), /^rewindfs: no points yet for session s/);
  const text = renderPoints({ session: 's', points: [{ turn: 1, started_ns: 0, paths: 3, label: 'go', session: 's' }, { turn: 2, started_ns: 0, paths: 1, label: 'x', session: 'p' }] });
  assert.match(text, /turn 1 {2}\d{4}-\d\d-\d\d \d\d:\d\d:\d\d {2}3 files changed {2}go$/m);
  assert.match(text, /turn 2 .* 1 file changed {2}x {2}\(from p\)$/m);
  assert.equal(renderRefusal({ code: 'busy', message: 'm' }, '/redo'), 'rewindfs: /redo refused (busy): m');
});
