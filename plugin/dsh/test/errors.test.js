// The plugin's error and refusal codes: one table (lib/errors.js), used by every module.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { callError, checkCode, codeOf, CODES, refusal, RewindfsCallError } from '../lib/errors.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');
const SOURCES = [join(ROOT, 'index.js'), ...readdirSync(join(ROOT, 'lib')).filter((f) => f.endsWith('.js')).map((f) => join(ROOT, 'lib', f))];
const ERRORS_JS = join(ROOT, 'lib', 'errors.js');
const MAKERS = /\b(callError|refusal|refuse)\(\s*(['"`])([^'"`]*)\2/g;
// A literal code that bypasses the table: a RewindfsCallError built from a literal, a
// `code: '...'` object, a `?? '...'` fallback code.
const BYPASSES = [/new RewindfsCallError\(\s*['"`]/, /\bcode:\s*['"`]/, /\bcode\s*\?\?\s*['"`]/];

/** Every code made from a literal in index.js and lib/, with where. */
function usedCodes() {
  const uses = [];
  for (const file of SOURCES) {
    const text = readFileSync(file, 'utf8');
    for (const m of text.matchAll(MAKERS)) uses.push({ file, maker: m[1], code: m[3] });
  }
  return uses;
}

test('every code the modules make is in the table', () => {
  const uses = usedCodes();
  // The scan must see the makers at work, or it proves nothing.
  assert.deepEqual(new Set(uses.map((u) => u.maker)), new Set(['callError', 'refusal', 'refuse']));
  assert.ok(uses.length >= 20, `only ${uses.length} code uses found`);
  const missing = uses.filter((u) => !Object.hasOwn(CODES, u.code));
  assert.deepEqual(missing, [], 'codes used but missing from lib/errors.js');
});

test('no module makes a code from a literal outside the table helpers', () => {
  for (const file of SOURCES.filter((f) => f !== ERRORS_JS)) {
    const lines = readFileSync(file, 'utf8').split('\n');
    lines.forEach((line, i) => {
      for (const pattern of BYPASSES) assert.doesNotMatch(line, pattern, `${file}:${i + 1} bypasses lib/errors.js`);
    });
  }
});

test('every code in the table is used (no stale entries)', () => {
  const used = new Set(usedCodes().map((u) => u.code));
  used.add(codeOf({}));       // the fallback code, made by codeOf itself
  const stale = Object.keys(CODES).filter((code) => !used.has(code));
  assert.deepEqual(stale, [], 'codes in lib/errors.js that no module makes');
});

test('the table literal is strict JSON, as scripts/gen_errors_doc.py reads it', () => {
  const text = readFileSync(ERRORS_JS, 'utf8');
  const opener = 'export const CODES = Object.freeze(';
  const start = text.indexOf(opener);
  assert.ok(start >= 0, 'the table opener moved: update scripts/gen_errors_doc.py too');
  const from = start + opener.length;
  const end = text.indexOf('\n});', from);
  assert.deepEqual(JSON.parse(text.slice(from, end + 2)), { ...CODES });
  for (const [code, meaning] of Object.entries(CODES)) {
    assert.match(code, /^[a-z]+(-[a-z]+)*$/, code);
    assert.ok(typeof meaning === 'string' && meaning.length > 0 && !meaning.includes('\n'), code);
  }
  assert.ok(Object.isFrozen(CODES));
});

test('the helpers refuse a code missing from the table', () => {
  assert.throws(() => callError('bussy', 'x'), TypeError);
  assert.throws(() => refusal('bad_turn', 'x'), TypeError);
  assert.throws(() => checkCode('toString'), TypeError);   // own keys only
  const error = callError('timeout', 'late');
  assert.ok(error instanceof RewindfsCallError);
  assert.equal(error.code, 'timeout');
  assert.deepEqual(refusal('busy', 'running'), { code: 'busy', message: 'running' });
});

test('codeOf passes codes on and falls back to "error"', () => {
  assert.equal(codeOf(new RewindfsCallError('turn-open', 'x')), 'turn-open');   // a daemon code
  assert.equal(codeOf(new Error('plain')), 'error');
  assert.equal(codeOf({ code: null }), 'error');
  assert.equal(codeOf(undefined), 'error');
});
