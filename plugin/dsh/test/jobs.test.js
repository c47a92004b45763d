// Stopping what removed turns left running (lib/jobs.js), with real processes: tagged
// shells of turn 2 are stopped (one of them ignores SIGTERM), a tagged shell of turn 1
// and a process of another session are left alone, an untagged process of the session
// that started after the first removed turn is a refusal.  Plus the session-log parsing
// and the reply texts.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { renderRedo, renderRefusal, renderStatus, renderStopped } from '../lib/commands.js';
import { groupAlive, jobsOfTurns, parseTag, processesOfSession, stopWorkOfTurns, turnTag } from '../lib/jobs.js';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** A detached shell (its own process group) with the harness's env for `session`. */
function shell(script, env) {
  const child = spawn('sh', ['-c', script], { detached: true, stdio: 'ignore', env: { PATH: process.env.PATH, ...env } });
  child.unref();
  return child;
}

async function until(check, what) {
  for (let i = 0; i < 400; i++) {
    if (check()) return;
    await sleep(25);
  }
  assert.fail(`timed out waiting for ${what}`);
}

function kill(group) {
  try {
    process.kill(-group, 'SIGKILL');
  } catch { /* gone */ }
}

const events = (startedAt) => [
  { type: 'turn/start', time: startedAt - 60_000, data: { turn: 1 } },
  { type: 'turn/end', time: startedAt - 50_000, data: { turn: 1 } },
  { type: 'turn/start', time: startedAt, data: { turn: 2 } },
  { type: 'tool/call', data: { turn: 2, callId: 'c1', name: 'bash', arguments: '{"command": "sleep 4; echo late > late.txt", "description": "d", "run_in_background": true}' } },
  { type: 'tool/result', data: { turn: 2, message: { content: [{ type: 'tool-result', toolCallId: 'c1', content: [{ type: 'text', text: 'started background job bash-1' }] }] } } },
  { type: 'turn/end', data: { turn: 2 } },
];

test('the turn tag names the open turn only', () => {
  const log = events(Date.now());
  assert.equal(turnTag('s1', log.slice(0, 1)), 's1:1');
  assert.equal(turnTag('s1', log.slice(0, 4)), 's1:2');
  assert.equal(turnTag('s1', log), undefined);
  assert.deepEqual(parseTag('s-a.b:12'), { session: 's-a.b', turn: 12 });
  assert.equal(parseTag('garbage'), undefined);
});

test('the session log names the background jobs of removed turns', () => {
  const log = events(Date.now());
  assert.deepEqual(jobsOfTurns(log, 2), [{ id: 'bash-1', turn: 2, command: 'sleep 4; echo late > late.txt' }]);
  assert.deepEqual(jobsOfTurns(log, 3), []);
});

test('tagged groups of removed turns are stopped, kept turns and other sessions are not', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rwjobs-'));
  const session = `s-jobs-${process.pid}`;
  const env = (turn) => ({ DSH_SESSION_ID: session, DSH_REWINDFS_TURN: `${session}:${turn}` });
  // turn 2: a `cmd &` whose shell already exited (only the subshell is left), and a
  // job that ignores SIGTERM; turn 1 and another session: must survive.
  const leftover = shell(`(sleep 30; echo late > ${dir}/late.txt) & echo $! > ${dir}/leftover.pid`, env(2));
  const stubborn = shell(`trap '' TERM; echo ready > ${dir}/stubborn.ready; while :; do sleep 0.05; done`, env(2));
  const kept = shell('sleep 30', env(1));
  const other = shell('sleep 30', { DSH_SESSION_ID: 'someone-else', DSH_REWINDFS_TURN: 'someone-else:2' });
  try {
    await until(() => existsSync(join(dir, 'stubborn.ready')) && existsSync(join(dir, 'leftover.pid')), 'the shells');
    await until(() => processesOfSession(session).filter((p) => p.turn === 2).length >= 2, 'the processes to show');
    const agent = { id: session, session: { events: events(Date.now() + 60_000) } };
    const { stopped, problems } = await stopWorkOfTurns({ agent, fromTurn: 2, graceMs: 300 });
    assert.deepEqual(problems, []);
    assert.deepEqual(stopped.map((s) => s.pgid).sort(), [leftover.pid, stubborn.pid].sort());
    assert.ok(stopped.every((s) => s.turn === 2));
    assert.equal(groupAlive(leftover.pid), false);
    assert.equal(groupAlive(stubborn.pid), false);
    assert.equal(groupAlive(kept.pid), true);
    assert.equal(groupAlive(other.pid), true);
    assert.equal(existsSync(join(dir, 'late.txt')), false);
  } finally {
    for (const c of [leftover, stubborn, kept, other]) kill(c.pid);
    rmSync(dir, { recursive: true, force: true });
  }
});

test('an untagged process of the session that started after the removed turn is a refusal', async () => {
  const session = `s-untagged-${process.pid}`;
  const stray = shell('sleep 30', { DSH_SESSION_ID: session });
  try {
    await until(() => processesOfSession(session).length >= 1, 'the stray process');
    const agent = { id: session, session: { events: events(Date.now() - 10_000) } };
    const { stopped, problems } = await stopWorkOfTurns({ agent, fromTurn: 2, graceMs: 300 });
    assert.deepEqual(stopped, []);
    assert.equal(problems.length, 1);
    assert.match(problems[0], new RegExp(`^process ${stray.pid} \\(sh\\) of session ${session} started after turn 2 began and carries no turn tag`));
    assert.equal(groupAlive(stray.pid), true);   // refused, not killed
  } finally {
    kill(stray.pid);
  }
});

test('the rewind reply names what it stopped; /redo says it is not restarted', () => {
  const one = [{ turn: 2, command: 'sleep 4; echo late > late.txt', job: 'bash-1' }];
  assert.deepEqual(renderStopped(one), [
    'rewindfs: stopped 1 background job started in turn 2: sleep 4; echo late > late.txt (job bash-1)',
    'rewindfs: /redo restores files only; it cannot restart that job.',
  ]);
  const two = [...one, { turn: 3, command: 'bash -c (sleep 30; echo x > y) &', pgid: 4242 }];
  assert.deepEqual(renderStopped(two), [
    'rewindfs: stopped 2 background jobs started in turns 2, 3:',
    '  turn 2: sleep 4; echo late > late.txt (job bash-1)',
    '  turn 3: (sleep 30; echo x > y) & (process group 4242)',
    'rewindfs: /redo restores files only; it cannot restart those jobs.',
  ]);
  assert.deepEqual(renderStopped([]), []);
  const redo = renderRedo({ session: 's-child', written: 1, created: 0, deleted: 0, target: 9, notRestarted: { turn: 2, stopped: one } });
  assert.equal(redo.split('\n')[1],
    'rewindfs: not restarted: 1 background job the rewind to turn 2 stopped (sleep 4; echo late > late.txt (job bash-1)); /redo restores files only.');
});

test('a stale redo names the turns that ran since the rewind', () => {
  const refusal = {
    code: 'redo-stale',
    message: 'the tree changed after rewind e7',
    data: {
      rewind: 7,
      paths: 2,
      changes: [
        { epoch: 8, kind: 'turn', session: 's-child', turn: 2, label: 'turn three: wait', paths: 1 },
        { epoch: 9, kind: 'idle', session: 's-child', turn: null, label: null, paths: 1 },
      ],
    },
  };
  assert.deepEqual(renderRefusal(refusal, '/redo').split('\n'), [
    'rewindfs: /redo refused (redo-stale): the tree changed after rewind e7',
    'rewindfs: since the rewind (e7), turn 2 ran in session s-child: turn three: wait (1 path changed)',
    'rewindfs: since the rewind: edits between turns (e9, 1 path changed)',
    'rewindfs: those changes stay; a redo would overwrite 2 paths — rewind to a point instead (see /rewind)',
  ]);
  assert.equal(renderRefusal({ code: 'busy', message: 'x' }, '/redo'), 'rewindfs: /redo refused (busy): x');
});

test('/rewind status names the late writes the daemon saw', () => {
  const text = renderStatus({
    workspace: '/w', pid: 7, store: '/s', epoch: 9, socket: '/sock',
    late_writes: [{ pid: 42, comm: 'sh', by: 42, path: 'late.txt', session: 's1', turn: 2, epoch: 4, how: 'start-time' },
      { pid: 43, comm: 'cp', by: 40, path: 'b', session: 's1', turn: 2, epoch: 4, how: 'tag' }],
  });
  assert.deepEqual(text.split('\n').slice(2), [
    'rewindfs: late write: pid 42 (sh) changed late.txt after a rewind removed turn 2 of session s1, which started it',
    'rewindfs: late write: pid 43 (cp, child of pid 40) changed b after a rewind removed turn 2 of session s1, which started it',
  ]);
});

test('the rewind and redo replies name the point and the turn label', async () => {
  const { renderRewind } = await import('../lib/commands.js');
  const rewound = renderRewind({
    turn: 2, target: 4, child: 'c', parent: 'p', written: 1, created: 0, deleted: 0,
    target_point: { epoch: 4, kind: 'turn', turn: 2, label: 'make it per-tenant\nand more' },
  });
  assert.equal(rewound.split('\n')[0],
    'rewindfs: rewound the files to the start of turn 2 — make it per-tenant — e4: 1 path restored (0 re-created, 1 rewritten), 0 deleted.');
  const redone = renderRedo({ session: 'c', undid: 9, target: 9, written: 0, created: 1, deleted: 0 });
  assert.ok(redone.startsWith('rewindfs: redo done in session c: undid rewind e9, back to the state it found: '), redone);
});
