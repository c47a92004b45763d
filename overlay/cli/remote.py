"""CLI commands of remotes: ``remote add|list|remove|log|learn``, ``push``, ``restore``,
and the remote halves of ``fsck --remote`` and ``gc --remote``.

A remote is S3-compatible object storage (``store.remote``, docs/remote.md); its
configuration lives in the store, credentials come from the standard AWS chain.
``push`` uploads what the remote lacks of a workspace's history (resumable: run it
again), ``restore`` puts a pushed point onto a new directory from any machine and
teaches the local store its history (``overlay.rewind.remote``).  ``remote learn``
teaches a workspace that has files but no history here a pushed history, changing no
file (``overlay.rewind.learn``): through the daemon when it is mounted
(``remote.learn``), else straight on the directory.
"""

from __future__ import annotations

import os
import time

from rich.cells import cell_len

import rewindfs.store as store_lib              # both load their names on first use:
import rewindfs.store.remote as remote_lib      # LMDB and boto3 come with the command
from rewindfs.store._errors import UnknownRemoteWorkspace

from rewindfs.overlay.cli import options
from rewindfs.overlay.cli.landing import Landing
from rewindfs.overlay.control import client
from rewindfs.overlay.cli.render import escape, human_bytes, parse_duration, truncate
from rewindfs.overlay.errors import Interrupted, NotAWorkspace, StaleMount, UsageError
from rewindfs.overlay.places import (control_socket_path, find_rewindfs_mount, find_socket,
                                     resolve_store_path)

__all__ = ["HANDLERS", "register"]


# The store, boto3 and the tree code load with the command that needs them, not with
# the CLI: ``rewindfs turn begin`` never does (test_cli_startup).

def _tree():
    """``overlay.rewind.remote``: the restore engine and capture come with it."""
    from rewindfs.overlay.rewind import remote as tree_remote
    return tree_remote


def _config(store, name: str):
    return _tree().remote_config(store, name)


def _default_remote(store, name: str | None) -> str:
    return _tree().default_remote(store, name)


# -- remote add | list | remove | log -----------------------------------------------------

def cmd_remote_add(args, out) -> int:
    store_lib.check_remote_name(args.name)       # before the server is asked anything
    remote_lib.parse_url(args.url)
    remote_lib.check_endpoint(args.endpoint)
    config = remote_lib.RemoteConfig(args.name, args.url, args.endpoint, args.region)
    conditional = remote_lib.probe_conditional(remote_lib.open_backend(config))
    with store_lib.Store.open(resolve_store_path(args.store)) as store:
        store.add_remote(args.name, args.url, args.endpoint, args.region, conditional)
    out.emit("remote.added", **remote_lib.RemoteConfig(args.name, args.url, args.endpoint,
                                                       args.region, conditional).as_dict())
    how = "honours conditional writes" if conditional else \
        "ignores conditional writes, so the lease uses claims; docs/remote.md"
    out.say(f"remote {escape(args.name)} → {escape(args.url)} (the server {how})")
    return 0


def cmd_remote_list(args, out) -> int:
    with store_lib.Store.open(resolve_store_path(args.store)) as store:
        remotes = store.remotes()
    for name, (url, endpoint, region, conditional, _added) in sorted(remotes.items()):
        config = remote_lib.RemoteConfig(name, url, endpoint, region, conditional)
        out.emit("remote", **config.as_dict())
        extra = "".join(f"  {k} {escape(v)}" for k, v in (("endpoint", endpoint),
                                                          ("region", region)) if v)
        out.say(f"{escape(name)}  {escape(url)}{extra}")
    if not remotes:
        out.say("no remotes (rewindfs remote add NAME s3://BUCKET/PREFIX)")
    return 0


def cmd_remote_remove(args, out) -> int:
    with store_lib.Store.open(resolve_store_path(args.store)) as store:
        store.remove_remote(args.name)
    out.emit("remote.removed", name=args.name)
    out.say(f"removed remote {escape(args.name)} (nothing on it was deleted)")
    return 0


def cmd_remote_log(args, out) -> int:
    with store_lib.Store.open(resolve_store_path(args.store)) as store:
        config = _config(store, args.name)
    backend = remote_lib.open_backend(config)
    ids = [args.workspace_id] if args.workspace_id else remote_lib.workspace_ids(backend)
    for ws_id in ids:
        state = remote_lib.read_workspace(backend, ws_id)
        if not state.segments:
            raise UnknownRemoteWorkspace(remote=args.name, workspace=ws_id)
        _render_remote_ws(out, state)
    if not ids:
        out.say(f"remote {escape(args.name)} holds no workspace yet")
    return 0


def _render_remote_ws(out, state) -> None:
    hist = state.history()
    sessions: dict[str, list[int]] = {}
    for e in hist.epochs:
        if e.kind == "turn" and e.session is not None:
            sessions.setdefault(e.session, []).append(e.turn)
    pushed = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(state.pushed_ns / 1e9))
    out.emit("remote.workspace", id=state.ws_id, root=state.root, pushed_ns=state.pushed_ns,
             epochs=len(hist.epochs), sessions={s: sorted(set(t)) for s, t in sessions.items()},
             store=state.store, has_tree=state.head is not None)
    out.say(f"[bold]workspace {escape(state.ws_id)}[/]  {escape(state.root)}  "
            f"(pushed {pushed}, {len(hist.epochs)} epochs)")
    for s, turns in sorted(sessions.items()):
        out.say(f"  session {escape(s)}: turns {', '.join(map(str, sorted(set(turns))))}")
    for e in hist.epochs:
        out.emit("remote.point", workspace=state.ws_id, **e.as_point())
        what = f"turn {e.turn} of {e.session}" if e.kind == "turn" else e.kind
        if e.kind in ("rewind", "redo") and e.target is not None:
            what += f" → e{e.target}"
        line = f"  e{e.id}  {escape(what)}  "
        # the label gives way, as in `rewindfs log` (--json keeps it whole)
        out.say(line + truncate(escape(e.label or ""), out.console.width - cell_len(line)))


# -- remote learn --------------------------------------------------------------------------

def cmd_remote_learn(args, out) -> int:
    store_path = resolve_store_path(args.store)
    start = os.path.realpath(os.fsencode(args.workspace or "."))
    params = {"remote": args.name, "workspace": args.workspace_id, "session": args.session}
    live = find_socket(start, store_path)      # (socket, workspace root) or None
    if live is not None:
        sock, root = live
        res = client.call(sock, "remote.learn", params)
    else:
        root, res = _learn_offline(store_path, start, params)
    out.emit("learn.done", dir=os.fsdecode(root), **res)
    _warn_problems(out, res["problems"])
    out.say(f"learned {res['epochs']} epochs of workspace {escape(res['remote_workspace'])} "
            f"from {escape(res['remote'])} into {escape(os.fsdecode(root))} (no file "
            f"changed): the pushed tree is e{res['head_epoch']}, this directory as it is "
            f"is e{res['epoch']}; `rewindfs log` lists the points")
    return 1 if res["problems"] else 0


def _learn_offline(store_path, start: bytes, params: dict) -> tuple[bytes, dict]:
    from rewindfs.overlay.rewind import learn as tree_learn
    if not os.path.isdir(start):
        raise NotAWorkspace(path=os.fsdecode(start), store=str(store_path))
    with store_lib.Store.open(store_path) as store:
        found = store.workspace_containing(start)
        root = start if found is None else found[1]
        if find_rewindfs_mount(root):
            raise StaleMount(path=os.fsdecode(root))
        config = _config(store, params["remote"])
        learned = tree_learn.learn_offline(store, remote_lib.open_backend(config), config, root,
                                           workspace=params["workspace"],
                                           session=params["session"])
    return root, learned.to_dict()


# -- push ----------------------------------------------------------------------------------

def cmd_push(args, out) -> int:
    with store_lib.Store.open(resolve_store_path(args.store), create=False) as store:
        name = _default_remote(store, args.remote)
        config = _config(store, name)
        backend = remote_lib.open_backend(config)
        code = 0
        for ws, root in _workspaces_to_push(store, args):
            report = _push_one(store, backend, config, ws, root, out)
            code = max(code, 1 if report["unreadable"] else 0)
    return code


def _workspaces_to_push(store, args) -> list[tuple[int, bytes]]:
    """``--session S``: every workspace where S ran turns (a point needs its whole
    workspace history, so histories go whole); else the workspace of -C/cwd."""
    if args.session:
        found = [(ws, root) for ws, root in store.workspaces()
                 if args.session in store.sessions(ws)]
        if not found:
            raise UsageError(f"session {args.session} ran no turn in any workspace")
        return found
    start = os.path.realpath(os.fsencode(args.workspace or os.getcwd()))
    found = store.workspace_containing(start)
    if found is None:
        raise NotAWorkspace(path=os.fsdecode(start), store=str(store.path))
    return [found]


def _push_one(store, backend, config, ws: int, root: bytes, out):
    """A workspace mounted with ``--auto`` on this remote is pushed by its daemon
    (``push`` on the socket): one push at a time per remote runs there, and this
    process's own push would meet the daemon's lease.  Anything else is pushed here, with
    this process's credentials (a daemon has those of the shell that mounted it)."""
    tree_remote = _tree()
    done = _push_by_daemon(store, config.name, root, out)
    if done is not None:
        return _say_pushed(out, done)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with _Progress(out, f"push {os.fsdecode(root)}", "push") as bar:
            report = tree_remote.push_tree(store, ws, fd, backend, config,
                                           progress=bar.pushed)
    except KeyboardInterrupt:
        # the workspace was bound to its remote id before anything was sent, and
        # objects already uploaded are not sent again: the next push resumes
        raise Interrupted(f"push of {os.fsdecode(root)} to {config.name} interrupted: "
                          "what was uploaded stays on the remote; `rewindfs push` again "
                          "sends the rest") from None
    finally:
        os.close(fd)
    return _say_pushed(out, tree_remote.done_record(config.name, root, report))


def _push_by_daemon(store, name: str, root: bytes, out) -> dict | None:
    """The daemon's ``push.done`` record, or None when no daemon serves ``root`` with
    ``--auto`` on remote ``name``."""
    sock = control_socket_path(store.path, root)
    try:
        if client.call(sock, "status", {}).get("push", {}).get("auto") != name:
            return None
    except (ConnectionRefusedError, FileNotFoundError):
        return None
    with _Progress(out, f"push {os.fsdecode(root)}", "push") as bar:
        def event(ev: dict) -> None:
            if ev.get("type") == "push.progress":
                bar._show(ev["objects"], ev["bytes"], ev["blobs_done"], ev["blobs_total"])
        return client.call(sock, "push", {"remote": name, "wait": True}, on_event=event)


def _say_pushed(out, done: dict) -> dict:
    out.emit("push.done", **done)
    out.say(f"pushed {done['root']} to {done['remote']} as workspace {done['workspace']}: "
            f"{done['objects']} objects, {human_bytes(done['bytes'])}, {done['epochs']} epoch "
            f"records, {done['entries']} pre-images"
            + ("" if done["objects"] else " (nothing new)"))
    for key in done["unreadable"]:
        out.warn(f"blob {key} is damaged in the local store and was not pushed "
                 "(`rewindfs fsck` names the paths)")
    return done


class _Progress:
    """Objects and bytes as they go: a bar on a terminal (rich), ``--json``: one
    ``<kind>.progress`` record per object (objects are packs and large blobs: few)."""

    def __init__(self, out, title: str, kind: str):
        self.out, self.title, self.kind = out, title, kind
        self._bar = self._task = None
        self.objects = self.bytes = 0

    def __enter__(self):
        if not self.out.json and self.out.console.is_terminal:
            from rich.progress import Progress
            self._bar = Progress(console=self.out.console, transient=True)
            self._bar.start()
            self._task = self._bar.add_task(self.title, total=None)
        return self

    def pushed(self, report, done: int, total: int) -> None:
        self._show(report.objects, report.bytes, done, total)

    def fetched(self, done: int, total: int, nbytes: int) -> None:
        self._show(self.objects + 1, self.bytes + nbytes, done, total)

    def _show(self, objects: int, nbytes: int, done: int, total: int) -> None:
        self.objects, self.bytes = objects, nbytes
        if self._bar is not None:
            self._bar.update(self._task, total=total or None, completed=done,
                             description=f"{self.title}: {objects} objects, "
                                         f"{human_bytes(nbytes)}")
        self.out.emit(f"{self.kind}.progress", objects=objects, bytes=nbytes,
                      blobs_done=done, blobs_total=total)

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.stop()


# -- restore -------------------------------------------------------------------------------

def cmd_restore(args, out) -> int:
    tree_remote = _tree()
    with Landing("restore", dry_run=False) as guard:
        try:
            with store_lib.Store.open(resolve_store_path(args.store)) as store:
                config = _config(store, args.source)
                backend = remote_lib.open_backend(config)
                with _Progress(out, f"restore {args.dir}", "restore") as bar:
                    res = tree_remote.restore(
                        store, backend, config, args.workspace_id, args.point, args.dir,
                        session=args.session, progress=bar.fetched, landing=guard.landing)
        except KeyboardInterrupt:
            raise Interrupted(f"interrupted: the restore stopped before its first change: "
                              f"nothing was restored into {args.dir}; the same command "
                              f"starts it again") from None
    out.emit("restore.done", remote=config.name, workspace=args.workspace_id,
             dir=os.path.realpath(args.dir), target=res.target, head_epoch=res.head_epoch,
             objects=bar.objects, bytes=bar.bytes,
             **{k: v for k, v in res.result.to_dict().items() if k not in ("target",)},
             problems=res.problems)
    for f in res.result.failed:
        out.warn(f"{os.fsdecode(f.path)}: {f.message} ({f.code})")
    _warn_problems(out, res.problems)
    out.say(f"restored {escape(args.dir)} to e{res.target} from {escape(config.name)} "
            f"(workspace {escape(args.workspace_id)}: {bar.objects} objects, "
            f"{human_bytes(bar.bytes)}); the pushed tree is e{res.head_epoch}"
            + (" — partial, see the warnings" if res.exit_code else ""))
    if guard.pressed:
        raise Interrupted(f"interrupted: the restore was finished first (it cannot stop "
                          f"half-way); {args.dir} is the tree at e{res.target}")
    return res.exit_code


def _warn_problems(out, problems) -> None:
    """A blob the remote could not give, with the paths and points that need it."""
    for p in problems:
        out.warn(f"blob {p['blob'][:16]}… ({p['object']}): {p['reason'].rstrip('.')}; needed by "
                 f"{', '.join(p['paths'][:5])} at {', '.join(p['epochs'][:5])}")


def fsck_remote(args, out) -> int:
    """``fsck --remote NAME``: every object read and verified (``store.remote._check``);
    exit 1 when a problem was found."""
    with store_lib.Store.open(resolve_store_path(args.store), create=False) as store:
        config = _config(store, args.remote_check)
    report = remote_lib.check_remote(remote_lib.open_backend(config))
    for p in report.problems:
        out.emit("fsck.problem", **p)
        out.say(f"[red]{p['code']}[/]: {escape(p['message'])} (workspace "
                f"{escape(p['workspace'])}, {p['blobs']} blob(s))")
    for name in report.orphans:
        out.emit("fsck.orphan", object=name)
    out.emit("fsck", remote=config.name, **{k: v for k, v in report.as_dict().items()
                                           if k not in ("problems", "orphans")},
             problems=len(report.problems), orphans=len(report.orphans))
    out.say(f"remote {escape(config.name)}: {report.objects_checked} objects, "
            f"{report.blobs_checked} blobs checked; "
            + ("sound" if report.ok else f"{len(report.problems)} problem(s)")
            + (f"; {len(report.orphans)} object(s) no segment names (an interrupted "
               "push leaves them)" if report.orphans else ""))
    return 0 if report.ok else 1


def gc_remote_cmd(args, out) -> int:
    """``gc --remote NAME [--grace DUR] [--dry-run]`` (``store.remote._gc``): refused,
    exit 2, while a push holds a lease or a segment cannot be read."""
    grace = remote_lib.DEFAULT_GRACE_S if args.grace is None else parse_duration(args.grace)
    with store_lib.Store.open(resolve_store_path(args.store), create=False) as store:
        config = _config(store, args.remote_gc)
        store_id = store.store_id()

    def deleting(name, size):
        out.emit("gc.delete", object=name, bytes=size, dry_run=args.dry_run)
        if args.dry_run:        # a real run says how many; thousands of lines help nobody
            out.say(f"would delete {escape(name)} ({human_bytes(size)})")

    report = remote_lib.gc_remote(remote_lib.open_backend(config), config, store_id, grace_s=grace,
                       dry_run=args.dry_run, on_delete=deleting)
    for name, size, age in report.kept:
        out.emit("gc.kept", object=name, bytes=size, age_s=round(age, 3))
    summary = report.as_dict()
    out.emit("gc.remote", remote=config.name, **summary)
    gone = len(report.deleted)
    gone_bytes = human_bytes(sum(size for _name, size in report.deleted))
    out.say(f"remote {escape(config.name)}: {report.segments} segment(s) name "
            f"{report.reachable} object(s); {'would delete' if args.dry_run else 'deleted'} "
            f"{gone} object(s) no segment names ({gone_bytes})"
            + (f"; kept {len(report.kept)} younger than {escape(args.grace or '24h')} "
               f"({human_bytes(summary['bytes_kept'])}): a push may be about to name them"
               if report.kept else ""))
    return 0


HANDLERS = {"remote-add": cmd_remote_add, "remote-list": cmd_remote_list,
            "remote-remove": cmd_remote_remove, "remote-log": cmd_remote_log,
            "remote-learn": cmd_remote_learn, "push": cmd_push, "restore": cmd_restore}


# -- parsers -----------------------------------------------------------------------------

def register(sub) -> None:
    p = sub.add_parser("remote", help="S3-compatible remotes: add, list, remove, log")
    rs = p.add_subparsers(dest="remote_command", metavar="ACTION", parser_class=type(p))
    a = rs.add_parser("add", help="add a remote: NAME s3://BUCKET/PREFIX")
    a.add_argument("name", metavar="NAME", help="what push/restore/log call it")
    a.add_argument("url", metavar="URL", help="s3://BUCKET or s3://BUCKET/PREFIX")
    a.add_argument("--endpoint", metavar="URL", help="the S3 endpoint (MinIO, Ceph RGW, R2, …)")
    a.add_argument("--region", metavar="R", help="the bucket's region")
    options.common(a)
    a.set_defaults(command="remote-add")
    a = rs.add_parser("list", help="the remotes of this store")
    options.common(a)
    a.set_defaults(command="remote-list")
    a = rs.add_parser("remove", help="forget a remote (deletes nothing on it)")
    a.add_argument("name", metavar="NAME", help="the remote")
    options.common(a)
    a.set_defaults(command="remote-remove")
    a = rs.add_parser("log", help="workspaces, sessions and points on a remote "
                      "(downloads no file content)")
    a.add_argument("name", metavar="NAME", help="the remote")
    a.add_argument("--workspace", dest="workspace_id", metavar="ID", help="only this one")
    options.common(a)
    a.set_defaults(command="remote-log")
    a = rs.add_parser("learn", help="teach this workspace (files, no history here yet) a "
                      "pushed history, changing no file; then rewind to its points")
    a.add_argument("name", metavar="NAME", help="the remote")
    which = a.add_mutually_exclusive_group()
    which.add_argument("--workspace", dest="workspace_id", metavar="ID",
                       help="the remote workspace (rewindfs remote log NAME)")
    which.add_argument("--session", metavar="S", help="the remote workspace where session "
                       "S ran turns (default: the remote's only workspace)")
    options.workspace(a)
    a.set_defaults(command="remote-learn")
    p.set_defaults(command="remote-list")

    p = sub.add_parser("push", help="upload the history a remote lacks (resumable)")
    p.add_argument("remote", nargs="?", metavar="NAME", help="the remote (default: the only one)")
    p.add_argument("--session", metavar="S", help="every workspace where session S ran turns")
    options.workspace(p)
    p.set_defaults(command="push")

    p = sub.add_parser("restore", help="make DIR the tree at a pushed point, with its history")
    p.add_argument("dir", metavar="DIR", help="a new or empty directory")
    p.add_argument("--from", dest="source", required=True, metavar="NAME", help="the remote")
    p.add_argument("--workspace", dest="workspace_id", required=True, metavar="ID",
                   help="the workspace id (rewindfs remote log NAME)")
    p.add_argument("--point", required=True, metavar="POINT", help="tN/N (a turn) or eN")
    p.add_argument("--session", metavar="S", help="the session whose turn numbers POINT uses")
    options.common(p)
    p.set_defaults(command="restore")
