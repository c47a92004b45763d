/**
 * rewindfs in the harness's web UI (the browser half; plain JS, no build step).
 *
 * The web shell serves this file at /plugins/rewindfs-dsh/client.js because
 * package.json declares `exports["./client"]` and `dsh.client {platform: "web"}`.
 * It is a classic script in the shell's module-loader format
 * (`window.__ModuleLoader__.load({id, factory: (require) => exports})`); the
 * factory exports `inject` and `apply(ctx)`, and takes React from `require("react")`.
 *
 * What it adds:
 * - `conversation.chat.assistant-actions` (the row under the assistant message that
 *   closed a turn, beside copy / like / branch): a rewind control (↺) whose tooltip
 *   says what the point covers ("turn 2 · 4 files changed · 09:18:41 · label").
 *   Picking it runs three steps, in this order: the deployment's own fork
 *   (`ctx.sessions.fork({sessionId, atSeq})`, which attaches the child to the
 *   workspace), then `/rewind <turn> --into <child>` in the parent's binding (the
 *   host puts the files back and files the undo record in that child), then
 *   `ctx.sessions.open(child)`.  A refusal (busy, unprotected turn, a host refusal)
 *   is shown beside the control and nothing is opened; a fork made before a host
 *   refusal is archived (`ctx.get('workspaces').archiveSession`).
 * - `conversation.chat.commandview` for `rewind` and `redo`: the whole reply, line
 *   by line (the stock row shows only its first line).
 * - `conversation.session.header.actions`: "undo the rewind that landed here"
 *   (only while a `/redo` in this session would do something) and, beside it, what
 *   else that rewind undid or could not restore (its reply stays in the parent);
 *   "rewind status" (runs `/rewind status`; the answer lands in the transcript); and, once a turn of
 *   the session ran unprotected (no daemon serves the workspace, or it did not
 *   answer), a notice naming those turns and why — the plugin's stderr notice never
 *   reaches the browser.
 *
 * It reads the host only through the plugin's read-only routes (lib/web.js):
 * `/rewindfs/api/points` for the tooltips, `/rewindfs/api/redo-state` for the header
 * control and `/rewindfs/api/protection` for the notice.  Everything that changes
 * state is a slash command, so the transcript records it.  The pure logic is in
 * `logic` below and exported for the unit tests (test/web-client.test.js loads this
 * file with a stub loader).
 */
/* global window, fetch */
window.__ModuleLoader__.load({
  id: 'rewindfs-dsh',
  factory: (require) => {
    const module = { exports: {} };
    const React = require('react');
    const h = React.createElement;

    // ---- logic (pure; unit-tested) -------------------------------------------

    const BUSY = 'the agent is running; wait for the turn to finish (or cancel it), then rewind';
    const REWOUND_PREFIX = '↩ ';

    /** The assistant message `messageId` in the snapshot's nodes: {turn, seq, time}, or undefined. */
    function turnOfMessage(nodes, messageId) {
      for (const node of nodes ?? []) {
        if (node?.kind === 'assistant' && node.messageId === messageId) return { turn: node.turn, seq: node.seq, time: node.time };
      }
      return undefined;
    }

    /**
     * The `atSeq` that makes the deployment's fork cut right before turn `turn`:
     * turn `turn - 1`'s turn/end (the fork keeps everything up to the first turn/end
     * at or after atSeq), else any seq inside turn `turn - 1`.  Undefined for turn 1
     * (the fork cannot cut an empty history) or when turn `turn - 1` is not loaded.
     */
    function forkAnchor(snapshot, turn) {
      if (!(turn > 1)) return undefined;
      const end = snapshot?.turnEnds?.get?.(turn - 1);
      if (typeof end === 'number') return end;
      const inside = (snapshot?.nodes ?? []).find((n) => n?.turn === turn - 1 && typeof n.seq === 'number');
      return inside?.seq;
    }

    /** The point of `turn`: the session's own first, else an inherited one. */
    function pointOfTurn(points, turn, sessionId) {
      const matching = (points ?? []).filter((p) => p.turn === turn);
      return matching.find((p) => p.session === sessionId) ?? matching[0];
    }

    const pad = (n) => String(n).padStart(2, '0');
    const plural = (n, word) => `${n} ${word}${n === 1 ? '' : 's'}`;

    /** "turn 2 · 4 files changed · 09:18:41 · make it per-tenant" */
    function describePoint(point) {
      const d = new Date(Number(point.started_ns ?? 0) / 1e6);
      const time = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
      return [`turn ${point.turn}`, `${plural(point.paths ?? 0, 'file')} changed`, time, point.label ?? '']
        .filter((part) => part !== '').join(' · ');
    }

    /**
     * What the rewind control of `messageId` shows: null (not a turn-closing
     * assistant message we know), or {turn, enabled, tooltip, atSeq}.
     */
    function controlState({ snapshot, sessionId, messageId, points, pointsError }) {
      const at = turnOfMessage(snapshot?.nodes, messageId);
      if (at === undefined || !Number.isInteger(at.turn)) return null;
      const turn = at.turn;
      const disabled = (why) => ({ turn, enabled: false, tooltip: `turn ${turn}: ${why}` });
      if (pointsError) return disabled(`cannot rewind here: ${pointsError}`);
      if (points === undefined) return disabled('loading the rewind point…');
      const point = pointOfTurn(points, turn, sessionId);
      if (point === undefined) return disabled('no rewind point (this turn ran unprotected, or before the workspace was mounted)');
      const atSeq = forkAnchor(snapshot, turn);
      const tooltip = `rewind to before this turn: ${describePoint(point)}`;
      // The web fork cannot cut an empty history: turn 1 lets the host fork (once),
      // which attaches the child to the workspace just as the web fork does.
      if (turn === 1) return { turn, enabled: true, tooltip, atSeq: undefined };
      if (atSeq === undefined) return disabled(`turn ${turn - 1} is not loaded; scroll up, or type /rewind ${turn}`);
      return { turn, enabled: true, tooltip, atSeq };
    }

    /** A refusal as the host words it, for refusals the client finds first. */
    function refusalText(verb, code, message) {
      return `rewindfs: ${verb} refused (${code}): ${message}`;
    }

    /** The settled outcome of the newest `/name args` command after `afterSeq` in `nodes`, or undefined. */
    function commandOutcome(nodes, name, args, afterSeq) {
      const list = nodes ?? [];
      for (let i = list.length - 1; i >= 0; i--) {
        const n = list[i];
        if (n?.kind !== 'command' || n.name !== name || n.seq <= afterSeq) continue;
        if ((n.args ?? '').trim() !== args.trim()) continue;
        return n.outcome ?? undefined;
      }
      return undefined;
    }

    const lastSeq = (snapshot) => (snapshot?.nodes ?? []).reduce((m, n) => (typeof n?.seq === 'number' && n.seq > m ? n.seq : m), -1);

    /** Resolve with the outcome of `/name args` once the session's snapshot shows it settled. */
    function waitForOutcome(session, name, args, afterSeq, timeoutMs = 600_000) {
      return new Promise((resolve) => {
        let unsubscribe = () => {};
        const timer = setTimeout(() => { unsubscribe(); resolve({ kind: 'error', text: `rewindfs: no answer to /${name}${args ? ` ${args}` : ''} within ${timeoutMs / 1000} s` }); }, timeoutMs);
        const check = () => {
          const outcome = commandOutcome(session.getSnapshot().nodes, name, args, afterSeq);
          if (outcome === undefined) return false;
          clearTimeout(timer);
          unsubscribe();
          resolve(outcome);
          return true;
        };
        if (!check()) unsubscribe = session.subscribe(check);
      });
    }

    /**
     * Run a slash command in `session` and wait for its outcome.
     * @returns {Promise<{kind: 'success'|'error', text?: string}>} the outcome.
     */
    async function runCommand(session, name, args = '') {
      const afterSeq = lastSeq(session.getSnapshot());
      const admitted = await session.command(`/${name}${args ? ` ${args}` : ''}`);
      if (!admitted?.ok) return { kind: 'error', text: `rewindfs: /${name} was not accepted: ${admitted?.error?.message ?? 'unknown error'}` };
      if (admitted.value?.matched === false) return { kind: 'error', text: `rewindfs: /${name} is not a command here (is the rewindfs plugin installed in this profile?)` };
      return waitForOutcome(session, name, args, afterSeq);
    }

    /**
     * The three steps of a rewind picked in the transcript, in this order: fork
     * (the deployment's own), `/rewind <turn> --into <child>` in the parent, open
     * the child.  Refused before the fork while the agent runs.  Turn 1 (no
     * `atSeq`: the web fork cannot cut an empty history): `rewindWithHostFork`.
     * A refusal after the fork archives the fork (`dropFork`).
     * @param {object} sessions - ctx.sessions.
     * @param {(id: string) => Promise<void>} [archive] - archives a session.
     * @returns {Promise<{ok: true, child: string, text?: string} | {ok: false, text: string, child?: string}>} result.
     */
    async function rewindToTurn(sessions, { sessionId, turn, atSeq }, archive = undefined) {
      const verb = `/rewind ${turn}`;
      const session = sessions.binding(sessionId)?.session;
      if (session === undefined) return { ok: false, text: refusalText(verb, 'error', `session ${sessionId} is not open in this page`) };
      if (session.getSnapshot().running) return { ok: false, text: refusalText(verb, 'busy', BUSY) };
      if (atSeq === undefined) return rewindWithHostFork(sessions, session, turn);
      let child;
      try {
        child = await sessions.fork({ sessionId, atSeq });
      } catch (error) {
        return { ok: false, text: refusalText(verb, 'fork-failed', `could not fork session ${sessionId} before turn ${turn}: ${error?.message ?? error}`) };
      }
      const outcome = await runCommand(session, 'rewind', `${turn} --into ${child}`);
      if (outcome.kind !== 'success') {
        const text = outcome.text ?? refusalText(verb, 'error', 'refused');
        return { ok: false, child, text: `${text}\n${await dropFork(archive, child)}` };
      }
      sessions.open(child);
      return { ok: true, child, text: outcome.text };
    }

    /**
     * The fork a refused rewind made is archived, so the session list holds no
     * session nobody asked for.  Says what became of it.
     * @param {((id: string) => Promise<void>) | undefined} archive - the deployment's archive.
     */
    async function dropFork(archive, child) {
      const left = `rewindfs: the fork ${child} made for this rewind is left in the session list`;
      if (archive === undefined) return left;
      try {
        await archive(child);
        return `rewindfs: the fork ${child} made for this rewind was archived`;
      } catch (error) {
        return `${left} (archiving it failed: ${error?.message ?? error})`;
      }
    }

    /**
     * Turn 1 (the web fork cannot cut before it): `/rewind 1` lets the host fork the
     * empty history itself (attached to the workspace), and the reply names the child
     * ("continue in session <child>"), which is then opened.
     */
    async function rewindWithHostFork(sessions, session, turn) {
      const outcome = await runCommand(session, 'rewind', String(turn));
      if (outcome.kind !== 'success') return { ok: false, text: outcome.text ?? refusalText(`/rewind ${turn}`, 'error', 'refused') };
      const child = childOfReply(outcome.text);
      if (child === undefined) return { ok: false, text: `${outcome.text ?? ''}\nrewindfs: the reply names no session to open; open the newest session of this workspace` };
      sessions.open(child);
      return { ok: true, child, text: outcome.text };
    }

    /** The child session a `/rewind` reply names ("continue in session <id> (…"). */
    function childOfReply(text) {
      return /continue in session (\S+) \(/.exec(text ?? '')?.[1];
    }

    /**
     * The header's notice for turns that ran unprotected (the protection route's value):
     * `{short, full}` — a few words for the header, the whole reason for its tooltip —
     * or undefined when every turn of the session was protected.
     */
    function unprotectedText(value) {
      const turns = value?.unprotected ?? [];
      if (turns.length === 0) return undefined;
      const one = turns.length === 1;
      const which = one ? `turn ${turns[0]}` : `turns ${turns.join(', ')}`;
      const cannot = one ? 'its changes cannot be rewound' : 'their changes cannot be rewound';
      return {
        short: `⚠ rewindfs: ${which} NOT protected`,
        full: `rewindfs: ${which} ran NOT protected (${cannot})${value.reason ? `: ${value.reason}` : ''}`,
      };
    }

    const logic = {
      BUSY, REWOUND_PREFIX, turnOfMessage, forkAnchor, pointOfTurn, describePoint, controlState,
      refusalText, commandOutcome, waitForOutcome, runCommand, rewindToTurn, childOfReply,
      unprotectedText,
    };

    // ---- host routes -----------------------------------------------------------

    async function getJson(path, sessionId) {
      const response = await fetch(`${path}?session=${encodeURIComponent(sessionId)}`, { cache: 'no-store' });
      const body = await response.json();
      if (!body?.ok) throw new Error(`${body?.refusal?.code ?? response.status}: ${body?.refusal?.message ?? 'no answer'}`);
      return body.value;
    }

    /** Points of `sessionId`, refetched whenever `version` (the number of closed turns) changes. */
    function usePoints(sessionId, version) {
      const [state, setState] = React.useState({ points: undefined, error: undefined });
      React.useEffect(() => {
        let live = true;
        getJson('/rewindfs/api/points', sessionId).then(
          (value) => { if (live) setState({ points: value.points, error: undefined }); },
          (error) => { if (live) setState({ points: undefined, error: error.message }); });
        return () => { live = false; };
      }, [sessionId, version]);
      return state;
    }

    // ---- components --------------------------------------------------------------

    const buttonStyle = { background: 'none', border: 0, cursor: 'pointer', padding: '2px 6px', fontSize: 14, color: 'inherit' };
    const noticeStyle = { fontSize: 12, marginRight: 8, color: 'var(--dsw-alias-label-error, #c0392b)', whiteSpace: 'nowrap', overflow: 'hidden', textOverflow: 'ellipsis', maxWidth: 320, cursor: 'help' };
    const statusStyle = { fontSize: 12, marginLeft: 6, color: 'var(--dsw-alias-label-error, #c0392b)', whiteSpace: 'pre-wrap' };

    /**
     * `[busy, start]` for a control's action: `start` runs `action` unless a run is
     * still going, so a double click is one run.  The ref, not the disabled state
     * alone: a second click of a double click lands before the re-render that
     * disables the button (seen in Chromium: two forks, two rewinds).
     */
    function useSingleRun(action) {
      const [busy, setBusy] = React.useState(false);
      const inFlight = React.useRef(false);
      const start = async () => {
        if (inFlight.current) return;
        inFlight.current = true;
        setBusy(true);
        try {
          await action();
        } finally {
          inFlight.current = false;
          setBusy(false);
        }
      };
      return [busy, start];
    }

    function makeRewindAction(sessions, archive) {
      return function RewindAction({ messageId, sessionId, useSession }) {
        const nodes = useSession((s) => s.nodes);
        const turnEnds = useSession((s) => s.turnEnds);
        const running = useSession((s) => s.running);
        const { points, error } = usePoints(sessionId, turnEnds?.size ?? 0);
        const [refused, setRefused] = React.useState(undefined);
        const state = controlState({ snapshot: { nodes, turnEnds }, sessionId, messageId, points, pointsError: error });
        const [busy, onClick] = useSingleRun(async () => {
          setRefused(undefined);
          const result = await rewindToTurn(sessions, { sessionId, turn: state.turn, atSeq: state.atSeq }, archive);
          if (!result.ok) setRefused(result.text);
        });
        if (state === null) return null;
        return h('span', { 'data-rewindfs': 'turn-control', 'data-turn': state.turn },
          h('button', {
            type: 'button', style: buttonStyle, title: state.tooltip,
            'aria-label': `rewind to before turn ${state.turn}`,
            'data-rewindfs-running': running ? 'true' : 'false',
            disabled: !state.enabled || busy, onClick,
          }, '↺'),
          refused === undefined ? null : h('span', { role: 'status', 'data-rewindfs': 'refusal', style: statusStyle }, refused));
      };
    }

    /**
     * The header control of a session: "↻ undo rewind" where a rewind landed here
     * (`/redo`), else "↻ back to this session's files" where a rewind took this
     * session's own files away and no /redo here brings them back (`/rewind own`:
     * the daemon's redo state says `own`).  Asked again whenever the transcript grows.
     */
    function makeUndoRewind(sessions) {
      return function UndoRewind({ sessionId, useSession }) {
        const seqs = useSession((s) => s.nodes?.length ?? 0);
        const [state, setState] = React.useState({ canRedo: false });
        const [refused, setRefused] = React.useState(undefined);
        const [tick, setTick] = React.useState(0);
        const back = !state.canRedo && state.own !== undefined;
        const [busy, onClick] = useSingleRun(async () => {
          setRefused(undefined);
          try {
            const session = sessions.binding(sessionId)?.session;
            const [name, args] = back ? ['rewind', 'own'] : ['redo', ''];
            const outcome = session === undefined
              ? { kind: 'error', text: refusalText(`/${name}`, 'error', `session ${sessionId} is not open in this page`) }
              : await runCommand(session, name, args);
            if (outcome.kind !== 'success') setRefused(outcome.text);
          } finally {
            setTick((n) => n + 1);
          }
        });
        React.useEffect(() => {
          let live = true;
          getJson('/rewindfs/api/redo-state', sessionId).then(
            (value) => { if (live) setState({ canRedo: value.canRedo === true, landed: value.landed, own: value.own }); },
            () => { if (live) setState({ canRedo: false }); });
          return () => { live = false; };
        }, [sessionId, seqs, tick]);
        if (!state.canRedo && !back && refused === undefined) return null;
        const landed = state.canRedo ? state.landed : undefined;
        const from = state.own?.from === undefined ? 'another session' : `session ${state.own.from}`;
        const button = state.canRedo
          ? h('button', { type: 'button', style: buttonStyle, title: 'undo the rewind that landed here (/redo)', 'aria-label': 'undo the rewind that landed here', disabled: busy, onClick }, '↻ undo rewind')
          : back
            ? h('button', { type: 'button', style: buttonStyle, title: `a rewind put ${from}'s files in the workspace: put this session's own back, as its last turn left them (/rewind own; /redo here then undoes it)`, 'aria-label': "back to this session's files", disabled: busy, onClick }, "↻ back to this session's files")
            : null;
        // a turn typed here would work on the other session's files: say so beside
        // the control, not only in its tooltip
        const away = back ? `the workspace holds ${from}'s files, not this session's: a turn here works on them` : undefined;
        return h('span', { 'data-rewindfs': 'undo' },
          landed === undefined ? null
            : h('span', { role: 'status', 'data-rewindfs': 'landed', title: landed.full, 'aria-label': landed.full, style: noticeStyle }, landed.short),
          away === undefined ? null
            : h('span', { role: 'status', 'data-rewindfs': 'away', title: away, 'aria-label': away, style: noticeStyle }, "⚠ not this session's files"),
          button,
          refused === undefined ? null : h('span', { role: 'status', style: statusStyle }, refused));
      };
    }

    /**
     * The stderr notice of an unprotected turn never reaches the browser: the header says
     * it, asked again whenever the transcript grows (a turn's first step is marked then).
     */
    function ProtectionNotice({ sessionId, useSession }) {
      const seqs = useSession((s) => s.nodes?.length ?? 0);
      const [text, setText] = React.useState(undefined);
      React.useEffect(() => {
        let live = true;
        getJson('/rewindfs/api/protection', sessionId).then(
          (value) => { if (live) setText(unprotectedText(value)); },
          () => { if (live) setText(undefined); });
        return () => { live = false; };
      }, [sessionId, seqs]);
      if (text === undefined) return null;
      return h('span', { role: 'status', 'data-rewindfs': 'unprotected', title: text.full, 'aria-label': text.full, style: noticeStyle }, text.short);
    }

    function makeRewindStatus(sessions) {
      return function RewindStatus({ sessionId }) {
        const onClick = () => { sessions.binding(sessionId)?.session.command('/rewind status'); };
        return h('button', { type: 'button', style: buttonStyle, title: 'rewind status (/rewind status; the answer lands in the transcript)', 'aria-label': 'rewind status', 'data-rewindfs': 'status', onClick }, 'rewind status');
      };
    }

    /** `/rewind` and `/redo` rows in the transcript: the command, then the whole reply, line by line. */
    function CommandView({ node }) {
      const outcome = node?.outcome;
      const text = outcome === null || outcome === undefined ? '…' : (outcome.text ?? outcome.kind);
      return h('div', { 'data-rewindfs': 'command-view', 'data-command': node?.name ?? '', 'data-outcome': outcome?.kind ?? 'running', style: { fontSize: 13, lineHeight: '19px' } },
        h('div', { style: { opacity: 0.65 } }, `/${node?.name ?? ''}${node?.args ?? ''}`),
        h('pre', { style: { whiteSpace: 'pre-wrap', margin: '2px 0 0', fontFamily: 'var(--dsw-font-mono, monospace)', fontSize: 12, ...(outcome?.kind === 'error' ? { color: statusStyle.color } : {}) } }, text));
    }

    // ---- plugin ------------------------------------------------------------------

    const inject = ['slots', 'sessions'];

    function apply(ctx) {
      ctx.slots.inject('conversation.chat.assistant-actions', () => ctx.slots.register({
        name: 'conversation.chat.assistant-actions', id: 'rewindfs-rewind', order: 30,
      }, makeRewindAction(ctx.sessions, (id) => ctx.get('workspaces').archiveSession(id))));
      for (const key of ['rewind', 'redo']) {
        ctx.slots.inject('conversation.chat.commandview', () => ctx.slots.register({
          name: 'conversation.chat.commandview', key,
        }, CommandView));
      }
      ctx.slots.inject('conversation.session.header.actions', () => ctx.slots.register({
        name: 'conversation.session.header.actions', id: 'rewindfs-unprotected', order: 39,
      }, ProtectionNotice));
      ctx.slots.inject('conversation.session.header.actions', () => ctx.slots.register({
        name: 'conversation.session.header.actions', id: 'rewindfs-undo', order: 40,
      }, makeUndoRewind(ctx.sessions)));
      ctx.slots.inject('conversation.session.header.actions', () => ctx.slots.register({
        name: 'conversation.session.header.actions', id: 'rewindfs-status', order: 41,
      }, makeRewindStatus(ctx.sessions)));
    }

    module.exports.inject = inject;
    module.exports.apply = apply;
    module.exports.logic = logic;
    return module.exports;
  },
});
