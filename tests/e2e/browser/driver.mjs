/**
 * A real browser for the web-UI test, driven line by line from Python.
 *
 *   node driver.mjs <playwright-core dir> <chromium path> <screenshot dir>
 *
 * Reads one JSON command a line on stdin and answers each with one line on stdout,
 * `RWB {"ok": true, ...}` or `RWB {"ok": false, "error": "..."}` (other output is
 * the browser's console, prefixed "console:").  Commands (`target` is a Playwright
 * selector, e.g. `[aria-label="rewind to before turn 2"]` or `text=Continue`):
 *
 *   {"op": "goto", "url": U}
 *   {"op": "click", "target": T, "timeout_ms"?: N}
 *   {"op": "dblclick", "target": T, "timeout_ms"?: N}   (a person's habit: two clicks at once)
 *   {"op": "fill", "target": T, "text": S}          {"op": "press", "target": T, "key": K}
 *   {"op": "wait", "target": T, "state"?: "visible"|"attached"|"hidden"|"detached", "timeout_ms"?: N}
 *   {"op": "count", "target": T}                     -> {"count": n}
 *   {"op": "attr", "target": T, "name": A}           -> {"value": s}   (first match)
 *   {"op": "text", "target"?: T}                     -> {"text": s}    (default: body)
 *   {"op": "eval", "js": "() => ..."}                -> {"value": v}
 *   {"op": "screenshot", "name": N}                  -> {"path": p}
 *   {"op": "close"}
 *
 * Chromium runs headless, without the sandbox (the tests run as root), without GPU
 * and /dev/shm, and without background networking (nothing leaves the machine).
 */
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { createInterface } from 'node:readline';

const [driverDir, chromiumPath, shotDir] = process.argv.slice(2);
const require = createRequire(join(driverDir, 'package.json'));
const { chromium } = require(driverDir);

const FLAGS = [
  '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
  '--disable-default-apps', '--no-first-run', '--disable-features=Translate,MediaRouter',
  '--metrics-recording-only', '--no-default-browser-check',
];

const browser = await chromium.launch({ executablePath: chromiumPath, headless: true, args: FLAGS });
const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
page.on('console', (m) => { if (m.type() === 'error' || m.type() === 'warning') process.stdout.write(`console: ${m.type()} ${m.text().slice(0, 500)}\n`); });
page.on('pageerror', (e) => process.stdout.write(`console: pageerror ${e.message}\n`));

const first = (target) => page.locator(target).first();

const OPS = {
  goto: async (c) => { await page.goto(c.url); return {}; },
  click: async (c) => { await first(c.target).click({ timeout: c.timeout_ms ?? 30_000 }); return {}; },
  dblclick: async (c) => { await first(c.target).dblclick({ timeout: c.timeout_ms ?? 30_000 }); return {}; },
  fill: async (c) => { await first(c.target).fill(c.text, { timeout: c.timeout_ms ?? 30_000 }); return {}; },
  press: async (c) => { await first(c.target).press(c.key, { timeout: c.timeout_ms ?? 30_000 }); return {}; },
  wait: async (c) => { await first(c.target).waitFor({ state: c.state ?? 'visible', timeout: c.timeout_ms ?? 60_000 }); return {}; },
  count: async (c) => ({ count: await page.locator(c.target).count() }),
  attr: async (c) => ({ value: await first(c.target).getAttribute(c.name, { timeout: c.timeout_ms ?? 30_000 }) }),
  text: async (c) => ({ text: await first(c.target ?? 'body').innerText({ timeout: c.timeout_ms ?? 30_000 }) }),
  // eslint-disable-next-line no-eval -- the test sends a function source on purpose
  eval: async (c) => ({ value: await page.evaluate(`(${c.js})()`) }),
  screenshot: async (c) => {
    const path = join(shotDir, `${c.name}.png`);
    await page.screenshot({ path, fullPage: false });
    return { path };
  },
};

const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  if (line.trim() === '') continue;
  let reply;
  try {
    const command = JSON.parse(line);
    if (command.op === 'close') break;
    const op = OPS[command.op];
    if (op === undefined) throw new Error(`unknown op ${command.op}`);
    reply = { ok: true, ...(await op(command)) };
  } catch (error) {
    reply = { ok: false, error: String(error?.message ?? error).slice(0, 3000) };
  }
  process.stdout.write(`RWB ${JSON.stringify(reply)}\n`);
}
await browser.close();
process.stdout.write('RWB {"ok": true, "closed": true}\n');
