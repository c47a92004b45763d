"""One error root for the whole project.

Each class carries what the edges need: ``code`` (kebab-case, matched by scripts and
sent on the control socket), ``exit_code`` (the CLI's contract: 1 partial, 2 could not
run, 3 usage), ``errno`` (what a FUSE handler answers) and ``traceback`` (whether a
traceback would help the user).  Errors become errnos only at the FUSE boundary and
exit codes only in the CLI's ``main()``.  The docstring's first line is the message
template, formatted with the keyword arguments given at raise time.
"""

from __future__ import annotations

import errno as _errno

EXIT_DONE = 0
EXIT_PARTIAL = 1
EXIT_COULD_NOT_RUN = 2
EXIT_USAGE = 3


class RewindfsError(Exception):
    """{message}

    The root: a refusal or failure rewindfs expected and explains (see docs/errors.md).
    """

    code = "error"
    exit_code = EXIT_COULD_NOT_RUN
    errno = _errno.EIO
    traceback = False

    def __init__(self, message: str | None = None, **details):
        self.details = details
        if message is None:
            template = (self.__doc__ or "{message}").strip().splitlines()[0]
            try:
                message = template.format(**{k: _text(v) for k, v in details.items()})
            except (KeyError, IndexError):
                message = template
        self.message = message
        super().__init__(message)

    # detail names sent to clients as the error object's ``data`` (what a client needs
    # to act on the refusal, e.g. the sessions an ambiguous point could mean)
    wire_details: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        """The protocol's error object: ``code``, ``message`` and, when the class names
        ``wire_details``, ``data`` with those details."""
        out = {"code": self.code, "message": self.message}
        data = {k: self.details[k] for k in self.wire_details if k in self.details}
        if data:
            out["data"] = data
        return out


def _text(value):
    """A detail as a message shows it: a path (bytes, or a str carrying undecodable
    bytes as surrogates) as text, non-UTF-8 bytes as ``\\xNN`` — never ``b'…'``.
    ``details`` itself keeps the raw value for code."""
    if isinstance(value, str):
        if not any("\udc80" <= c <= "\udcff" for c in value):
            return value
        value = value.encode("utf-8", "surrogateescape")
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "backslashreplace")
    return value


class StoreError(RewindfsError):
    """The store failed: {message}"""

    code = "store-error"
    traceback = True


# The errnos of a full disk (or quota): what ``StoreFull`` stands for wherever the
# store meets one (a transaction, a blob's temp file, a remote transfer's download).
FULL_ERRNOS = frozenset({_errno.ENOSPC, _errno.EDQUOT})


class StoreFull(StoreError):
    """The store has no room left ({message}); free space or run `rewindfs gc`."""

    code = "store-full"
    errno = _errno.ENOSPC
    traceback = False


class StoreReadOnly(StoreError):
    """The store at {path} is read-only ({reason}): it can be read (log, show, diff, status, fsck, gc --dry-run), but this command writes to it."""

    code = "store-read-only"
    errno = _errno.EROFS
    traceback = False


class StoreForeign(StoreError):
    """The store at {path} belongs to uid {owner}: using it, even to read, needs write access to its lock file {lock} (LMDB's readers register there), which uid {uid} has not; run as its owner, or read a copy of it."""

    code = "store-foreign"
    errno = _errno.EACCES
    traceback = False


class BlobMissing(StoreError):
    """Blob {key} is missing from the store."""

    code = "blob-missing"
    traceback = False


class BlobCorrupt(StoreError):
    """Blob {key} is corrupt: {reason}."""

    code = "blob-corrupt"
    traceback = False


class IndexCorrupt(StoreError):
    """The store's {record} is damaged ({reason}); `rewindfs fsck` lists every damaged record."""

    code = "index-corrupt"
    traceback = False


class SchemaTooNew(StoreError):
    """The store at {path} was written by a newer rewindfs (schema {found}, this one reads {supported}); upgrade rewindfs."""

    code = "schema-too-new"
    traceback = False


class StoreInsideWorkspace(RewindfsError):
    """The store {store} lies inside the workspace {workspace}; put it elsewhere (--store or $REWINDFS_HOME)."""

    code = "store-inside-workspace"


class BadPath(RewindfsError):
    """Bad path {path}: {reason}."""

    code = "bad-path"
    exit_code = EXIT_USAGE
    errno = _errno.EINVAL


class PathTooLong(BadPath):
    """Path {path} is longer than {limit} bytes: rewindfs records paths up to the kernel's PATH_MAX."""

    code = "path-too-long"
    errno = _errno.ENAMETOOLONG     # what mkdir(1) or a compiler then says: "File name too long"


class PathEscape(BadPath):
    """Path {path} escapes the workspace: {reason}."""

    code = "path-escape"
    errno = _errno.EACCES


class BadPoint(RewindfsError):
    """{point} is a relative point; name an absolute turn number or an epoch id (see `rewindfs log`)."""

    code = "relative-point"
    exit_code = EXIT_USAGE


class UnknownPoint(RewindfsError):
    """No point {point} in this workspace (see `rewindfs log`)."""

    code = "unknown-point"


class TurnOpen(RewindfsError):
    """Turn {turn} of session {session} is still open; end it first or pass --force."""

    code = "turn-open"


class NothingToRedo(RewindfsError):
    """Nothing to redo: no rewind{scope} is left to undo."""

    code = "nothing-to-redo"


class InternalError(RewindfsError):
    """{message}

    An exception rewindfs did not expect (a bug, or an environment it does not handle).

    Only the safety nets make it: the daemon's dispatch (that one request fails, the
    daemon keeps serving) and the CLI's ``main()`` (exit 2 with one line naming the
    exception; ``-v`` adds the traceback).
    """

    code = "internal"
    traceback = True


class RemoteError(RewindfsError):
    """Remote {remote}: {message}

    The root of the errors of a remote (``store.remote``, docs/remote.md)."""

    code = "remote-error"


class BadRemoteUrl(RemoteError):
    """Bad remote URL {url!r}: {reason}."""

    code = "bad-remote-url"
    exit_code = EXIT_USAGE


class BadRemoteName(RemoteError):
    """Bad remote name {remote!r}: {reason}."""

    code = "bad-remote-name"
    exit_code = EXIT_USAGE


class UnknownRemote(RemoteError):
    """No remote named {remote!r} (see `rewindfs remote list`)."""

    code = "unknown-remote"
    exit_code = EXIT_USAGE


class RemoteExists(RemoteError):
    """A remote named {remote!r} exists already (remove it first)."""

    code = "remote-exists"
    exit_code = EXIT_USAGE


class RemoteUnreachable(RemoteError):
    """Remote {remote} could not be reached or refused the request: {reason}; run the command again to resume."""

    code = "remote-unreachable"


class RemoteNoCredentials(RemoteError):
    """Remote {remote}: no AWS credentials were found. rewindfs takes them from the AWS chain, never from its own config: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or ~/.aws/credentials (docs/remote.md)."""

    code = "remote-no-credentials"


class RemoteObjectMissing(RemoteError):
    """Object {key} is missing on the remote."""

    code = "remote-object-missing"


class RemoteObjectCorrupt(RemoteError):
    """Object {key} on the remote is corrupt: {reason}."""

    code = "remote-object-corrupt"


class UnknownRemoteWorkspace(RemoteError):
    """Remote {remote} has no workspace {workspace} (see `rewindfs remote log {remote}`)."""

    code = "unknown-remote-workspace"
    exit_code = EXIT_USAGE


class LeaseHeld(RemoteError):
    """Workspace {workspace} on remote {remote} is being pushed by {holder} (lease until {until}); try again later."""

    code = "lease-held"


class LeaseLapsed(RemoteError):
    """The lock {scope} on remote {remote} was not renewed in time (a suspended machine or a cut network), so {what} was not written; run the command again."""

    code = "lease-lapsed"


class RemoteGcRunning(RemoteError):
    """Remote {remote} is being garbage-collected by {holder} (lock until {until}); push again once it is done."""

    code = "remote-gc-running"


class RemoteGcUnsafe(RemoteError):
    """Remote {remote} was not garbage-collected, nothing was deleted: {reason}."""

    code = "remote-gc-unsafe"


class RemoteDiverged(RemoteError):
    """Workspace {workspace} on remote {remote} has history this store does not have ({reason}); it was pushed from elsewhere since, restore it into a new directory instead."""

    code = "remote-diverged"


class RestoreTargetInUse(RemoteError):
    """Cannot restore into {path}: {reason}."""

    code = "restore-target-in-use"
    exit_code = EXIT_USAGE


# Errors of single store modules, here so that every store error is defined once the
# store's errors are imported (``all_error_classes``, the CLI's exit codes for a reply).

class EpochClosed(StoreError):
    """Epoch {epoch} is closed; capture again into the current epoch."""

    code = "epoch-closed"
    traceback = False


class BadSession(RewindfsError):
    """Bad session or turn (session {session!r}): {reason}."""

    code = "bad-session"
    exit_code = EXIT_USAGE


class SessionConflict(StoreError):
    """Session {child!r} already exists with another parent or boundary."""

    code = "session-conflict"
    traceback = False


class AmbiguousPoint(UnknownPoint):
    """{point} is a turn of which session? {sessions}; pass --session, or write e{number} for epoch {number}."""

    code = "ambiguous-point"
    exit_code = EXIT_USAGE
    wire_details = ("choices",)


class BadPolicy(RewindfsError):
    """Bad gc policy {name}: {reason}."""

    code = "bad-policy"
    exit_code = EXIT_USAGE


class RedoStale(RewindfsError):
    """{message}

    Redo refused: the tree changed after the rewind it would undo (turns, edits between
    turns, another owner's rewind), and the redo would discard those changes.  The
    message names them and how many paths would be overwritten; ``rewind eN`` goes to
    the same state explicitly, ``--force`` redoes anyway (every state stays a point).
    """

    code = "redo-stale"
    wire_details = ("rewind", "changes", "paths")

    @classmethod
    def of(cls, rewind, stale, paths: int) -> "RedoStale":
        """The refusal of redoing ``rewind`` past ``stale`` (``paths`` overwritten)."""
        what = ", ".join(describe_epoch(e) for e in stale)
        return cls(
            f"redo would discard what changed after rewind e{rewind.id}: {what} "
            f"({paths} path{'s' if paths != 1 else ''} would be overwritten); "
            f"`rewindfs rewind e{rewind.id}` goes there explicitly (every state stays a "
            "point), or pass --force to redo anyway",
            rewind=rewind.id, changes=[e.as_point() for e in stale], paths=paths)


def describe_epoch(e) -> str:
    """An epoch as a refusal names it: ``turn 3 of s2 (e11)``, ``edits between turns
    (e12)``, ``rewind e13``."""
    if e.kind == "turn":
        return f"turn {e.turn} of {e.session} (e{e.id})"
    if e.kind == "idle":
        return f"edits between turns (e{e.id})"
    return f"{e.kind} e{e.id}"



class BlobCollision(StoreError):
    """Two different contents share the blob key {key} (xxh3-128 collision); nothing was stored."""

    code = "blob-collision"


def all_error_classes() -> list[type[RewindfsError]]:
    """Every error class defined anywhere in the project (for the exit-code table)."""
    seen: list[type[RewindfsError]] = []
    todo = [RewindfsError]
    while todo:
        cls = todo.pop()
        seen.append(cls)
        todo.extend(cls.__subclasses__())
    return seen


class LearnTargetHasHistory(RemoteError):
    """Cannot learn a remote history into {path}: {reason}; learning fills only a workspace this store has no history for (restore into a new directory instead)."""

    code = "learn-target-has-history"
    exit_code = EXIT_USAGE


class UnknownRemoteSession(RemoteError):
    """Remote {remote} has no workspace where session {session} ran turns (see `rewindfs remote log {remote}`)."""

    code = "unknown-remote-session"
    exit_code = EXIT_USAGE


class AmbiguousRemoteWorkspace(RemoteError):
    """Which workspace of remote {remote}? {what} is in several: {listed}; name one with --workspace ID."""

    code = "ambiguous-remote-workspace"
    exit_code = EXIT_USAGE
    wire_details = ("choices",)
