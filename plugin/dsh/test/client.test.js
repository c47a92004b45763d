// The socket client against a scripted in-test server (protocol v1 framing only).
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { call } from '../lib/client.js';

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
