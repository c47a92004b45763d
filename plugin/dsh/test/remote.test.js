// Config `remote`: the push queued after each turn.end, and /rewind of a point made on
// another machine learning the pushed history first — against a scripted socket (the
// daemon's side is tested for real in tests/mount/test_remote_learn_mount.py).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { renderRewind, renderStatus } from '../lib/commands.js';
import { DEFAULTS } from '../lib/config.js';
import { RewindfsService } from '../lib/service.js';
import { scripted } from './scripted.js';

function service(socket, overrides = {}, ctx = { get: () => undefined }) {
  const notices = [];
  const svc = new RewindfsService(ctx, { ...DEFAULTS, socket, ...overrides }, { warn: (t) => notices.push(t) });
  return { svc, notices };
}

const EVENTS = [
  { type: 'turn/start', data: { turn: 1 } }, { type: 'turn/end', data: { turn: 1 } },
  { type: 'turn/start', data: { turn: 2 } }, { type: 'turn/end', data: { turn: 2 } },
  { type: 'turn/start', data: { turn: 3 } }, { type: 'turn/end', data: { turn: 3 } },
];
const agent = (id) => ({ id, status: 'idle', session: { header: { cwd: '/' }, events: EVENTS } });
const methods = (requests) => requests.map((r) => r.method);

test('each turn.end is followed by a push to the remote, never awaited by the turn', async () => {
  await scripted(async (req) => (req.method === 'push' ? { queued: true, pending: 1 } : { epoch: 1 }), async (path, requests) => {
    const { svc, notices } = service(path, { remote: 'origin' });
    await svc.beginTurn(agent('s1'), 1, 'x');
    svc.endTurn('s1', 1);
    await svc.drainSession('s1');
    assert.deepEqual(methods(requests), ['turn.begin', 'turn.end', 'push']);
    assert.deepEqual(requests[2].params, { remote: 'origin', wait: false });
    assert.deepEqual(notices, []);
  });
});

test('without a remote no push is sent', async () => {
  await scripted(async () => ({ epoch: 1 }), async (path, requests) => {
    const { svc } = service(path);
    await svc.beginTurn(agent('s1'), 1, 'x');
    svc.endTurn('s1', 1);
    await svc.drainSession('s1');
    assert.deepEqual(methods(requests), ['turn.begin', 'turn.end']);
  });
});

test('a refused push is told once and fails no turn', async () => {
  const refusal = { code: 'unknown-method', message: "Unknown method 'push'." };
  await scripted(async (req) => (req.method === 'push' ? { error: refusal } : { epoch: 1 }), async (path, requests) => {
    const { svc, notices } = service(path, { remote: 'origin' });
    for (const turn of [1, 2]) {
      await svc.beginTurn(agent('s1'), turn, 'x');
      svc.endTurn('s1', turn);
      await svc.drainSession('s1');
    }
    assert.deepEqual(methods(requests), ['turn.begin', 'turn.end', 'push', 'turn.begin', 'turn.end', 'push']);
    assert.deepEqual(notices, ['rewindfs: turns are not pushed to remote origin (unknown-method): this rewindfs daemon cannot push in the background (run `rewindfs push` by hand)']);
    const status = await svc.status(agent('s1'));
    assert.match(renderStatus(status.value), /rewindfs: remote origin: pushed after each turn, .*NOT pushed: the daemon refused \(unknown-method\)/);
  });
});

/** A daemon that knows no point of s1 until remote.learn has run. */
function learningDaemon(learnRefusal) {
  let learned = false;
  return async (req) => {
    switch (req.method) {
      case 'points':
        return { points: learned ? [{ epoch: 12, kind: 'turn', session: 's1', turn: 2, label: 'grow' }] : [] };
      case 'remote.learn':
        if (learnRefusal) return { error: learnRefusal };
        learned = true;
        return { remote: 'origin', remote_workspace: 'abc123', epochs: 9, head_epoch: 19, epoch: 20, absent: 1, problems: [] };
      case 'rewind':
        return req.params.dry_run ? { dry_run: true } : { epoch: 21, target: 12, written: 2, created: 1, deleted: 1, target_point: { label: 'grow' } };
      default:
        return {};
    }
  };
}

function forkingCtx() {
  return {
    get: () => undefined,
    agents: { create: async () => ({ agent: { session: {} }, dispose: async () => {} }) },
  };
}

test('/rewind of a point made elsewhere: remote.learn, then the rewind, and the reply says so', async () => {
  await scripted(learningDaemon(), async (path, requests) => {
    const { svc } = service(path, { remote: 'origin' }, forkingCtx());
    const r = await svc.rewind(agent('s1'), 2, { into: 'child-1' });
    assert.equal(r.ok, true, JSON.stringify(r));
    assert.deepEqual(methods(requests), ['points', 'remote.learn', 'points', 'rewind', 'fork', 'rewind']);
    assert.deepEqual(requests[1].params, { remote: 'origin', session: 's1' });
    assert.deepEqual(requests[5].params, { to: 'e12', session: 's1', undo_for: 'child-1' });
    const text = renderRewind(r.value);
    assert.match(text.split('\n')[0], /^rewindfs: learned the history from remote origin \(workspace abc123, 9 epochs\); no file changed by that — this directory as it was is point e20, the pushed tree e19\.$/);
    assert.match(text, /rewound the files to the start of turn 2 — grow — e12/);
  });
});

test('/rewind of an unknown point without a remote learns nothing', async () => {
  await scripted(learningDaemon(), async (path, requests) => {
    const { svc } = service(path, {}, forkingCtx());
    const r = await svc.rewind(agent('s1'), 2);
    assert.equal(r.refusal.code, 'unknown-point');
    assert.deepEqual(methods(requests), ['points']);
  });
});

test('a learning the daemon refuses leaves the point unknown and says why', async () => {
  const refusal = { code: 'learn-target-has-history', message: 'Cannot learn a remote history into /w: this store has history for it.' };
  await scripted(learningDaemon(refusal), async (path, requests) => {
    const { svc } = service(path, { remote: 'origin' }, forkingCtx());
    const r = await svc.rewind(agent('s1'), 2);
    assert.equal(r.refusal.code, 'unknown-point');
    assert.match(r.refusal.message, /not learned from remote origin: Cannot learn a remote history into \/w: .* \(learn-target-has-history\)$/);
    assert.deepEqual(methods(requests), ['points', 'remote.learn']);
  });
});

test('a ↺ rewind whose daemon dies after it was sent says it may have landed, and what finishes or undoes it', async () => {
  // the intent is in the store before the first path lands (the daemon's side:
  // tests/e2e/test_plugin_killed_rewind.py); the plugin cannot know how far it got
  const daemon = async (req, conn) => {
    if (req.method === 'points') return { points: [{ epoch: 12, kind: 'turn', session: 's1', turn: 2, label: 'grow' }] };
    if (req.method === 'rewind' && !req.params.dry_run) {
      conn.destroy();
      return {};
    }
    return req.method === 'rewind' ? { dry_run: true } : {};
  };
  await scripted(daemon, async (path, requests) => {
    const { svc } = service(path, {}, forkingCtx());
    const r = await svc.rewind(agent('s1'), 2, { into: 'child-1' });
    assert.equal(r.ok, false);
    assert.equal(r.refusal.code, 'connection-lost', JSON.stringify(r));
    assert.doesNotMatch(r.refusal.message, /not rewound/);
    assert.match(r.refusal.message, /the files may be rewound in part, or still landing; if the daemon died, `rewindfs mount --recover \/` finishes the rewind/);
    assert.match(r.refusal.message, /the forked session child-1 was discarded; `rewindfs redo --session child-1` undoes the rewind$/);
    assert.deepEqual(methods(requests), ['points', 'rewind', 'fork', 'rewind']);
  });
});
