// The service's turn bookkeeping against a scripted socket (no harness): ordering of
// turn.begin/turn.end, a begin that lands after its timeout, the once-only notice,
// and refusals that need no daemon.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { DEFAULTS } from '../lib/config.js';
import { RewindfsService } from '../lib/service.js';
import { scripted } from './scripted.js';

/** The scripted daemon, keeping each request as `method turn`. */
function scriptedCalls(handle, body) {
  return scripted(handle, body, (req) => `${req.method}${req.params.turn ? ` ${req.params.turn}` : ''}`);
}

function service(socket, overrides = {}) {
  const notices = [];
  const ctx = { get: () => undefined };
  const svc = new RewindfsService(ctx, { ...DEFAULTS, socket, ...overrides }, { warn: (t) => notices.push(t) });
  return { svc, notices };
}

const agent = (id, status = 'idle') => ({ id, status, session: { header: { cwd: '/' }, events: [] } });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

test('begin once per turn, end after begin, drained on flush', async () => {
  await scriptedCalls(async () => ({ epoch: 1 }), async (path, calls) => {
    const { svc, notices } = service(path);
    const a = agent('s1');
    await svc.beginTurn(a, 1, 'x');
    await svc.beginTurn(a, 1, 'x'); // a later step of the same turn
    svc.endTurn('s1', 1);
    svc.endTurn('s1', 1); // duplicate event: no second end
    await svc.drainSession('s1');
    assert.deepEqual(calls, ['turn.begin 1', 'turn.end']);
    assert.deepEqual(notices, []);
  });
});

test('a begin slower than turnTimeoutMs: unprotected notice once, end still sent when it lands', async () => {
  let release;
  const gate = new Promise((r) => { release = r; });
  await scriptedCalls(async (req) => {
    if (req.method === 'turn.begin' && req.params.turn === 1) await gate;
    return { epoch: 1 };
  }, async (path, calls) => {
    const { svc, notices } = service(path, { turnTimeoutMs: 30 });
    const a = agent('s2');
    await svc.beginTurn(a, 1, 'slow'); // returns after ~30 ms; the call goes on
    assert.equal(notices.length, 1);
    assert.match(notices[0], /^rewindfs: turn 1 of session s2 is NOT protected \(files it changes cannot be rewound\): no reply to turn\.begin within 30 ms$/);
    svc.endTurn('s2', 1); // the turn ended before the begin landed
    release();
    await sleep(20);
    await svc.drainSession('s2');
    assert.deepEqual(calls, ['turn.begin 1', 'turn.end']);
  });
});

test('no daemon: every turn runs, the user is told once per session', async () => {
  const { svc, notices } = service('/nonexistent-rewindfs/none.sock');
  const a = agent('s3');
  await svc.beginTurn(a, 1, 'a');
  await svc.beginTurn(a, 2, 'b');
  svc.endTurn('s3', 1);
  await svc.drain();
  assert.equal(notices.length, 1);
  assert.match(notices[0], /turn 1 of session s3 is NOT protected .*daemon-unreachable|no rewindfs daemon answers/);
  // the web UI's header asks which turns ran unprotected, and why (stderr never reaches it)
  const prot = svc.protection('s3');
  assert.deepEqual(prot.value.unprotected, [1, 2]);
  assert.match(prot.value.reason, /^[a-z-]+: /);
  assert.deepEqual(svc.protection('never-seen'), { ok: true, value: { session: 'never-seen', unprotected: [] } });
  const status = await svc.status(a);
  assert.equal(status.ok, false);
  assert.equal(status.refusal.code, 'daemon-unreachable');
});

test('refusals before any socket call', async () => {
  const { svc } = service('/nonexistent-rewindfs/none.sock');
  assert.deepEqual((await svc.rewind(agent('s4', 'running'), 1)).refusal.code, 'busy');
  assert.deepEqual((await svc.redo(agent('s4', 'running'))).refusal.code, 'busy');
  assert.equal((await svc.rewind(agent('s4'), 1, { into: '../x' })).refusal.code, 'bad-session');
  const missing = await svc.rewind(agent('s4'), 3);
  assert.deepEqual(missing, { ok: false, refusal: { code: 'unknown-point', message: 'session s4 has no turn 3 (turns: none yet)' } });
});

test('another session holds the turn: the refusal is the notice, no end is sent', async () => {
  const refusal = { code: 'turn-open', message: 'Turn 4 of session other is still open; end it first or pass --force.' };
  await scriptedCalls(async (req) => (req.method === 'turn.begin' ? { error: refusal } : {}), async (path, calls) => {
    const { svc, notices } = service(path);
    await svc.beginTurn(agent('s5'), 1, 'x');
    svc.endTurn('s5', 1);
    await svc.drainSession('s5');
    assert.deepEqual(calls, ['turn.begin 1']); // never ends the other session's turn
    assert.equal(notices.length, 1);
    assert.match(notices[0], /turn 1 of session s5 is NOT protected .*Turn 4 of session other is still open/);
  });
});

test('a dead daemon\'s socket: the refusal says what brings the workspace back', async () => {
  // A socket file nobody listens on, as kill -9 of the daemon leaves it: the notice
  // and the web UI's tooltip said only "no rewindfs daemon answers on …: ECONNREFUSED".
  const dir = mkdtempSync(join(tmpdir(), 'rwdead-'));
  const sock = join(dir, 'dead.sock');
  try {
    execFileSync('python3', ['-c', 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])', sock]);
    const { svc, notices } = service(sock);
    await svc.beginTurn({ ...agent('s9'), session: { header: { cwd: dir }, events: [] } }, 1, 'a');
    assert.equal(notices.length, 1);
    assert.match(notices[0], /ECONNREFUSED \(the daemon serving .*rwdead-\S+ is gone: `rewindfs mount --recover .*rwdead-\S+` brings the workspace back\)$/);
    assert.match(svc.protection('s9').value.reason, /^daemon-unreachable: .*mount --recover/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
