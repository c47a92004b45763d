// The socket client against a scripted in-test server (protocol v1 framing only).
import assert from 'node:assert/strict';
import { chownSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { call, LineSplitter } from '../lib/client.js';

async function withServer(respond, body) {
  const dir = mkdtempSync(join(tmpdir(), 'rwclient-'));
  const path = join(dir, 's.sock');
  const seen = [];
  const server = createServer((conn) => {
    let buf = '';
    conn.setEncoding('utf8');
    conn.on('data', (d) => {
      buf += d;
      const nl = buf.indexOf('\n');
      if (nl < 0) return;
      const req = JSON.parse(buf.slice(0, nl));
      seen.push(req);
      respond(req, conn);
    });
  });
  await new Promise((r) => server.listen(path, r));
  try {
    await body(path, seen);
  } finally {
    server.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

const line = (o) => `${JSON.stringify(o)}\n`;

test('result, events in order, params without undefined', async () => {
  await withServer((req, conn) => {
    conn.write(line({ v: 1, id: req.id, event: { type: 'rewind.planned', n: 1 } }));
    conn.write(line({ v: 1, id: req.id, event: { type: 'rewind.written', n: 2 } }) + line({ v: 1, id: req.id, ok: true, result: { epoch: 9 } }));
  }, async (path, seen) => {
    const events = [];
    const result = await call(path, 'rewind', { to: 3, paths: undefined }, { onEvent: (e) => events.push(e.type) });
    assert.deepEqual(result, { epoch: 9 });
    assert.deepEqual(events, ['rewind.planned', 'rewind.written']);
    assert.deepEqual(seen[0].params, { to: 3 });
    assert.equal(seen[0].v, 1);
    assert.equal(seen[0].method, 'rewind');
  });
});

test('daemon errors keep their code', async () => {
  await withServer((req, conn) => conn.write(line({ v: 1, id: req.id, ok: false, error: { code: 'turn-open', message: 'Turn 2 is open' } })), async (path) => {
    await assert.rejects(call(path, 'rewind', { to: 1 }), { code: 'turn-open', message: 'Turn 2 is open' });
  });
});

test('garbage, a wrong id and a silent close are protocol failures', async () => {
  await withServer((req, conn) => conn.write('nope\n'), async (path) => {
    await assert.rejects(call(path, 'status'), { code: 'bad-response' });
  });
  await withServer((req, conn) => conn.write(line({ v: 1, id: req.id + 1, ok: true, result: {} })), async (path) => {
    await assert.rejects(call(path, 'status'), { code: 'bad-response' });
  });
  await withServer((req, conn) => conn.end(), async (path) => {
    await assert.rejects(call(path, 'status'), { code: 'connection-lost' });
  });
});

test('a silent daemon times out; a missing socket is unreachable', async () => {
  await withServer(() => {}, async (path) => {
    await assert.rejects(call(path, 'turn.begin', {}, { timeoutMs: 50 }), { code: 'timeout' });
  });
  await assert.rejects(call('/nonexistent-rewindfs/x.sock', 'status'), { code: 'daemon-unreachable' });
});

test('framing is linear: every byte is searched for a newline once', () => {
  // One 1 MiB line in 1,024 chunks, then 2,000 short lines in one chunk: a splitter
  // that searched its whole buffer again per chunk would count ~N^2/2 bytes.
  const s = new LineSplitter();
  const piece = Buffer.alloc(1024, 0x61);
  let lines = [];
  for (let i = 0; i < 1024; i += 1) lines = lines.concat(s.push(piece));
  assert.equal(lines.length, 0);
  lines = s.push(Buffer.from('\n'));
  assert.equal(lines.length, 1);
  assert.equal(lines[0].length, 1024 * 1024);
  const many = Buffer.from('{"v":1}\n'.repeat(2000));
  assert.equal(s.push(many).length, 2000);
  assert.equal(s.searched, 1024 * 1024 + 1 + many.length);
});

test('a line over 1 MiB is a bad response; multi-byte UTF-8 split across chunks survives', () => {
  const s = new LineSplitter();
  assert.throws(() => { for (let i = 0; i < 1100; i += 1) s.push(Buffer.alloc(1024, 0x62)); }, { code: 'bad-response' });
  const t = new LineSplitter();
  const text = Buffer.from('"\u00e9t\u00e9"\n');
  assert.deepEqual([...t.push(text.subarray(0, 2)), ...t.push(text.subarray(2))], ['"été"']);
});

test('a large streamed reply (200 events of 256 KiB) arrives whole and in order', async () => {
  const chunk = 'A'.repeat(256 * 1024);
  await withServer((req, conn) => {
    for (let i = 0; i < 200; i += 1) conn.write(line({ v: 1, id: req.id, event: { type: 'show.chunk', offset: i, data_b64: chunk } }));
    conn.write(line({ v: 1, id: req.id, ok: true, result: { exists: true, size: 200 } }));
  }, async (path) => {
    let n = 0;
    const result = await call(path, 'show', { path: 'f', stream: true }, { onEvent: (e) => { assert.equal(e.offset, n); assert.equal(e.data_b64.length, chunk.length); n += 1; } });
    assert.equal(n, 200);
    assert.deepEqual(result, { exists: true, size: 200 });
  });
});

test('a socket owned by another uid is refused before a byte is sent', { skip: process.getuid() !== 0 && 'needs root to chown' }, async () => {
  const seen = [];
  let connections = 0;
  const dir = mkdtempSync(join(tmpdir(), 'rwclient-'));
  const path = join(dir, 's.sock');
  const server = createServer((conn) => {
    connections += 1;
    conn.on('data', (d) => seen.push(d));
  });
  await new Promise((r) => server.listen(path, r));
  try {
    chownSync(path, 65534, 65534);
    await assert.rejects(call(path, 'turn.begin', { session: 's', turn: 1, label: 'secret' }), { code: 'unsafe-socket' });
    await new Promise((r) => setTimeout(r, 50));
    assert.equal(connections, 0);
    assert.deepEqual(seen, []);
  } finally {
    server.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
