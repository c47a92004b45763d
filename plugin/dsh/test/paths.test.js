// The control socket path against the shared vectors (tests/e2e/socket_path_vectors.json),
// the same file the daemon's and the Python client's implementations are checked against.
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { readFileSync } from 'node:fs';
import { findSocket, isInside, realpathLoose, socketPathFor } from '../lib/paths.js';

const VECTORS = JSON.parse(readFileSync(fileURLToPath(new URL('../../../tests/e2e/socket_path_vectors.json', import.meta.url)), 'utf8'));

test('socket paths match the vectors', () => {
  assert.ok(VECTORS.socket_path.length >= 8);
  for (const v of VECTORS.socket_path) {
    const got = socketPathFor({ storeReal: v.store, wsReal: v.workspace, uid: v.uid, runtimeDir: v.XDG_RUNTIME_DIR });
    assert.equal(got, v.socket);
  }
});

test('an empty XDG_RUNTIME_DIR counts as unset', () => {
  assert.match(socketPathFor({ storeReal: '/s', wsReal: '/w', uid: 7, runtimeDir: '' }), /^\/tmp\/rewindfs-7\/[0-9a-f]{16}\.sock$/);
});

test('realpathLoose resolves symlinks in the existing prefix and keeps the rest', () => {
  const dir = mkdtempSync(join(tmpdir(), 'rwpaths-'));
  try {
    mkdirSync(join(dir, 'real'));
    symlinkSync(join(dir, 'real'), join(dir, 'link'));
    assert.equal(realpathLoose(join(dir, 'link', 'missing', 'x')), join(realpathLoose(dir), 'real', 'missing', 'x'));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('findSocket walks up to the nearest served ancestor', () => {
  const dir = realpathLoose(mkdtempSync(join(tmpdir(), 'rwfind-')));
  const runtime = join(dir, 'run');
  const env = { XDG_RUNTIME_DIR: runtime };
  try {
    const ws = join(dir, 'ws');
    mkdirSync(join(ws, 'a', 'b'), { recursive: true });
    assert.equal(findSocket(join(ws, 'a', 'b'), join(dir, 'store'), env), undefined);
    const sock = socketPathFor({ storeReal: join(dir, 'store'), wsReal: ws, uid: process.getuid(), runtimeDir: runtime });
    mkdirSync(join(runtime, `rewindfs-${process.getuid()}`), { recursive: true });
    writeFileSync(sock, '');
    assert.deepEqual(findSocket(join(ws, 'a', 'b'), join(dir, 'store'), env), { socket: sock, workspace: ws });
    assert.deepEqual(findSocket(ws, join(dir, 'store'), env), { socket: sock, workspace: ws });
    assert.equal(findSocket(dir, join(dir, 'store'), env), undefined);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('isInside', () => {
  assert.ok(isInside('/w/a', '/w'));
  assert.ok(isInside('/w', '/w'));
  assert.ok(!isInside('/wx', '/w'));
  assert.ok(isInside('/anything', '/'));
});
