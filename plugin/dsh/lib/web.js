/**
 * Read-only HTTP routes the web UI's client module asks (only where the deployment
 * runs the harness's web server, i.e. `--profile web`):
 *
 *   GET /rewindfs/api/points?session=<id>      the session's turn points (as /rewind lists them)
 *   GET /rewindfs/api/redo-state?session=<id>  whether /redo would do something there now
 *   GET /rewindfs/api/protection?session=<id>  the turns that ran unprotected, and why
 *
 * Each answers `200` with the service's own result shape, `{ok: true, value}` or
 * `{ok: false, refusal: {code, message}}`, as JSON; a bad request is `400` with a
 * refusal.  They change nothing: every action goes through the slash commands
 * (`session.command`), so the transcript records it.  Served by the same server as
 * the web UI itself, with the same (absent) authentication: on 127.0.0.1 only the
 * local user reaches them, as it reaches the conversations.
 * @module rewindfs-dsh/web
 */
import { refusal } from './errors.js';

const SESSION_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

/**
 * Register the routes on `webServer`; returns the disposer.
 * @param {{register: (route: object) => () => void}} webServer - the harness's web server.
 * @param {import('./service.js').RewindfsService} service - the plugin's service.
 * @returns {() => void} removes the routes.
 */
export function registerWebRoutes(webServer, service) {
  const routes = [
    ['/rewindfs/api/points', (id) => service.points(sessionRef(service, id))],
    ['/rewindfs/api/redo-state', (id) => service.redoState(id)],
    ['/rewindfs/api/protection', async (id) => service.protection(id)],
  ];
  const disposers = routes.map(([path, answer]) => webServer.register({
    kind: 'exact',
    path,
    handler: (req, res) => serve(req, res, answer),
  }));
  return () => { for (const dispose of disposers) dispose(); };
}

/** What the service needs of an agent to list points: its id and cwd. */
function sessionRef(service, id) {
  return { id, session: { header: { cwd: service.cwdOfSession(id) } } };
}

async function serve(req, res, answer) {
  if (req.method !== 'GET') return send(res, 405, { ok: false, refusal: refusal('usage', 'GET only') });
  const id = new URL(req.url ?? '/', 'http://x').searchParams.get('session') ?? '';
  if (!SESSION_ID.test(id)) return send(res, 400, { ok: false, refusal: refusal('bad-session', `"${id}" is not a usable session id`) });
  try {
    return send(res, 200, await answer(id));
  } catch (error) {
    return send(res, 500, { ok: false, refusal: refusal('error', String(error?.message ?? error)) });
  }
}

function send(res, status, body) {
  const data = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json; charset=utf-8', 'cache-control': 'no-store' });
  res.end(data);
}
