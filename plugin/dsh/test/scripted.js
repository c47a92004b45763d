// A scripted daemon for the plugin's unit tests: a Unix socket speaking protocol v1
// framing, answering each request with `handle(req)` (a result, or `{error}` for a
// refusal).  The daemon's real side is tested by the pytest tiers.
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/**
 * Run `body(socketPath, seen)` against a scripted socket.
 * @param {(req: object, conn: import('node:net').Socket) => object|Promise<object>} handle -
 *   the answer to one request (`conn.destroy()` there: a daemon that dies holding it).
 * @param {(path: string, seen: unknown[]) => Promise<void>} body - the test.
 * @param {(req: object) => unknown} [record] - what `seen` keeps of each request
 *   (default `{method, params}`).
 */
export async function scripted(handle, body, record = (req) => ({ method: req.method, params: req.params })) {
  const dir = mkdtempSync(join(tmpdir(), 'rwscripted-'));
  const path = join(dir, 'd.sock');
  const seen = [];
  const server = createServer((conn) => {
    let buf = '';
    conn.setEncoding('utf8');
    conn.on('data', async (d) => {
      buf += d;
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const req = JSON.parse(buf.slice(0, nl));
        buf = buf.slice(nl + 1);
        seen.push(record(req));
        const result = await handle(req, conn);
        const reply = result?.error ? { ok: false, error: result.error } : { ok: true, result };
        if (!conn.destroyed) conn.write(`${JSON.stringify({ v: 1, id: req.id, ...reply })}\n`);
      }
    });
    conn.on('error', () => {});
  });
  await new Promise((r) => server.listen(path, r));
  try {
    await body(path, seen);
  } finally {
    server.close();
    rmSync(dir, { recursive: true, force: true });
  }
}
