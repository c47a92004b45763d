"""CLI commands of the restore engine: log, rewind, redo, diff, show, gc.

Each command works through the daemon's control socket when the workspace is mounted,
and straight on the directory from the store when it is not (``open_workspace``): the
same method code (``control.rewind_methods.SYNC``) runs in this process then.  The
workspace is ``-C/--dir DIR`` or the current directory, or any directory inside one.
Rendering lives in ``cli.render``.

Only ``rewind`` and ``redo`` (and ``mount``) finish an interrupted rewind (``recover``),
and they say so first; ``log``, ``diff`` and ``show`` never write to the workspace —
with an intent pending they read the store and the tree as they are, and say that an
interrupted rewind is pending.

Ctrl-C (docs/reliability.md, "Clients that go away"): a mounted rewind or
redo runs in the daemon and goes on to its end; the client stops and says so.  An
offline one runs here: Ctrl-C before its first change stops it (nothing changed), after
that it is deferred until the landing is done (``landing.Landing``) — a rewind never stops
half-way.  Either way the last line says which, and the exit code is 130.
"""

from __future__ import annotations

import base64
import codecs
import contextlib
import json
import os
import socket
import typing

from rewindfs.store._errors import PathEscape, RewindfsError

from rewindfs.overlay import errors
from rewindfs.overlay.cli import graph, options
from rewindfs.overlay.cli import render as V
from rewindfs.overlay.cli.landing import Landing
from rewindfs.overlay.cli.mount import find_daemon, intent_pending
from rewindfs.overlay.control import client
from rewindfs.overlay.errors import (DaemonDied, DaemonGone, Interrupted, NotAWorkspace,
                                     NotMounted, StaleMount)
from rewindfs.overlay.places import find_rewindfs_mount, is_inside, resolve_store_path

if typing.TYPE_CHECKING:
    from rewindfs.store import Store

__all__ = ["HANDLERS", "open_workspace", "register"]


# -- where a command runs ---------------------------------------------------------------

class _Mounted:
    mounted = True

    def __init__(self, root: bytes, sock: bytes):
        self.root, self.sock = root, sock

    def call(self, method: str, params: dict, on_event=None) -> dict:
        return client.call(self.sock, method, params, on_event=on_event)

    def points(self, session=None) -> list[dict]:
        return self.call("points", {"session": session} if session else {})["points"]

    def history(self, session=None) -> list[dict]:
        return self.call("history", {"session": session} if session else {})["nodes"]


class _Offline:
    """A ``control.host.RewindHost`` with no mount (``live`` None): the methods run here."""

    mounted = False
    live = None

    def __init__(self, store: Store, ws: int, root: bytes, root_fd: int):
        self.store, self.ws, self.root, self.root_fd = store, ws, root, root_fd

    def call(self, method: str, params: dict, on_event=None) -> dict:
        from rewindfs.overlay.control.rewind_methods import call_local
        return call_local(self, method, params, on_event)

    def points(self, session=None) -> list[dict]:
        return [e.as_point() for e in self.store.points(self.ws, session)]

    def history(self, session=None) -> list[dict]:
        from rewindfs.overlay.control.history import history_sync
        return history_sync(self, {"session": session} if session else {})["nodes"]


def _alive(sock: bytes) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(sock)
        except OSError:
            return False
    return True


def _live_daemon(start: bytes, store_path) -> tuple[bytes, bytes] | None:
    """``(root, socket)`` of a daemon that answers for *start*, else None."""
    try:
        root, sock = find_daemon(start, store_path)
    except NotMounted:
        return None
    return (root, sock) if _alive(sock) else None


@contextlib.contextmanager
def open_workspace(args, out, *, finish=None):
    """Yield the daemon of the workspace (mounted) or an offline handle on it.

    Offline, an interrupted rewind's intent is finished only when ``finish`` (a
    ``Landing``: a rewind or redo that will change the tree) is given, after saying
    so; otherwise it is left alone and named (read-only commands write nothing)."""
    store_path = resolve_store_path(args.store)
    start = os.fsencode(_start(args))
    live = _live_daemon(start, store_path)
    if live is not None:
        yield _Mounted(*live)
        return
    with _offline(store_path, start, out, finish) as ws:
        yield ws


@contextlib.contextmanager
def _offline(store_path, start: bytes, out, finish):
    # The store and the engine load here, not with the CLI: a command that a daemon
    # serves (most of them, most of the time) never needs them.
    from rewindfs.store import Store, StoreReadOnly
    from rewindfs.overlay.rewind.engine import recover
    real = os.path.realpath(start)
    with Store.open(store_path, create=False) as store:
        if finish is not None and store.readonly:   # before a plan is shown for nothing
            raise StoreReadOnly(path=str(store_path), reason="opened for reading only")
        found = store.workspace_containing(real)
        if found is None:
            raise NotAWorkspace(path=os.fsdecode(real), store=str(store_path))
        ws, root = found
        if find_rewindfs_mount(root):
            raise StaleMount(path=os.fsdecode(root))
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if store.get_intent(ws) is not None:
                if finish is None:
                    out.warn(V.INTENT_PENDING)
                else:
                    out.warn(V.INTENT_FINISHING)
                    with finish.landing():
                        recover(fd, store, ws)
                    if finish.pressed:      # Ctrl-C during it: start nothing new
                        raise Interrupted("interrupted: the interrupted rewind was "
                                          f"finished first; this {finish.method} did "
                                          "not start")
            yield _Offline(store, ws, root, fd)
        finally:
            os.close(fd)


def _start(args) -> str:
    return args.dir or args.workspace or "."


def _rel_paths(args, root: bytes) -> list[str] | None:
    """``--path`` values (relative to the workspace dir given, else the cwd) → paths
    relative to the workspace root; one outside it is refused (exit 3)."""
    if not args.path:
        return None
    base = os.path.realpath(os.fsencode(_start(args)))
    out = []
    for p in args.path:
        full = os.path.normpath(os.path.join(base, os.fsencode(p)))
        if not is_inside(full, root):
            raise PathEscape(path=p, reason="it lies outside the workspace "
                             + os.fsdecode(root))
        out.append(os.fsdecode(os.path.relpath(full, root)) if full != root else "")
    return out


# -- commands -------------------------------------------------------------------------

def cmd_log(args, out) -> int:
    if args.all and not args.tree:
        raise errors.UsageError("--all goes with --tree (the plain log lists every epoch)")
    with open_workspace(args, out) as ws:
        if not args.tree:
            points = ws.points(args.session)
            if args.session and not points:
                # a session with nothing here is refused (bad-session), as --tree does,
                # so a typo does not read as an empty history; the protocol's ``points``
                # stays an answer ([]) for a session whose first turn is still to come
                ws.history(args.session)
            V.render_log(out, _newest(points, args.max_count), mounted=ws.mounted)
            return 0
        nodes = ws.history(args.session)
    if out.json:      # oldest first: a parent before its children
        for node in _newest(sorted(nodes, key=lambda n: n["epoch"]), args.max_count):
            out.emit("log.node", **node)
    else:
        graph.render_tree(out, nodes, all_nodes=args.all, limit=args.max_count)
    return 0


def _newest(items: list, n: int | None) -> list:
    """The last *n* of *items* (oldest first), all of them for None."""
    return items if n is None else items[-n:]


def _rewind_like(args, out, method: str, params: dict) -> int:
    with Landing(method, dry_run=args.dry_run) as guard:
        with open_workspace(args, out, finish=None if args.dry_run else guard) as ws:
            if args.path:
                params["paths"] = _rel_paths(args, ws.root)
            view = V.RewindView(out, dry_run=args.dry_run)
            try:
                with view:
                    result = ws.call(method, params, on_event=guard.watch(
                        view.event, lands_here=not ws.mounted))
            except KeyboardInterrupt:
                raise guard.interrupted(mounted=ws.mounted) from None
            except DaemonGone:
                if args.dry_run:
                    raise
                raise _died(ws.root, args.store, method) from None
            view.finish(result)
        if guard.pressed:
            raise Interrupted(f"interrupted: the {method} was finished first (it cannot "
                              "stop half-way); the tree is the state it restored")
    return 1 if result.get("failed") else 0


def _died(root: bytes, store_arg, method: str) -> DaemonDied:
    """What a daemon that died under a rewind or redo leaves: its intent says whether
    the tree is half-way."""
    path, halfway = os.fsdecode(root), intent_pending(resolve_store_path(store_arg), root)
    if halfway is None:
        return DaemonDied(path=path, method=method, state="whether it began is unknown",
                          then="finishes it if it did, and serves the workspace again")
    if halfway:
        return DaemonDied(path=path, method=method,
                          state="the tree is half-way through it",
                          then="finishes it first, then serves the workspace again")
    return DaemonDied(path=path, method=method, state="it changed nothing",
                      then="serves the workspace again")


def cmd_rewind(args, out) -> int:
    params = {"to": args.point, "dry_run": args.dry_run, "force": args.force}
    if args.session:
        params["session"] = args.session
    if args.undo_for:
        params["undo_for"] = args.undo_for
    return _rewind_like(args, out, "rewind", params)


def cmd_redo(args, out) -> int:
    params = {"dry_run": args.dry_run, "force": args.force}
    if args.session:
        params["session"] = args.session
    return _rewind_like(args, out, "redo", params)


def cmd_diff(args, out) -> int:
    if args.nul and not args.names:
        raise errors.UsageError("-z lists names: it needs --name-only or --name-status "
                                "(see rewindfs diff --help)")
    with open_workspace(args, out) as ws:
        params = {"a": args.a}
        if args.b is not None:
            params["b"] = args.b
        if args.session:
            params["session"] = args.session
        if args.path:
            params["paths"] = _rel_paths(args, ws.root)
        res = ws.call("diff", params)
        if args.names:
            V.render_names(out, res, status=args.names == "status", nul=args.nul)
            return 0

        def content(point, path):
            sink = _ShowSink(None)
            r = ws.call("show", {"point": f"e{point}", "path": path, "stream": True}
                        if point is not None else {"path": path, "stream": True},
                        on_event=sink.event)
            return sink.collected(r) if r["exists"] else None

        V.render_diff(out, res, content)
    return 0


def cmd_show(args, out) -> int:
    """Writes the content as its chunks arrive (``--json``: one ``show`` record whose
    ``content_b64`` is written piece by piece), so memory stays at one chunk."""
    sink = _ShowSink(out, args.file)
    with open_workspace(args, out) as ws:
        params = {"point": args.point, "path": _rel_paths(_PathArgs(args), ws.root)[0],
                  "stream": True}
        if args.session:
            params["session"] = args.session
        try:
            res = ws.call("show", params, on_event=sink.event)
        except RewindfsError:
            sink.abort()
            raise
    if not res["exists"]:
        raise errors.Absent(path=args.file, point=args.point)
    sink.finish(res)
    return 0


class _ShowSink:
    """Where ``show.start``/``show.chunk`` events go: *out*'s stream (raw bytes, or the
    ``show`` JSON record written incrementally) or, with ``out=None``, a buffer for
    ``collected``.  A result with ``content_b64`` (no stream) is handled the same way."""

    def __init__(self, out, path=None):
        self.out, self.path = out, path
        self.buf = bytearray() if out is None else None
        self.n = 0
        self.carry = b""        # --json: bytes not yet base64-encoded (< 3)
        self.started = False
        self.text = codecs.getincrementaldecoder("utf-8")("replace")

    def event(self, ev) -> None:
        if ev.get("type") == "show.start":
            self._start(ev.get("point"))
        elif ev.get("type") == "show.chunk":
            if ev.get("offset") != self.n:
                raise errors.BadReply(reason=f"chunk at offset {ev.get('offset')}, "
                                              f"expected {self.n}")
            self._write(base64.b64decode(ev["data_b64"]))

    def _start(self, point) -> None:
        self.started = True
        if self.out is not None and self.out.json:
            head = json.dumps({"v": 1, "type": "show", "path": self.path, "point": point})
            self._put(head[:-1] + ', "content_b64": "')
        elif self.out is not None:
            self.out.stream.flush()     # whatever was printed before goes first

    def _write(self, data: bytes) -> None:
        self.n += len(data)
        if self.out is None:
            self.buf += data
        elif self.out.json:
            data = self.carry + data
            cut = len(data) - len(data) % 3
            self.carry = data[cut:]
            self._put(base64.b64encode(data[:cut]).decode("ascii"))
        elif _has_fd(self.out.stream):
            _write_fd(self.out.stream.fileno(), data)
        else:
            self.out.stream.write(self.text.decode(data))

    def _put(self, text: str) -> None:
        self.out.stream.write(text)

    def _close_record(self, complete: bool) -> None:
        self._put(base64.b64encode(self.carry).decode("ascii")
                  + f'", "complete": {"true" if complete else "false"}}}\n')
        self.out.stream.flush()

    def abort(self) -> None:
        """The call failed after chunks went out: end the JSON record as incomplete."""
        if self.started and self.out is not None and self.out.json:
            self._close_record(False)

    def finish(self, res: dict) -> None:
        if not self.started:      # a daemon that does not stream: content in the result
            self._start(res.get("point"))
            self._write(base64.b64decode(res.get("content_b64") or ""))
        elif res.get("size") != self.n:
            self.abort()
            raise errors.BadReply(reason=f"got {self.n} bytes, announced {res.get('size')}")
        if self.out is None:
            return
        if self.out.json:
            self._close_record(True)
        elif not _has_fd(self.out.stream):
            self.out.stream.write(self.text.decode(b"", final=True))
        self.out.stream.flush()

    def collected(self, res: dict) -> bytes:
        self.finish(res)
        return bytes(self.buf)


def _write_fd(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class _StoreOnly:
    """gc is store-wide: its host needs only the store (no workspace, no mount)."""

    def __init__(self, store):
        self.store = store


class _PathArgs:
    def __init__(self, args):
        self.path, self.dir, self.workspace = [args.file], args.dir, args.workspace


def _has_fd(stream) -> bool:
    try:
        stream.fileno()
        return True
    except (AttributeError, OSError, ValueError):
        return False


def cmd_gc(args, out) -> int:
    if args.remote_gc:      # the remote's gc: reachability there, not local retention
        local = [flag for flag, value in (("--keep-epochs", args.keep_epochs),
                                          ("--max-age", args.max_age),
                                          ("--max-bytes", args.max_bytes),
                                          ("--drop-redo", args.drop_redo or None))
                 if value is not None]
        if local:
            raise errors.UsageError(f"{', '.join(local)}: the local store's retention; gc "
                                    "--remote deletes only what no pushed segment names")
        from rewindfs.overlay.cli.remote import gc_remote_cmd
        return gc_remote_cmd(args, out)
    grace = 3600.0 if args.grace is None else V.parse_duration(args.grace)
    params = {"grace_s": grace, "drop_redo": args.drop_redo}
    if args.dry_run:    # a local gc is undone by nothing: look first
        params["dry_run"] = True
    if args.keep_epochs is not None:
        params["keep_epochs"] = args.keep_epochs
    if args.max_age is not None:
        params["max_age_s"] = V.parse_duration(args.max_age)
    if args.max_bytes is not None:
        params["max_bytes"] = V.parse_size(args.max_bytes)
    store_path = resolve_store_path(args.store)
    # A dry run reads the store here, never through a daemon: one started by an older
    # rewindfs ignores a parameter it does not know and would collect for real.
    live = None if args.dry_run else _live_daemon(os.fsencode(_start(args)), store_path)
    try:
        if live is not None:
            report = client.call(live[1], "gc", params)
        else:   # gc is store-wide: no workspace needed
            from rewindfs.store import Store
            from rewindfs.overlay.control.rewind_methods import gc_sync
            with Store.open(store_path, create=False) as store:
                report = gc_sync(_StoreOnly(store), params, None)
    except KeyboardInterrupt:
        raise _gc_interrupted(live is not None, dry_run=args.dry_run) from None
    V.render_gc(out, report)
    return 0


def _gc_interrupted(in_daemon: bool, *, dry_run: bool) -> Interrupted:
    """What a Ctrl-C left.  A daemon runs a gc it was sent to the end (it reads the next
    request only then, and nothing cancels a worker thread): ``Landing``'s words for a
    sent request.  Here, each step of a gc is one store transaction, so an interrupted
    one is undone and the steps before it stand."""
    if dry_run or in_daemon:
        return Landing("gc", dry_run=dry_run).interrupted(mounted=True)
    return Interrupted("interrupted: the gc stopped; what it had dropped stays dropped, "
                       "the rest is kept; `rewindfs gc` again finishes it")


HANDLERS = {"log": cmd_log, "rewind": cmd_rewind, "redo": cmd_redo, "diff": cmd_diff,
            "show": cmd_show, "gc": cmd_gc}


# -- parsers ----------------------------------------------------------------------------

def register(sub) -> None:
    """Add this module's subcommands to the ``rewindfs`` parser."""
    p = sub.add_parser("log", help="the history: epochs, turns, rewinds (newest last)")
    p.add_argument("dir", nargs="?", metavar="DIR",
                   help="the workspace, as with -C (default: the current directory)")
    p.add_argument("--session", metavar="S",
                   help="only the points of this session (with inherited ones); with "
                        "--tree the whole tree, the other sessions' nodes dimmed "
                        "(--json: in_session on every node)")
    p.add_argument("--tree", action="store_true",
                   help="the history as a tree of states, newest first: @ now, ○ turn or "
                        "idle, ↺ rewind, ↻ redo; every eN is a POINT (--json: one "
                        "log.node record per epoch with its parent, oldest first)")
    p.add_argument("--all", action="store_true",
                   help="with --tree: also the idle epochs that changed nothing")
    p.add_argument("-n", "--max-count", type=options.count, metavar="N",
                   help="only the newest N points (with --tree: the newest N drawn)")
    options.workspace(p)
    p.set_defaults(command="log")

    p = sub.add_parser("rewind", help="put the workspace back to the start of a turn/epoch")
    p.add_argument("point", metavar="POINT",
                   help="a turn: N or tN (of --session, or of the only session), or an "
                   "epoch: eN; a bare number is never an epoch")
    _rewind_options(p, session="the session whose turns POINT counts; also the rewind's "
                    "owner, whose `redo --session S` undoes it",
                    force="even while a turn is open")
    p.add_argument("--path", action="append", metavar="P", help="only this path (repeatable)")
    p.add_argument("--undo-for", metavar="S", help="make session S the rewind's owner "
                   "(its `redo --session S` undoes it); default: --session, else the "
                   "manual owner (`redo` without --session)")
    p.set_defaults(command="rewind", dir=None)

    p = sub.add_parser("redo", help="undo the newest rewind not yet undone (a stack: "
                       "each redo undoes the next older one)")
    _rewind_options(p, session="undo session S's newest rewind (default: the newest "
                    "rewind made without a session)",
                    force="even while a turn is open, and even when the tree changed "
                    "after the rewind (those changes are discarded; they stay a point)")
    p.set_defaults(command="redo", dir=None)

    p = sub.add_parser("diff", help="what changed between two points (B default: now)")
    p.add_argument("a", metavar="A", help="the earlier point: N or tN (a turn), or eN")
    p.add_argument("b", metavar="B", nargs="?", help="the later point (default: now)")
    p.add_argument("--path", action="append", metavar="P", help="only this path (repeatable)")
    p.add_argument("--session", metavar="S", help="the session whose turn numbers A and B use")
    names = p.add_mutually_exclusive_group()
    names.add_argument("--name-status", dest="names", action="store_const", const="status",
                       help="only the changed paths, each after A (added), D (deleted), "
                       "M (modified) or T (type changed); no content is read")
    names.add_argument("--name-only", dest="names", action="store_const", const="only",
                       help="only the changed paths, one per line")
    p.add_argument("-z", dest="nul", action="store_true",
                   help="with --name-only/--name-status into a file or pipe: each name "
                   "as it is, ended by a NUL (without -z, a name with a newline, tab, "
                   "quote or backslash is C-quoted, as git quotes it)")
    options.workspace(p)
    p.set_defaults(command="diff", dir=None)

    p = sub.add_parser("show", help="print a file as it was at POINT")
    p.add_argument("point", metavar="POINT", help="N or tN (a turn), or eN (an epoch)")
    p.add_argument("file", metavar="PATH", help="the file (relative to the current directory)")
    p.add_argument("--session", metavar="S", help="the session whose turn numbers POINT uses")
    options.workspace(p)
    p.set_defaults(command="show", dir=None)

    p = sub.add_parser("gc", help="drop old history and unreferenced blobs")
    p.add_argument("--keep-epochs", type=int, metavar="N", help="keep the newest N epochs")
    p.add_argument("--max-age", metavar="DUR", help="drop epochs older than DUR (30d, 12h)")
    p.add_argument("--max-bytes", metavar="SIZE", help="shrink history below SIZE (500M)")
    p.add_argument("--drop-redo", action="store_true",
                   help="let the policies drop history a pending redo needs")
    p.add_argument("--remote", dest="remote_gc", metavar="NAME",
                   help="gc that remote instead: delete the objects no pushed segment "
                   "names, once older than --grace (docs/remote.md)")
    p.add_argument("--grace", metavar="DUR", default=None,
                   help="keep unreferenced blobs younger than DUR (default 1h; --remote: "
                   "24h, so a push in progress elsewhere is never cut short)")
    p.add_argument("--dry-run", action="store_true",
                   help="list the epochs that would be dropped and what would be "
                   "freed, change nothing (a gc is undone by nothing)")
    options.workspace(p)
    p.set_defaults(command="gc", dir=None)


def _rewind_options(p, *, session: str, force: str) -> None:
    p.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    p.add_argument("--session", metavar="S", help=session)
    p.add_argument("--force", action="store_true", help=force)
    options.workspace(p)
