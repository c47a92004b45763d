/**
 * Where things live, for the JS plugin: the default store, the control socket of
 * the daemon serving a directory, and finding it by walking up. The one JS home of
 * these rules (the Python one is plugin/_paths.py, which the daemon imports too);
 * both are tested against tests/e2e/socket_path_vectors.json.
 *
 * The socket path is a pure function of the store's real path and the workspace's
 * real path (docs/architecture.md, "Control socket"):
 *
 *   ${XDG_RUNTIME_DIR:-/tmp}/rewindfs-<uid>/<sha256(store_real + NUL + ws_real), first 16 hex>.sock
 *
 * SHA-256 from node:crypto, cut to 16 hex digits so the name keeps its old length
 * and still fits sun_path (reasons in plugin/_paths.py). Finding the daemon walks up
 * from a directory, computing the path for each ancestor: the first socket that
 * exists wins, so no configuration is needed.
 * @module rewindfs-dsh/paths
 */
import { createHash } from 'node:crypto';
import { existsSync, realpathSync } from 'node:fs';
import { homedir } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';

/** Hex digits of the SHA-256 kept in the socket name (plugin/_paths.py DIGEST_HEX). */
const DIGEST_HEX = 16;

/**
 * The default store: $REWINDFS_HOME, else $XDG_DATA_HOME/rewindfs, else
 * ~/.local/share/rewindfs (an empty variable counts as unset).
 * @param {Record<string, string|undefined>} env - environment to read.
 * @returns {string} the store path (not necessarily existing).
 */
export function defaultStorePath(env = process.env) {
  if (env.REWINDFS_HOME) return env.REWINDFS_HOME;
  if (env.XDG_DATA_HOME) return join(env.XDG_DATA_HOME, 'rewindfs');
  return join(homedir(), '.local', 'share', 'rewindfs');
}

/**
 * Real path like Python's os.path.realpath(strict=False): the longest existing
 * prefix is resolved, the missing rest is appended as written.
 * @param {string} path - absolute or relative path.
 * @returns {string} the resolved path.
 */
export function realpathLoose(path) {
  const abs = resolve(path);
  try {
    return realpathSync(abs);
  } catch {
    const parent = dirname(abs);
    if (parent === abs) return abs;
    return join(realpathLoose(parent), basename(abs));
  }
}

/**
 * The pure core the vectors pin: no file system, no environment.
 * @param {{storeReal: string, wsReal: string, uid: number, runtimeDir?: string|null}} p
 * @returns {string} the socket path.
 */
export function socketPathFor({ storeReal, wsReal, uid, runtimeDir }) {
  const input = Buffer.concat([Buffer.from(storeReal, 'utf8'), Buffer.from([0]), Buffer.from(wsReal, 'utf8')]);
  const digest = createHash('sha256').update(input).digest('hex').slice(0, DIGEST_HEX);
  return `${runtimeDir || '/tmp'}/rewindfs-${uid}/${digest}.sock`;
}

/**
 * The socket a daemon for (store, workspace) listens on; both made real first.
 * @param {string} store - store path.
 * @param {string} workspace - workspace directory.
 * @param {Record<string, string|undefined>} env - environment to read.
 * @returns {string} the socket path.
 */
export function controlSocketPath(store, workspace, env = process.env) {
  return socketPathFor({
    storeReal: realpathLoose(store),
    wsReal: realpathLoose(workspace),
    uid: process.getuid(),
    runtimeDir: env.XDG_RUNTIME_DIR,
  });
}

/**
 * The nearest ancestor of `start` (itself included) that a daemon serves.
 * @param {string} start - a directory inside the workspace.
 * @param {string} store - store path.
 * @param {Record<string, string|undefined>} env - environment to read.
 * @returns {{socket: string, workspace: string} | undefined} the socket and workspace root.
 */
export function findSocket(start, store, env = process.env) {
  let current = realpathLoose(start);
  for (;;) {
    const socket = controlSocketPath(store, current, env);
    if (existsSync(socket)) return { socket, workspace: current };
    const parent = dirname(current);
    if (parent === current) return undefined;
    current = parent;
  }
}

/**
 * Whether `path` is `root` or lies below it (both absolute).
 * @param {string} path - candidate.
 * @param {string} root - workspace root.
 * @returns {boolean} containment.
 */
export function isInside(path, root) {
  if (root === '/') return true;
  return path === root || path.startsWith(root.endsWith('/') ? root : `${root}/`);
}
