/**
 * The plugin's config, validated when the row loads.
 *
 * Exported as a Standard Schema object (`Config['~standard'].validate`), which is
 * what the harness's plugin loader calls before `apply`: an unknown key or a bad
 * value refuses the row with a message naming the key, the value and what is
 * allowed, instead of a plugin that runs with a typo silently ignored.
 *
 *   store          string   store path (default $REWINDFS_HOME, $XDG_DATA_HOME/rewindfs, ~/.local/share/rewindfs)
 *   socket         string   explicit control socket (default: found from the session's cwd)
 *   turnTimeoutMs  integer  how long turn.begin may hold a turn's first step (1..60000, default 3000)
 *   callTimeoutMs  integer  limit for rewind/redo and other calls (1..3600000, default 600000)
 *   enabled        boolean  false keeps the commands but marks no turns (default true)
 *   remote         string   a remote of the store (`rewindfs remote add NAME …`): each turn end
 *                           asks the daemon to push there, and `/rewind N` of a point made on
 *                           another machine learns the pushed history first (default: none)
 * @module rewindfs-dsh/config
 */

export const DEFAULTS = Object.freeze({
  store: undefined,
  socket: undefined,
  turnTimeoutMs: 3000,
  callTimeoutMs: 600_000,
  enabled: true,
  remote: undefined,
});

const RULES = {
  store: (v) => (typeof v === 'string' && v.trim() !== '' ? undefined : 'must be a non-empty string (a store path)'),
  socket: (v) => (typeof v === 'string' && v.startsWith('/') ? undefined : 'must be an absolute socket path'),
  turnTimeoutMs: (v) => intIn(v, 1, 60_000),
  callTimeoutMs: (v) => intIn(v, 1, 3_600_000),
  enabled: (v) => (typeof v === 'boolean' ? undefined : 'must be true or false'),
  // the store's rule for remote names (store/_remotes.py)
  remote: (v) => (typeof v === 'string' && /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/.test(v) ? undefined : "must be a remote's name (1-64 letters, digits, '.', '_' or '-'; see rewindfs remote list)"),
};

function intIn(v, lo, hi) {
  return Number.isInteger(v) && v >= lo && v <= hi ? undefined : `must be an integer from ${lo} to ${hi}`;
}

/**
 * Validate a raw config.
 * @param {unknown} raw - the row's config (undefined/null = defaults).
 * @returns {{value?: object, issues?: {message: string, path?: string[]}[]}} Standard Schema result.
 */
export function validateConfig(raw) {
  if (raw === undefined || raw === null) return { value: { ...DEFAULTS } };
  if (typeof raw !== 'object' || Array.isArray(raw)) return { issues: [{ message: `rewindfs: config must be a mapping, got ${JSON.stringify(raw)}` }] };
  const issues = [];
  for (const [key, value] of Object.entries(raw)) {
    const rule = RULES[key];
    if (rule === undefined) {
      issues.push({ message: `rewindfs: unknown config key "${key}" (known: ${Object.keys(RULES).join(', ')})`, path: [key] });
      continue;
    }
    if (value === undefined) continue;
    const problem = rule(value);
    if (problem) issues.push({ message: `rewindfs: config ${key}=${JSON.stringify(value)} ${problem}`, path: [key] });
  }
  if (issues.length > 0) return { issues };
  return { value: { ...DEFAULTS, ...Object.fromEntries(Object.entries(raw).filter(([, v]) => v !== undefined)) } };
}

/** The Standard Schema face the loader calls. */
export const Config = Object.freeze({
  '~standard': Object.freeze({ version: 1, vendor: 'rewindfs', validate: validateConfig }),
});
